"""The warm start of a tuning run's cost model: measurements of the op's other workloads, from the
database (this GPU) and from the recordings shipped with tritune (this GPU generation); never the
workload being tuned (tuning it must search, not look up). An op with none of its own learns from
the ops its family names (`Family.prior_from`: a gated pair from plain GEMMs)."""
from __future__ import annotations

import importlib
import json
from dataclasses import replace
from functools import lru_cache
from typing import Any

from tritune.cost_model.dataset import Prior
from tritune.kernels.family import expr_from_dict, family
from tritune.records.database import Database
from tritune.tuner.recordings import BUNDLED, Recording
from tritune.tuner.task import Task

PRIORS = ("all", "db", "none")


def prior_for(db: Database, task: Task, which: str = "all") -> Prior | None:
    """The cost-model prior for a task: the database's trials of the op's other workloads on this
    GPU ("db"), plus the measurements shipped with tritune for this GPU generation ("all")."""
    if which not in PRIORS:
        raise ValueError(f"prior must be one of {PRIORS}, got {which!r}")
    if which == "none":
        return None
    own = _op_prior(db, task, task.expr.op, which)
    return own if own is not None else lifted_prior(db, task, which)


def lifted_prior(db: Database, task: Task, which: str = "all") -> Prior | None:
    """The prior of the ops the task's family learns from (`Family.prior_from`), their rows lifted
    into the task's features (None if it names none, or they have none)."""
    parts = [_op_prior(db, task, op, which) for op in task.family.prior_from]
    return Prior.merge(*(Prior(task.family.lift_prior(task.expr, p.X), p.y, p.groups, p.compile_s)
                         for p in parts if p is not None))


def _op_prior(db: Database, task: Task, op: str, which: str) -> Prior | None:
    """An op's database trials ("db"), plus its shipped recordings ("all"), as `task` sees them."""
    return Prior.merge(database_prior(db, task, op), bundled_prior(task, op) if which == "all" else None)


def database_prior(db: Database, task: Task, op: str | None = None, min_trials: int = 8) -> Prior | None:
    """Trials of the op's other workloads on this device (of `op`, else the task's: stored under
    that op's template, part of the device key), one group per workload (None if none)."""
    op = op or task.expr.op
    device = task.device if op == task.expr.op else replace(task.device, template=family(op).template_hash())
    parts = []
    for key, _, _, spec in db.workloads(op):
        results = db.trials(key, device) if key != task.expr.key else []
        if len(results) >= min_trials:
            parts.append(Prior.of(expr_from_dict(json.loads(spec)), task.limits, results))
    return Prior.merge(*parts)


def preload() -> None:
    """Build the shipped priors and import the cost model's library now (about two seconds), e.g.
    while the GPU worker starts, rather than when the first round is waiting for them."""
    _bundled_sets()
    importlib.import_module("xgboost")


@lru_cache(maxsize=None)
def _bundled_sets() -> tuple[tuple[Any, str, Prior], ...]:
    """(workload, compute capability, prior) of each shipped recording, built once: every tuning
    run and benchmark seed asks for them."""
    out = []
    for path in sorted(BUNDLED.glob("*.jsonl.gz")):
        rec = Recording.load(path)
        out.append((rec.expr, rec.device["capability"], Prior.of(rec.expr, rec.limits, rec.results())))
    return tuple(out)


def bundled_prior(task: Task, op: str | None = None) -> Prior | None:
    """The shipped recordings of the op (`op`, else the task's) on GPUs of the task's compute
    capability, one group per workload, never the task's own. None where nothing matches (another
    op, or another GPU generation)."""
    return Prior.merge(*(prior for expr, capability, prior in _bundled_sets()
                         if expr.op == (op or task.expr.op) and capability == task.device.capability
                         and expr.key != task.expr.key))
