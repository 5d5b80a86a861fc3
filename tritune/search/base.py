"""Strategy: the propose/update interface every search strategy implements."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tritune.cost_model.dataset import Prior
from tritune.records.result import MeasureResult
from tritune.schedules.config import Config
from tritune.schedules.space import Space


# Feature rows of configs of the task being tuned (its family's `features`).
Featurize = Callable[[Sequence[Config]], np.ndarray]


class Strategy:
    """Proposes configs to measure and learns from their results. Never measures anything itself.

    Subclasses implement `_propose(n)`; the base keeps the set of configs already proposed or
    measured, so no strategy proposes a config twice (resumed runs pass stored results to update).
    """

    seeded = True  # False: the same proposals whatever the seed (one run says all)
    guided = False  # True: the space's own guesses (`Space.seeds`) are measured first

    def __init__(self, space: Space, seed: int = 0, features: Featurize | None = None,
                 prior: Prior | None = None) -> None:
        # features and prior serve model-based strategies; the others ignore them
        self.space, self.features, self.prior = space, features, prior
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.seen: set[Config] = set()
        self.results: list[MeasureResult] = []

    @property
    def round_size(self) -> int | None:
        """How many configs this strategy wants measured between updates (None: no preference)."""
        return None

    def warm(self) -> None:
        """Do the one-time work of the first proposal now (e.g. learn a prior), which may run in a
        thread of its own while the caller prepares the rest; proposals are the same either way."""

    def propose(self, n: int) -> list[Config]:
        """Up to n new valid configs; fewer (or none) only when the space is exhausted. A guided
        strategy takes the space's unmeasured seeds first."""
        seeds = [c for c in self.space.seeds if c not in self.seen][:n] if self.guided else []
        self.seen.update(seeds)
        rest = n - len(seeds)
        configs = [c for c in self._propose(rest) if c not in self.seen][:rest] if rest else []
        self.seen.update(configs)
        return seeds + configs

    def update(self, results: Sequence[MeasureResult]) -> None:
        """Learn from measured (or failed) configs."""
        self.results.extend(results)
        self.seen.update(r.config for r in results)

    def _propose(self, n: int) -> list[Config]:
        raise NotImplementedError
