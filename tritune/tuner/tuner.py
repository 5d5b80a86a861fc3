"""Tuner: owns the loop propose -> build -> measure -> store -> update, its budget and stopping."""
from __future__ import annotations

from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Callable, Sequence

from tritune.records.database import Database, DatabaseError
from tritune.records.owners import owner_id
from tritune.records.result import MeasureResult
from tritune.schedules.config import Config
from tritune.search.base import Strategy
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import Builder
from tritune.tuner.measurer import Measurer
from tritune.tuner.task import Task, best_of
from tritune.tuner.worker.protocol import Runner

# Compiled candidates to keep waiting for each measuring lane (a GPU, or one of a cluster host's
# slots): one to measure next as soon as a measurement ends, and one for a compile that ends late.
QUEUED_PER_LANE = 2

# A proposal is made without the results of the candidates in flight: the model lags that many
# behind, and the lag must stay a small share of the budget. On the 16x4096x4096 recording, warm
# sa found 98% of the best in 10 of 10 seeds at 128 trials with up to 26 in flight, and in 4 of
# 10 at 64 trials (10 of 10 with a round's lag, 8 to 16 in flight). Each GPU measuring the
# workload may keep that share in flight: GPUs that wait for compiles cost more than the lag.
LAG_SHARE = 8


