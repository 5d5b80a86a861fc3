"""A tuning run: tune one workload or several on a started GPU session, compare each best with the
fastest alternative a user has without tritune, and store the verdict that replay follows.

The run prints nothing: it reports through a `Report` (as AutoTVM's `Tuner.tune` takes callbacks),
which the CLI implements for the terminal (`cli.display.Terminal`); the Python API's default says
nothing."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any, Callable, Sequence

from tritune.kernels.family import rate_text
from tritune.records.database import Database
from tritune.records.result import MeasureResult
from tritune.search import Strategy, make_strategy
from tritune.tuner import breakdown
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import Builder
from tritune.tuner.gpus.spread import spread
from tritune.tuner.gpus.start import TuneOptions, gpu_session
from tritune.tuner.prior import prior_for
from tritune.tuner.task import Task, best_of, device_task
from tritune.tuner.tuner import Tuner
from tritune.tuner.worker.protocol import Runner, distinct_gpus


class Report:
    """What a run tells as it goes; each method here says nothing."""

    def running(self) -> AbstractContextManager:
        """Around workloads tuned at once (they share one progress display)."""
        return nullcontext()

    def started(self, expr: Any, trials: int) -> Callable[[MeasureResult], None]:
        """A workload's search starts; the callable is told of each result as it comes."""
        return lambda result: None

    def note(self, text: str, problem: bool = False) -> None:
        """One line about a workload (`problem`: something went wrong)."""

    def searched(self, history: Sequence[MeasureResult], restarts: int) -> None:
        """A workload's search is over: every trial, and how often a GPU worker was replaced."""

    def finished(self, expr: Any, best: MeasureResult, h2h: dict, gpu: str) -> None:
        """A workload's best against every alternative (the head-to-head), and what replay runs."""

    def timed(self, times: dict) -> None:
        """Where a workload's time went (`breakdown.summary`), when asked for (`verbose`)."""


SILENT = Report()


def tune_all(exprs: Sequence[Any], db: Database, options: TuneOptions, trials: Sequence[int] | None = None,
             announce: Callable[[int, Any, int], None] | None = None,
             gpu: tuple[Runner, Builder] | None = None, report: Report = SILENT) -> list[dict]:
    """Tune several workloads on one session's GPUs and compile pool (`gpu`, a started
    `gpu_session`, else one started here: starting them costs seconds per workload otherwise),
    each with its `trials` (default: the options'); their summaries, in order. Workloads come
    largest first: each GPU (each host of a cluster) tunes one at a time, and once none waits, the
    free ones join the last (`spread`). `announce(i, expr, trials)` runs as each starts."""
    if not exprs:
        return []
    if gpu is None:
        with gpu_session(options) as started:
            return tune_all(exprs, db, options, trials, announce, started, report)
    budgets = list(trials) if trials is not None else [options.trials] * len(exprs)
    runner, builder = gpu
    tasks = [device_task(expr, runner.device_info()) for expr in exprs]
    spaces = [None] + _enumerate_ahead(tasks[1:], builder)

    with StrategiesAhead(tasks, spaces, db.path, options) as ahead:
        def one(i: int, group: Runner, release: Callable[[], None]) -> dict:
            if announce is not None:
                announce(i, tasks[i].expr, budgets[i])
            built = ahead.claim(i)
            if built is None and spaces[i] is not None:  # a strategy built ahead took its space already
                _take_valid(tasks[i], spaces[i])
            with Database(db.path, checked=True) as own:  # SQLite: a connection per thread
                return tune(tasks[i].expr, own, replace(options, trials=budgets[i]), (group, builder), tasks[i],
                            report, built=built, judging=lambda: ahead.build_after(i), release=release)

        with report.running():
            return spread(one, budgets, runner.each)


