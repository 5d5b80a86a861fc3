"""Compile-time model: how much dearer than its peers a config is predicted to be to compile.

A tuning loop is bound by its compile pool (a 4096^3 run on a 16-core GPU host: 180 CPU-s of
compiles for 128 candidates against 7 s of GPU work), and compile times within one space differ
tenfold: on Triton 3.6 a warp-specialised 128x256 tile on 4 warps took 2.7 CPU-s against 0.8 for
8-warp tiles that ran as fast. The search uses this to trade a little predicted speed for cheaper
compiles (`ModelBasedStrategy`'s `compile_weight`).

Times are learnt relative to each workload's typical compile (log2 seconds minus the workload's
median), so that measurements from other hosts and workloads (the prior: the shipped recordings
and the database's trials) transfer: a model of the prior's rows gives the starting point, and a
model of this workload's own compiles corrects it, as the throughput model does (base margin).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tritune.cost_model.dataset import Prior
from tritune.cost_model.xgb import XGBCostModel

# doublings over a workload's typical compile time that cost a config nothing: on the recordings,
# penalising every dearer-than-typical config moved the search off a skinny space's best in 2 of
# 10 seeds for a 7% saving, while the configs worth avoiding compile 3-4x the typical
SLACK = 1.0


def relative_log(seconds: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask of rows that built, their log2 seconds minus their group's median)."""
    built = seconds > 0
    rel = np.zeros(len(seconds))
    for g in np.unique(groups[built]):
        rows = built & (groups == g)
        rel[rows] = np.log2(seconds[rows]) - np.median(np.log2(seconds[rows]))
    return built, rel


class CompileCost:
    """Predicted compile dearness of configs (doublings over the typical compile, 0 if cheaper),
    from the prior's compile times and this workload's own."""

    def __init__(self, seed: int = 0, prior: Prior | None = None, min_train: int = 8) -> None:
        self.seed, self.min_train = seed, min_train
        self.prior = prior if prior is not None and prior.compile_s is not None else None
        self._prior_model: XGBCostModel | None = None
        self._own: XGBCostModel | None = None
        self._fitted_prior = False

    def fit_prior(self) -> None:
        """Learn the prior's compile times once (about a tenth of a second)."""
        if self._fitted_prior or self.prior is None:
            return
        self._fitted_prior = True
        built, rel = relative_log(self.prior.compile_s, self.prior.groups)
        if built.sum() >= self.min_train:
            self._prior_model = self._model().fit(self.prior.X[built], rel[built])

    def fit(self, X: np.ndarray, compile_s: Sequence[float]) -> None:
        """Learn this workload's own compiles (feature rows and seconds; 0 where it did not build)."""
        self.fit_prior()
        seconds = np.asarray(compile_s, dtype=np.float64)
        built, rel = relative_log(seconds, np.zeros(len(seconds), dtype=np.int64))
        if built.sum() < self.min_train:
            return
        self._own = self._model().fit(X[built], rel[built], base_margin=self._start(X[built]))

    def dearer(self, X: np.ndarray) -> np.ndarray | None:
        """Doublings of compile time past twice the typical one, per row (0 for all within it:
        the search's trajectory is left alone but for clearly dear configs), or None while
        nothing is known."""
        self.fit_prior()
        if self._own is None and self._prior_model is None:
            return None
        start = self._start(X)
        pred = self._own.predict(X, base_margin=start) if self._own is not None else start
        return np.maximum(0.0, np.asarray(pred, dtype=np.float64) - SLACK)

    def _start(self, X: np.ndarray) -> np.ndarray | None:
        if self._prior_model is None:
            return None
        return np.asarray(self._prior_model.predict(X), dtype=np.float32)

    def _model(self) -> XGBCostModel:
        return XGBCostModel(objective="reg", n_estimators=40, max_depth=4, seed=self.seed)
