"""Simulated annealing over a schedule space, maximising a score (a cost model's prediction)."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from tritune.schedules.config import Config
from tritune.schedules.space import Space

Score = Callable[[Sequence[Config]], np.ndarray]


class SimulatedAnnealing:
    """Parallel annealing chains that persist across calls; the best unvisited configs kept in a heap."""

    def __init__(self, space: Space, rng: np.random.Generator, n_chains: int = 32, n_steps: int = 40,
                 temperature: tuple[float, float] = (1.0, 0.0), patience: int = 10) -> None:
        self.space, self.rng = space, rng
        self.n_chains, self.n_steps, self.temperature, self.patience = n_chains, n_steps, temperature, patience
        self.chains: list[Config] = []

    def top(self, score: Score, k: int, exclude: set[Config], starts: Iterable[Config] = ()) -> list[tuple[float, Config]]:
        """The k best-scoring configs not in `exclude` met along the chains, best first."""
        chains = self._start(starts)
        current = score(chains)
        scale = float(np.std(current)) or 1.0  # scores are in model units: anneal on a relative scale
        heap: list[tuple[float, int, Config]] = []
        in_heap: set[Config] = set()
        order = itertools.count()
        self._offer(heap, in_heap, order, chains, current, k, exclude)
        calm = 0
        for step in range(self.n_steps):
            t0, t1 = self.temperature
            temp = t0 + (t1 - t0) * step / max(1, self.n_steps - 1)
            moves = [self.space.random_neighbour(c, self.rng) or c for c in chains]
            scores = score(moves)
            changed = self._offer(heap, in_heap, order, moves, scores, k, exclude)
            gain = (scores - current) / scale
            accept = (gain > 0) | (self.rng.random(len(moves)) < np.exp(np.minimum(gain, 0) / max(temp, 1e-6)))
            chains = [m if a else c for m, c, a in zip(moves, chains, accept)]
            current = np.where(accept, scores, current)
            calm = 0 if changed else calm + 1
            if calm >= self.patience:
                break
        self.chains = chains
        return [(s, c) for s, _, c in sorted(heap, key=lambda e: e[:2], reverse=True)]

    def _start(self, starts: Iterable[Config]) -> list[Config]:
        """Persisting chains, re-seeded from `starts` (e.g. the best measured configs), topped up at random."""
        chains = list(dict.fromkeys([*starts, *self.chains]))[: self.n_chains]
        if len(chains) < self.n_chains:
            chains += self.space.sample(self.rng, self.n_chains - len(chains), exclude=chains)
        return chains

    @staticmethod
    def _offer(heap: list, in_heap: set, order: Iterator[int], configs: Sequence[Config], scores: np.ndarray,
               k: int, exclude: set[Config]) -> bool:
        changed = False
        for config, s in zip(configs, scores):
            if config in exclude or config in in_heap:
                continue
            # equal scores (trees predict piecewise constants) rank the config met first higher;
            # a memory address here made runs differ with the interpreter's hash seed
            entry = (float(s), -next(order), config)
            if len(heap) < k:
                heapq.heappush(heap, entry)
            elif entry[0] > heap[0][0]:
                in_heap.discard(heapq.heapreplace(heap, entry)[2])
            else:
                continue
            in_heap.add(config)
            changed = True
        return changed
