"""Model-based search: a cost model learns from measurements, an optimizer proposes what it rates best.

The strategy is a composition (as in AutoTVM): any object with fit(X, y, groups) / predict(X) is a
model, so the loop is testable with a fake model; simulated annealing explores the space with it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tritune.cost_model.features import labels
from tritune.schedules.config import Config
from tritune.search.base import Strategy
from tritune.search.sa import SimulatedAnnealing


class ModelBasedStrategy(Strategy):
    """Measures `plan_size` configs per round; refits the model after each; ε of picks are random."""

    def __init__(self, *args: Any, model: Any = None, plan_size: int = 8, eps: float = 0.1,
                 min_train: int = 8, diversity: float = 0.3, candidates: int = 4, local: float = 0.25,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.features is None:
            raise ValueError("a model-based strategy needs a features function of the task")
        if model is None:
            from tritune.cost_model.xgb import XGBCostModel

            model = XGBCostModel(seed=self.seed)
        self.model, self.plan_size, self.eps = model, plan_size, eps
        self.min_train, self.diversity, self.candidates, self.local = min_train, diversity, candidates, local
        self.optimizer = SimulatedAnnealing(self.space, self.rng)
        self._cache: dict[Config, np.ndarray] = {}
        self._fitted_on = -1

    @property
    def round_size(self) -> int:
        """The model is refit after every plan_size measurements."""
        return self.plan_size

    def _propose(self, n: int) -> list[Config]:
        if not self._fit():
            return self.space.sample(self.rng, n, exclude=self.seen)
        n_random = int(self.rng.binomial(n, self.eps))
        picks = self._local_picks(round(n * self.local))
        ranked = self.optimizer.top(self._score, self.candidates * n, exclude=self.seen | set(picks),
                                    starts=self._best(4))
        picks += diverse_pick(ranked, n - n_random - len(picks), self.diversity)
        return picks + self.space.sample(self.rng, n - len(picks), exclude=self.seen | set(picks))

    def _local_picks(self, n: int) -> list[Config]:
        """The best-rated unmeasured one-step neighbours of the best measured configs (exploitation)."""
        if n <= 0:
            return []
        near = list(dict.fromkeys(c for best in self._best(3) for c in self.space.neighbours(best)
                                  if c not in self.seen))
        if not near:
            return []
        order = np.argsort(-self._score(near))
        return [near[i] for i in order[:n]]

    def _fit(self) -> bool:
        """Refit on everything measured (plus the prior) when there is news; False if too little data."""
        own = self.results
        if len(own) < self.min_train and self.prior is None:
            return False
        if self._fitted_on == len(own):
            return True
        parts = [] if self.prior is None else [(self.prior.X, self.prior.y, self.prior.groups)]
        if own:
            group = (self.prior.groups.max() + 1) if self.prior is not None else 0
            parts.append((self._rows([r.config for r in own]), labels(own), np.full(len(own), group)))
        X, y, groups = (np.concatenate(p) for p in zip(*parts))
        self.model.fit(X, y, groups)
        self._fitted_on = len(own)
        return True

    def _rows(self, configs: Sequence[Config]) -> np.ndarray:
        missing = [c for c in configs if c not in self._cache]
        if missing:
            self._cache.update(zip(missing, self.features(missing)))
        return np.stack([self._cache[c] for c in configs])

    def _score(self, configs: Sequence[Config]) -> np.ndarray:
        return np.asarray(self.model.predict(self._rows(configs)), dtype=np.float64)

    def _best(self, k: int) -> list[Config]:
        ok = sorted((r for r in self.results if r.ok), key=lambda r: r.t_median)
        return [r.config for r in ok[:k]]


def diverse_pick(ranked: list[tuple[float, Config]], n: int, weight: float) -> list[Config]:
    """Greedy picks trading rank against knob values not yet covered by earlier picks."""
    pool = [c for _, c in ranked]
    chosen: list[Config] = []
    covered: set[tuple[str, Any]] = set()
    while pool and len(chosen) < n:
        def gain(i: int) -> float:
            new = sum((k, pool[i][k]) not in covered for k in pool[i])
            return (1 - i / len(ranked)) + weight * new / len(pool[i])
        best = max(range(len(pool)), key=gain)
        config = pool.pop(best)
        chosen.append(config)
        covered.update(config.items())
    return chosen
