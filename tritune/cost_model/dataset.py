"""What the cost model learns from: labels of measured results, a workload's training set, and a
prior (other workloads' rows) for a warm start. Op-agnostic: each family featurizes its configs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tritune.kernels.family import family
from tritune.records.result import MeasureResult
from tritune.schedules.space import Limits


def labels(results: Sequence[MeasureResult]) -> np.ndarray:
    """Relative throughput in [0, 1]: best median / median; failed configs are 0, the worst."""
    times = [r.t_median for r in results if r.ok]
    best = min(times) if times else 1.0
    return np.array([best / r.t_median if r.ok else 0.0 for r in results], dtype=np.float32)


def training_set(expr: Any, limits: Limits, results: Sequence[MeasureResult]) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows (the expression's family's features) and labels of one workload's measured
    schedules (library calls have no schedule features and are left out)."""
    results = [r for r in results if r.config.library is None]
    return family(expr.op).features(expr, limits, [r.config for r in results]), labels(results)


@dataclass(frozen=True)
class Prior:
    """Measurements of other workloads of the same op on the same device, for a warm start."""

    X: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    compile_s: np.ndarray | None = None  # each row's compile seconds (0: it did not build), if known

    @classmethod
    def of(cls, expr: Any, limits: Limits, results: Sequence[MeasureResult]) -> "Prior":
        """One workload's measured results as a prior of one group."""
        scheduled = [r for r in results if r.config.library is None]  # as `training_set` keeps them
        X, y = training_set(expr, limits, scheduled)
        return cls(X, y, np.zeros(len(y), dtype=np.int64), np.array([r.compile_s for r in scheduled], dtype=np.float64))

    @staticmethod
    def merge(*priors: "Prior | None") -> "Prior | None":
        """One prior holding every given one's workloads as separate groups (None if none given)."""
        given = [p for p in priors if p is not None and len(p.y)]
        if not given:
            return None
        offsets = np.cumsum([0] + [int(p.groups.max()) + 1 for p in given[:-1]])
        timed = all(p.compile_s is not None for p in given)
        return Prior(np.concatenate([p.X for p in given]), np.concatenate([p.y for p in given]),
                     np.concatenate([p.groups + o for p, o in zip(given, offsets)]),
                     np.concatenate([p.compile_s for p in given]) if timed else None)
