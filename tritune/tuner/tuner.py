"""Tuner: owns the loop propose -> build -> measure -> store -> update, its budget and stopping."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels.family import Family, family
from tritune.records.database import Database, DatabaseError, owner_id
from tritune.records.result import DeviceKey, MeasureResult
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space
from tritune.search.base import Strategy
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import Builder
from tritune.tuner.runner import Runner


@dataclass(frozen=True)
class Task:
    """What to tune (the expression) on which device."""

    expr: Any
    device: DeviceKey
    limits: Limits
    absent: tuple[str, ...] = ()  # knobs left out of the space (at their defaults)
    only: frozenset[Config] | None = None  # the space limited to these configs (a recorded sample)

    @property
    def family(self) -> Family:
        """The op family of the expression."""
        return family(self.expr.op)

    def featurize(self, configs: Sequence[Config]) -> np.ndarray:
        """Cost-model features of configs of this task."""
        return self.family.features(self.expr, self.limits, configs)

    @cached_property
    def space(self) -> Space:
        """The schedule space of this task."""
        space = self.family.space(self.expr, self.limits)
        space = space.without(self.absent) if self.absent else space
        return space if self.only is None else space.restricted(self.only)


def best_of(results: Sequence[MeasureResult]) -> MeasureResult | None:
    """The fastest correct result (lowest median), or None."""
    ok = [r for r in results if r.ok]
    return min(ok, key=lambda r: r.t_median) if ok else None


class Tuner:
    """Runs a strategy against a builder and runner, storing every trial in the database as soon as
    it is measured (a kill loses only the one in flight). Tuners sharing a database take each
    config before measuring it (`Database.claim`) and learn from each other's trials."""

    def __init__(self, task: Task, strategy: Strategy, builder: Builder, runner: Runner, db: Database,
                 batch_size: int = 32, early_stop: int | None = None, faults: Sequence[str] = (),
                 on_result: Callable[[MeasureResult], None] | None = None) -> None:
        self.task, self.strategy, self.builder, self.runner, self.db = task, strategy, builder, runner, db
        self.batch_size, self.early_stop = batch_size, early_stop
        self.faults = list(faults)  # test hook: the first candidates are built broken
        self.on_result = on_result or (lambda r: None)
        self.stored: list[MeasureResult] = []
        self.owner = owner_id()
        self.watch = Stopwatch()  # where the loop's time goes

    def run(self, trials: int) -> list[MeasureResult]:
        """Measure until the database holds `trials` for this task (resuming), or search stops."""
        expr, device = self.task.expr, self.task.device
        self.db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        self.stored = self.db.trials(expr.key, device)
        self.strategy.update(self.stored)
        history = list(self.stored)
        try:
            while len(history) < trials and not self._stalled(history):
                batch = min(self.batch_size, self.strategy.round_size or self.batch_size)
                with self.watch("propose"):
                    configs = self.strategy.propose(min(batch, trials - len(history)))
                if not configs:
                    break  # the space is exhausted
                results = self._measure(self._inject(configs))
                with self.watch("learn"):
                    self.strategy.update(results)
                history.extend(results)
                history.extend(self._stored_elsewhere(history))
        finally:
            self._release()
            self.watch.add("fit", getattr(self.strategy, "fit_s", 0.0))
        return history

    def _release(self) -> None:
        try:
            self.db.release(self.owner)
        except DatabaseError:  # a full disk: claims of a process that is gone are taken over anyway
            pass

    def _measure(self, configs: list[Config]) -> list[MeasureResult]:
        expr, device = self.task.expr, self.task.device
        futures = self.builder.submit(expr, self.task.family.canonical_problem(expr), configs)
        results = []
        for config, future in zip(configs, futures):  # measured in order while later ones compile
            with self.watch("compile_wait"):
                built = self.builder.result(future, config)
            with self.watch("store"):
                if not self.db.claim(expr.key, device, config, self.owner):
                    continue  # stored already, or another tuner is measuring it
            if built.status is not None:
                result = MeasureResult(config, built.status, compile_s=built.compile_s, message=built.message)
            else:
                with self.watch("measure"):
                    result = self.runner.measure(expr, config, built.compile_s)
            with self.watch("store"):
                self.db.save(expr.key, device, [result])  # at once: a kill loses only the trial in flight
            self.on_result(result)
            results.append(result)
        return results

    def _stored_elsewhere(self, history: list[MeasureResult]) -> list[MeasureResult]:
        """Trials that other tuners stored for this task meanwhile (the strategy learns from them too)."""
        expr, device = self.task.expr, self.task.device
        if self.db.count(expr.key, device) <= len(history):
            return []
        known = {r.config for r in history}
        fresh = [r for r in self.db.trials(expr.key, device) if r.config not in known]
        self.strategy.update(fresh)
        return fresh

    def _inject(self, configs: list[Config]) -> list[Config]:
        injected = [c.replace(fault=f) for c, f in zip(configs, self.faults)]
        self.faults = []
        return injected + configs[len(injected):]

    def _stalled(self, history: list[MeasureResult]) -> bool:
        """Early stopping: no new best within the last `early_stop` trials."""
        if not self.early_stop or len(history) <= self.early_stop:
            return False
        best = best_of(history)
        if best is None:
            return False
        last_improvement = max(i for i, r in enumerate(history) if r is best)
        return len(history) - 1 - last_improvement >= self.early_stop