class StrategiesAhead:
    """The next workload's strategy, its prior learned (a second or so of XGBoost per workload),
    built in a thread while an earlier workload's head-to-head runs on the GPU (`build_after`),
    rather than when the workload starts. Built then, the prior holds every trial it would have
    held at the workload's start on one GPU (the earlier workload's search is over); with several
    GPUs, it misses what the others stored in the seconds between. `claim` takes a workload as
    it starts: its strategy's future where one was built (else None: it builds its own)."""

    def __init__(self, tasks: Sequence[Task], spaces: Sequence[Any], db_path: Any, options: TuneOptions) -> None:
        self._tasks, self._spaces, self._db_path, self._options = tasks, spaces, db_path, options
        self._started: set[int] = set()
        self._built: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tritune-strategy-ahead")

    def claim(self, i: int) -> Future | None:
        with self._lock:
            self._started.add(i)
            return self._built.pop(i, None)

    def build_after(self, i: int) -> None:
        """Workload i's search is over: build the next one not started nor built yet."""
        with self._lock:
            taken = self._started | self._built.keys()
            j = next((k for k in range(i + 1, len(self._tasks)) if k not in taken), None)
            if j is not None:
                self._built[j] = self._pool.submit(self._build, j)

    def _build(self, j: int) -> Strategy | None:
        if self._spaces[j] is not None:
            _take_valid(self._tasks[j], self._spaces[j])
        with Database(self._db_path, checked=True) as db:
            return _strategy(self._tasks[j], db, self._options)

    def __enter__(self) -> "StrategiesAhead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def valid_indices(task: Task) -> Any:
    """The valid configs of a task's space (run in a pool process)."""
    return task.space.valid_indices


def _enumerate_ahead(tasks: Sequence[Task], builder: Builder) -> list[Any]:
    """Start enumerating the spaces of later workloads in the compile pool (seconds each for
    mid-size matmuls) while the first ones tune; a future per task."""
    return [builder.background(valid_indices, task) for task in tasks]


def _take_valid(task: Task, future: Any) -> None:
    """Give a task the space enumerated in the pool (else it enumerates its own when first asked)."""
    try:
        task.space.__dict__["valid_indices"] = future.result()  # fills the cached property
    except Exception:  # noqa: BLE001 - a pool that died: the task enumerates in this process
        pass


def tune(expr: Any, db: Database, options: TuneOptions, gpu: tuple[Runner, Builder] | None = None,
         task: Task | None = None, report: Report = SILENT, built: Future | None = None,
         judging: Callable[[], None] = lambda: None, release: Callable[[], None] = lambda: None) -> dict:
    """Tune `expr`, judge its best against the alternatives, and return the summary numbers; `gpu`
    is a started `gpu_session` to reuse (else one is started for this workload alone), `task` the
    expression's task on that GPU where already made, `built` its strategy being built ahead
    (`StrategiesAhead`); `judging` runs as the head-to-head starts, `release` once it is queued
    (`spread` then starts the next workload on the runners: the head-to-head runs in their second
    worker, beside the next search's first compiles)."""
    if gpu is None:
        with gpu_session(options) as started:
            return tune(expr, db, options, started, task, report)
    start, watch = time.time(), Stopwatch()
    runner, builder = gpu
    before = [w.snapshot() for w in (runner.watch, builder.watch)]
    runner.prepare_head_to_head(expr)  # the GPU's second worker compiles the alternatives meanwhile
    task = task or device_task(expr, runner.device_info())
    with watch("space and prior"):
        strategy = built.result() if built is not None else _strategy(task, db, options)
    if strategy is None:
        report.note(f"{expr.describe()}: no config of the space can run on this GPU", problem=True)
        return {"workload": expr.to_dict(), "trials": 0, "best_config": None, "space_valid": 0}
    with report.running():
        history, loop = _search(task, strategy, builder, runner, db, options, report)
    best = best_of(history)
    report.searched(history, runner.restarts)
    if best is None:
        report.note("no candidate ran correctly", problem=True)
        return {"workload": expr.to_dict(), "trials": len(history), "best_config": None,
                "space_valid": len(task.space.valid_indices)}
    judging()
    with watch("head-to-head"):
        queued = runner.queue_head_to_head(expr, best.config)
        release()
        h2h = queued.result()
    best, h2h = _judge(db, task, history, best, h2h)
    report.finished(expr, best, h2h, task.device.gpu)
    spent = [w.since(b) for w, b in zip((runner.watch, builder.watch), before)]
    times = breakdown.summary(time.time() - start, {**loop, **watch.spent}, *spent, builder.workers,
                               max(1, distinct_gpus(runner.each)))
    if options.verbose:
        report.timed(times)
    return {**_summary(expr, task, history, best, h2h, times["wall"]), "time": times}


