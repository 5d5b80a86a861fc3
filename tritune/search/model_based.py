"""Model-based search: a cost model learns from measurements, an optimizer proposes what it rates best.

The strategy is a composition (as in AutoTVM): any object with fit(X, y, groups, base_margin) /
predict(X, base_margin) is a model, so the loop is testable with a fake model; simulated annealing
explores the space with it. With a prior (other workloads' measurements), a second model learns
the prior once and its scores are the starting point (base margin) that the model of this
workload's own trials corrects (AutoTVM's transfer learning): the first round is the prior's pick,
and own trials outvote it where they disagree.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from tritune.cost_model.compile_cost import CompileCost
from tritune.cost_model.dataset import labels
from tritune.schedules.config import Config
from tritune.search.base import Strategy
from tritune.search.annealing import SimulatedAnnealing

# rank units a round's pick gives up for each doubling of its predicted compile time past twice the
# workload's typical one (`CompileCost`); a round ranks its candidates over one unit
COMPILE_WEIGHT = 1.0


class ModelBasedStrategy(Strategy):
    """Measures `plan_size` configs per round; refits the model after each; ε of picks are random.
    The space's own guesses (`Space.seeds`) go first."""

    guided = True

    def __init__(self, *args: Any, model: Any = None, prior_model: Any = None, plan_size: int = 8,
                 eps: float = 0.1, min_train: int = 8, diversity: float = 0.3, candidates: int = 4,
                 local: float = 0.375, compile_weight: float = COMPILE_WEIGHT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.features is None:
            raise ValueError("a model-based strategy needs a features function of the task")
        from tritune.cost_model.xgb import XGBCostModel

        self.model = XGBCostModel(seed=self.seed) if model is None else model
        self.prior_model = XGBCostModel(seed=self.seed) if prior_model is None else prior_model
        self.plan_size, self.eps = plan_size, eps
        self.min_train, self.diversity, self.candidates, self.local = min_train, diversity, candidates, local
        self.compile_cost = CompileCost(self.seed, self.prior) if compile_weight else None
        self.compile_weight = compile_weight
        self.optimizer = SimulatedAnnealing(self.space, self.rng)
        self._cache: dict[Config, np.ndarray] = {}
        self._margins: dict[Config, float] = {}  # the prior model's score of each config
        self._fitted_on = -1
        self.fit_s = 0.0  # seconds spent fitting models (a tuning run reports it)

    @property
    def round_size(self) -> int:
        """The model is refit after every plan_size measurements."""
        return self.plan_size

    def warm(self) -> None:
        """Fit the prior's model now (seconds of XGBoost, which lets go of the GIL: a tuning run
        fits it while it enumerates the space); not counted in `fit_s`, whose seconds are the
        proposals'."""
        self._fit_prior()
        if self.compile_cost is not None:
            self.compile_cost.fit_prior()

    def _propose(self, n: int) -> list[Config]:
        if not self._fit():
            return self._cover_paths(self.space.sample(self.rng, n, exclude=self.seen), n, ranked=False)
        n_random = int(self.rng.binomial(n, self.eps))
        picks = self._local_picks(round(n * self.local))
        ranked = self.optimizer.top(self._score, self.candidates * n, exclude=self.seen | set(picks),
                                    starts=self._best(4))
        picks += diverse_pick(ranked, n - n_random - len(picks), self.diversity, self._dearer([c for _, c in ranked]))
        picks += self.space.sample(self.rng, n - len(picks), exclude=self.seen | set(picks))
        return self._cover_paths(picks, n)

    def _cover_paths(self, picks: list[Config], n: int, ranked: bool = True) -> list[Config]:
        """Where a path knob (`Knob.path`) has a value no proposal has taken yet, the round's last
        picks give way to a quarter of it (at least one) with that value: the best-rated of a
        sample (`ranked`), else random ones. A prior learnt on workloads without that path rates
        it by features it never saw, and annealing may not cross into it within a small budget."""
        share = max(1, n // 4)
        for knob in (k for k in self.space.knobs if k.path):
            taken = {c[knob.name] for c in (*self.seen, *picks) if knob.name in c}
            for value in (v for v in knob.values if v not in taken):
                pool = self.space.sample_where(self.rng, 16 * share if ranked else share, knob.name, value,
                                               exclude=self.seen | set(picks))
                if ranked and pool:
                    pool = [pool[i] for i in np.argsort(-self._score(pool), kind="stable")[:share]]
                picks = picks[:max(0, n - len(pool))] + pool
        return picks

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

    def _dearer(self, configs: Sequence[Config]) -> np.ndarray | None:
        """What each config's predicted compile time costs it, in rank units (`CompileCost.dearer`
        times `compile_weight`); None until compile times are known."""
        dearer = self.compile_cost.dearer(self._rows(configs)) if self.compile_cost and configs else None
        return None if dearer is None else self.compile_weight * dearer

    def _fit(self) -> bool:
        """Refit on this workload's trials when there is news (the prior model is fitted once,
        first); False while there is too little to rank by."""
        start = time.perf_counter()
        try:
            return self._refit()
        finally:
            self.fit_s += time.perf_counter() - start

    def _fit_prior(self) -> None:
        """Learn the prior once."""
        if self.prior is not None and self._fitted_on < 0:
            self.prior_model.fit(self.prior.X, self.prior.y, self.prior.groups)
            self._fitted_on = 0

    def _refit(self) -> bool:
        own = self.results
        self._fit_prior()
        if len(own) < self.min_train and self.prior is None:
            return False
        if own and self._fitted_on != len(own):
            configs = [r.config for r in own]
            rows = self._rows(configs)
            self.model.fit(rows, labels(own), np.zeros(len(own)), base_margin=self._margin(configs))
            self._fitted_on = len(own)
            if self.compile_cost is not None:
                self.compile_cost.fit(rows, [r.compile_s for r in own])
        return True

    def _rows(self, configs: Sequence[Config]) -> np.ndarray:
        missing = [c for c in configs if c not in self._cache]
        if missing:
            self._cache.update(zip(missing, self.features(missing)))
        return np.stack([self._cache[c] for c in configs])

    def _margin(self, configs: Sequence[Config]) -> np.ndarray | None:
        """The prior model's scores (None without a prior)."""
        if self.prior is None:
            return None
        missing = [c for c in configs if c not in self._margins]
        if missing:
            self._margins.update(zip(missing, map(float, self.prior_model.predict(self._rows(missing)))))
        return np.array([self._margins[c] for c in configs], dtype=np.float32)

    def _score(self, configs: Sequence[Config]) -> np.ndarray:
        if not self.results:  # only the prior so far
            return np.asarray(self._margin(configs), dtype=np.float64)
        return np.asarray(self.model.predict(self._rows(configs), base_margin=self._margin(configs)), dtype=np.float64)

    def _best(self, k: int) -> list[Config]:
        """The k fastest measured configs that this space holds (annealing starts from them and
        explores their neighbours; a stored config of a wider space, resumed, is only learnt from)."""
        ok = sorted((r for r in self.results if r.ok and self.space.in_product(r.config)), key=lambda r: r.t_median)
        return [r.config for r in ok[:k]]


def diverse_pick(ranked: list[tuple[float, Config]], n: int, weight: float,
                 dearer: np.ndarray | None = None) -> list[Config]:
    """Greedy picks trading rank against knob values not yet covered by earlier picks and, given
    `dearer` (per ranked config, in rank units), against the compile time it is predicted to cost."""
    costs = np.zeros(len(ranked)) if dearer is None else dearer
    pool = [(c, float(cost)) for (_, c), cost in zip(ranked, costs)]
    chosen: list[Config] = []
    covered: set[tuple[str, Any]] = set()
    while pool and len(chosen) < n:
        def gain(i: int) -> float:
            config, cost = pool[i]
            new = sum((k, config[k]) not in covered for k in config)
            return (1 - i / len(ranked)) + weight * new / len(config) - cost
        config, _ = pool.pop(max(range(len(pool)), key=gain))
        chosen.append(config)
        covered.update(config.items())
    return chosen