def in_flight_target(workers: int, lanes: int, round_size: int, learned: int, trials: int, gpus: int = 1) -> int:
    """How many candidates to keep in flight: enough for each of the loop's `workers` compile
    processes (the whole pool, or the loop's part of it where several loops share it:
    `PoolShares`) to have one and every measuring lane (each device measuring this workload)
    QUEUED_PER_LANE compiled and waiting, but no more than the results learned so far (the first
    proposals rest on the prior alone) nor than 1/LAG_SHARE of the budget for each of the `gpus`
    measuring it; never less than a round (one is measured while the next is proposed)."""
    busy = workers + QUEUED_PER_LANE * lanes
    return max(round_size, min(busy, learned, gpus * trials // LAG_SHARE))


class Tuner:
    """Runs a strategy against a builder and runner, storing every trial in the database as soon as
    it is measured (a kill loses only the one in flight). Tuners sharing a database take each
    config before building it (`Database.claim`) and learn from each other's trials.

    Rounds are pipelined: a new round is proposed, from all results so far, whenever the
    candidates in flight (compiling, or compiled and queued for the measurer threads) are no more
    than `in_flight_target`: one compiling in every process of the pool and a few compiled ones
    waiting for each measuring lane, so that neither the pool nor a GPU waits for the loop, as far
    as the search quality allows (the model lags the candidates in flight behind, which the
    recorded-search tests hold to account). Candidates are measured as their compiles finish, so
    a slow compile holds up neither the GPU nor the next proposal.

    Devices and pool: one workload measured on several devices (`run --devices all`) has a lane
    per device, may keep an eighth of the budget in flight for each (two devices starved on
    what one had), and its loop counts the whole pool once; several workloads tuned at once on one
    pool (`tune-model --devices all`) each count their part of it (`Builder.shares`), so that
    together they fill the pool and no more.
    """

    def __init__(self, task: Task, strategy: Strategy, builder: Builder, runner: Runner, db: Database,
                 batch_size: int = 32, early_stop: int | None = None, faults: Sequence[str] = (),
                 on_result: Callable[[MeasureResult], None] | None = None, in_flight: int | None = None) -> None:
        self.task, self.strategy, self.builder, self.runner, self.db = task, strategy, builder, runner, db
        self.batch_size, self.early_stop = batch_size, early_stop
        # in flight before a new round goes out (None: `in_flight_target`; 0: one round at a time)
        self.in_flight = in_flight
        self.most_in_flight = 0  # the most candidates that were in flight at once
        self.faults = list(faults)  # test hook: the first candidates are built broken
        self.on_result = on_result or (lambda r: None)
        self.stored: list[MeasureResult] = []
        self.per_device: Counter[str] = Counter()  # candidates this tuner measured on each GPU ("host:index")
        self.owner = owner_id()
        self.watch = Stopwatch()  # where the loop's time goes
        self.pool_part: Callable[[], int] = lambda: self.builder.workers  # this loop's compile processes
        self.pool_parts: list[int] = []  # the parts of the pool the loop counted, in turn (--verbose says them)

    def run(self, trials: int) -> list[MeasureResult]:
        """Measure until the database holds `trials` for this task (resuming), or search stops;
        meanwhile this loop counts its part of the compile pool (`Builder.shares`)."""
        with self.builder.shares.taken() as part:
            self.pool_part = part
            try:
                return self._run(trials)
            finally:
                self.pool_part = lambda: self.builder.workers

    def _run(self, trials: int) -> list[MeasureResult]:
        expr, device = self.task.expr, self.task.device
        self.db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        self.stored = self.db.trials(expr.key, device)
        self._learn(self.stored)
        history = list(self.stored)
        best = best_of(history)
        measurer = Measurer(expr, device, self.builder, self.runner, self.db.path, best and best.t_median)
        # proposed, not yet measured, in proposal order; the library first, as the bar to beat
        inflight = self._start([c for c in self.task.libraries if c not in {r.config for r in history}], measurer)
        try:
            exhausted = False
            while True:
                exhausted = exhausted or self._fill(inflight, history, trials, measurer)
                if not inflight:
                    break
                result = self._next(inflight)
                if result.measured_on:
                    self.per_device[result.measured_on] += 1
                with self.watch("learn"):
                    self._learn([result])
                history.append(result)
        finally:
            measurer.close()
            self._release()
            for phase, seconds in measurer.watch.spent.items():
                self.watch.add(phase, seconds)
            self.watch.add("fit", getattr(self.strategy, "fit_s", 0.0))
        return history

    def _fill(self, inflight: list[tuple[Config, Future]], history: list[MeasureResult], trials: int,
              measurer: Measurer) -> bool:
        """Keep the pool and the GPUs busy: a new round goes out whenever no more than `_target`
        candidates are in flight (after taking in what other tuners stored meanwhile). True once
        the space has nothing left to propose."""
        while len(inflight) <= self._target(len(history), trials, measurer) and not self._stalled(history):
            history.extend(self._stored_elsewhere(history, {c for c, _ in inflight}, measurer))
            room = trials - len(history) - len(inflight)
            if room <= 0:
                return False
            launched = self._launch(min(self._round(), room), measurer)
            if launched is None:
                return True
            inflight.extend(launched)
            self.most_in_flight = max(self.most_in_flight, len(inflight))
        return False

    def _round(self) -> int:
        return min(self.batch_size, self.strategy.round_size or self.batch_size)

    def _target(self, learned: int, trials: int, measurer: Measurer) -> int:
        """`in_flight_target` for this loop's part of the pool and the measurer's lanes (every device
        measuring this workload) now: a runner lent mid-run adds a lane, a loop that ends gives the
        others its part of the pool."""
        if self.in_flight is not None:
            return self.in_flight
        part = self.pool_part()
        if not self.pool_parts or self.pool_parts[-1] != part:
            self.pool_parts.append(part)
        return in_flight_target(part, measurer.lanes, self._round(), learned, trials, measurer.gpus)

    def _launch(self, n: int, measurer: Measurer) -> list[tuple[Config, Future]] | None:
        """Propose up to n configs and start them (`_start`); None when the strategy has nothing
        left to propose."""
        with self.watch("propose"):
            configs = self.strategy.propose(n)
        if not configs:
            return None
        return self._start(self._inject(configs), measurer)

    def _start(self, configs: list[Config], measurer: Measurer) -> list[tuple[Config, Future]]:
        """Take the configs no other tuner has, start compiling them and queue them for measurement."""
        expr, device = self.task.expr, self.task.device
        with self.watch("store"):
            configs = [c for c in configs if self.db.claim(expr.key, device, c, self.owner)]
        builds = self.builder.submit(expr, self.task.family.canonical_problem(expr), configs) if configs else []
        return [(c, measurer.submit(c, b)) for c, b in zip(configs, builds)]

    def _learn(self, results: Sequence[MeasureResult]) -> None:
        """Tell the strategy about measured schedules (library calls are no point of its space)."""
        schedules = [r for r in results if r.config.library is None]
        if schedules:
            self.strategy.update(schedules)

    def _next(self, inflight: list[tuple[Config, Future]]) -> MeasureResult:
        """The first result in proposal order among those measured, else the next to be measured
        (a candidate still compiling holds up no other); taken out of `inflight` and reported."""
        with self.watch("wait"):
            ready = next((i for i, (_, f) in enumerate(inflight) if f.done()), None)
            if ready is None:
                wait([f for _, f in inflight], return_when=FIRST_COMPLETED)
                ready = next(i for i, (_, f) in enumerate(inflight) if f.done())
            result = inflight.pop(ready)[1].result()
        self.on_result(result)
        return result

    def _release(self) -> None:
        try:
            self.db.release(self.owner)
        except DatabaseError:  # a full disk: claims of a process that is gone are taken over anyway
            pass

    def _stored_elsewhere(self, history: list[MeasureResult], pending: set[Config],
                          measurer: Measurer) -> list[MeasureResult]:
        """Trials that other tuners stored for this task meanwhile (the strategy learns from them
        too); `pending` are this tuner's own in flight, which the measurer may have stored already."""
        expr, device = self.task.expr, self.task.device
        if self.db.count(expr.key, device) <= len(history) + len(pending):
            return []
        known = {r.config for r in history} | pending
        fresh = [r for r in self.db.trials(expr.key, device) if r.config not in known]
        self._learn(fresh)
        for r in fresh:
            if r.ok:
                measurer.offer_best(r.t_median)
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