def _strategy(task: Task, db: Database, options: TuneOptions) -> Strategy | None:
    """The task's search strategy, its prior learned in a thread (XGBoost lets go of the GIL) while
    this one enumerates the space: seconds each for a mid-size matmul, paid side by side. None
    where no config of the space is valid."""
    strategy = make_strategy(options.strategy, task.space, seed=options.seed, features=task.featurize,
                             prior=prior_for(db, task, options.prior))
    with ThreadPoolExecutor(1, thread_name_prefix="tritune-prior") as pool:
        warming = pool.submit(strategy.warm)
        valid = len(task.space.valid_indices)
        warming.result()
    return strategy if valid else None


# A tuned kernel replaces the library only when it beats every alternative by this fraction: the
# head-to-head itself reads one cuBLAS call 6% apart in two turns at 10 us (BENCHMARKS.md), and a
# near-tie is not worth leaving the library for.
KERNEL_MARGIN = 0.03


def _judge(db: Database, task: Task, history: list, best: MeasureResult, h2h: dict) -> tuple:
    """Store what replay runs, from the head-to-head (long runs, in turns; the search's short runs
    can misorder near-ties): the tuned kernel where it beat every alternative by KERNEL_MARGIN, else
    the fastest library call (a compiled model then leaves the site to Inductor) where that call
    is within the margin of the kernel or `torch.compile`'s lowering is faster than the kernel. A
    kernel that only ties `torch.compile` stays: the library call may be far slower (an unfused
    epilogue), and call-time replay runs what is stored. Returns that trial, and the head-to-head
    with it as "ours" (the kernel's time kept as `tuned_kernel_ms`)."""
    libraries = {r.config.library: r for r in history if r.ok and r.config.library is not None}
    timed = {name: ms for name, ms in h2h["alternatives"].items() if name in libraries}
    ours = h2h["ours_ms"]
    beaten = ours <= (1 - KERNEL_MARGIN) * h2h["best_alternative_ms"]
    if best.config.library is None and not beaten and timed:
        name = min(timed, key=timed.get)
        library_close = ours > (1 - KERNEL_MARGIN) * timed[name]
        if library_close or h2h["alternatives"].get("torch.compile", float("inf")) < ours:
            best, h2h = libraries[name], {**h2h, "tuned_kernel_ms": ours, "ours_ms": timed[name]}
    db.save_verdict(task.expr.key, task.device, best.config, h2h)
    return best, h2h


def _search(task: Task, strategy: Any, builder: Builder, runner: Runner, db: Database, options: TuneOptions,
            report: Report) -> tuple[list, dict]:
    """The tuning loop for one task: its history, and where the loop's time went."""
    tuner = Tuner(task, strategy, builder, runner, db, options.batch_size, options.early_stop,
                  options.faults, report.started(task.expr, options.trials))
    history = tuner.run(options.trials)
    if len(tuner.per_device) > 1:  # each GPU's share of the measurements
        report.note(f"{task.expr.describe()}: measured per GPU: " + ", ".join(
            f"{name}: {n}" for name, n in sorted(tuner.per_device.items())))
    if options.verbose and any(part < builder.workers for part in tuner.pool_parts):  # workloads tuned at once
        report.note(f"{task.expr.describe()}: its part of the {builder.workers}-process compile pool: "
                    + ", then ".join(str(part) for part in tuner.pool_parts))
    if tuner.stored:
        report.note(f"resumed: {len(tuner.stored)} trials were already stored")
    return history, tuner.watch.snapshot()


def _summary(expr: Any, task: Task, history: list, best: MeasureResult, h2h: dict, wall_s: float) -> dict:
    return {
        "workload": expr.to_dict(), "device": task.device.__dict__, "trials": len(history),
        "statuses": {s: sum(r.status.value == s for r in history) for s in {r.status.value for r in history}},
        "best_config": dict(best.config), "best_median_ms": best.t_median,
        "final_ours_ms": h2h["ours_ms"], "alternatives_ms": h2h["alternatives"],
        "best_alternative": h2h["best_alternative"], "best_alternative_ms": h2h["best_alternative_ms"],
        "ours_rate": rate_text(expr, h2h["ours_ms"]),
        "bytes": h2h.get("bytes"), "copy_gbps": h2h.get("copy_gbps"), "timed_as": h2h.get("timed_as"),
        "ratio_vs_best_alternative": h2h["best_alternative_ms"] / h2h["ours_ms"], "wall_s": wall_s,
        "space_valid": len(task.space.valid_indices), "space_size": task.space.size,
    }
