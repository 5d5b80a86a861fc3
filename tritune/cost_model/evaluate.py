"""How well the cost model ranks configs: cross-validation, learning curve, cross-shape transfer."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from sklearn.model_selection import KFold

from tritune.cost_model.metrics import all_metrics, spearman
from tritune.cost_model.xgb import XGBCostModel
from tritune.cost_model.dataset import training_set
from tritune.kernels.family import expr_from_dict
from tritune.records.database import Database
from tritune.records.result import DeviceKey
from tritune.schedules.space import Limits

ModelFactory = Callable[[], XGBCostModel]


@dataclass(frozen=True)
class Dataset:
    """The stored trials of one workload on one device, as model inputs, in measurement order."""

    expr: Any
    device: DeviceKey
    X: np.ndarray
    y: np.ndarray
    ok: np.ndarray
    times: np.ndarray  # median ms, inf for failures

    @property
    def name(self) -> str:
        return self.expr.describe()


def load_datasets(db: Database, op: str | None = None, min_trials: int = 32) -> list[Dataset]:
    """Every (workload, device) with at least `min_trials` trials."""
    out = []
    for row in db.best_rows(op):  # one row per (workload, device) with a correct trial
        if row.n_trials < min_trials:
            continue
        # schedules only: library calls are measured beside the space, and have no features
        results = [r for r in db.trials(row.workload_key, row.device) if r.config.library is None]
        expr = expr_from_dict(json.loads(row.workload_spec))
        major, minor = (int(x) for x in row.device.capability.split("."))
        X, y = training_set(expr, Limits.for_capability(major, minor), results)
        times = np.array([r.t_median if r.ok else np.inf for r in results])
        out.append(Dataset(expr, row.device, X, y, np.array([r.ok for r in results]), times))
    return out


def _mean(dicts: Sequence[dict]) -> dict:
    """Mean of each metric over runs, ignoring runs where it is undefined (nan if it always is)."""
    out = {}
    for k in dicts[0]:
        values = np.array([d[k] for d in dicts], dtype=float)
        out[k] = float(values[~np.isnan(values)].mean()) if (~np.isnan(values)).any() else float("nan")
    return out


def cross_validate(ds: Dataset, make_model: ModelFactory, folds: int = 5, seed: int = 0) -> tuple[dict, np.ndarray]:
    """Mean metrics over k folds, and out-of-fold scores (standardised per fold, for plotting)."""
    scores, per_fold = np.zeros(len(ds.y)), []
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(ds.X):
        pred = make_model().fit(ds.X[train], ds.y[train]).predict(ds.X[test])
        per_fold.append(all_metrics(pred, ds.y[test], ds.ok[test]))
        scores[test] = (pred - pred.mean()) / (pred.std() or 1.0)
    return _mean(per_fold), scores


def learning_curve(ds: Dataset, make_model: ModelFactory, sizes: Sequence[int], repeats: int = 3,
                   seed: int = 0) -> dict[int, dict]:
    """Metrics on the rest of the trials after training on n random ones, for each n that fits."""
    rng = np.random.default_rng(seed)
    curve = {}
    for n in (s for s in sizes if s <= len(ds.y) - 16):
        runs = []
        for _ in range(repeats):
            order = rng.permutation(len(ds.y))
            model = make_model().fit(ds.X[order[:n]], ds.y[order[:n]])
            runs.append(all_metrics(model.predict(ds.X[order[n:]]), ds.y[order[n:]], ds.ok[order[n:]]))
        curve[n] = _mean(runs)
    return curve


def transfer(sets: Sequence[Dataset], make_model: ModelFactory) -> dict:
    """Spearman of a model trained on one workload and tested on another of the same op (matrix;
    NaN across ops, whose features differ), and of one trained on all the others of the same op
    and device and tested on the held-out one."""
    def score(a: Dataset, b: Dataset) -> float:
        if a.expr.op != b.expr.op:
            return float("nan")
        return spearman(make_model().fit(a.X, a.y).predict(b.X[b.ok]), b.y[b.ok])

    matrix = [[score(a, b) for b in sets] for a in sets]
    held_out = {}
    for target in sets:
        others = [s for s in sets if s is not target and s.device == target.device and s.expr.op == target.expr.op]
        if others:
            X = np.concatenate([s.X for s in others])
            y = np.concatenate([s.y for s in others])
            groups = np.concatenate([np.full(len(s.y), j) for j, s in enumerate(others)])
            pred = make_model().fit(X, y, groups).predict(target.X)
            held_out[target.name] = all_metrics(pred, target.y, target.ok)
    return {"names": [s.name for s in sets], "matrix": matrix, "held_out": held_out}


def convergence(ds: Dataset) -> np.ndarray:
    """Best-so-far relative throughput of the stored tuning run, trial by trial."""
    return ds.times.min() / np.minimum.accumulate(ds.times)
