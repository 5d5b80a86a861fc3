"""Tuning sessions: start the GPU worker and compile pool, tune workloads in turn, compare each
with the best alternative a user has without tritune, report."""
from __future__ import annotations

import importlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Iterator, Sequence

from rich.progress import Progress

from tritune.kernels.family import device_key
from tritune.records.database import Database
from tritune.schedules.space import Limits
from tritune.search import make_strategy
from tritune.settings import SETTINGS
from tritune.tuner import breakdown, display
from tritune.tuner.builder import Builder
from tritune.tuner.measure import Timing
from tritune.tuner.prior import preload, prior_for
from tritune.records.result import Status
from tritune.tuner.runner import Runner, Runners, WorkerDied
from tritune.tuner.spread import spread
from tritune.tuner.tuner import Task, Tuner, best_of


@dataclass(frozen=True)
class TuneOptions:
    """The knobs of a tuning run, as given on the command line."""

    trials: int = 128
    strategy: str = "sa"
    seed: int = 0
    batch_size: int = 32
    early_stop: int | None = None
    timeout_s: float = 30.0
    workers: int | None = None
    faults: tuple[str, ...] = ()
    prior: str = "all"  # what warm-starts the cost model: "all" (database + shipped), "db", "none"
    verbose: bool = False  # also print where the run's time went
    devices: tuple[int, ...] | str | None = None  # GPUs to measure on: indices, "all", or None (the first)
    cluster: str | None = None  # a Dask scheduler's address: measure on its GPU hosts (`tune-cli worker`)
    cluster_wait_s: float = 30.0  # how long to wait for a first GPU host to join the cluster


def device_limits(info: dict) -> Limits:
    """What the GPU the runner reported allows a program (the known table fills what it did not say)."""
    major, minor = (int(x) for x in info["capability"].split("."))
    known = Limits.for_capability(major, minor)
    return Limits(info["shared_bytes"] or known.shared_bytes, info["sms"] or known.sms)


def device_target(info: dict) -> Any:
    """Triton's compile target for the GPU the runner reported."""
    from triton.backends.compiler import GPUTarget

    major, minor = (int(x) for x in info["capability"].split("."))
    return GPUTarget("cuda", major * 10 + minor, 32)


def device_task(expr: Any, info: dict) -> Task:
    """The task for an expression on the GPU the runner reported."""
    return Task(expr, device_key(info, expr.op), device_limits(info))


def parse_devices(text: str | None) -> tuple[int, ...] | str | None:
    """`--devices`: "0,1" (indices), "all", or None (the first GPU); ValueError names a bad one."""
    if text is None or text.strip() == "all":
        return None if text is None else "all"
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"bad --devices {text!r}: GPU indices such as 0,1, or all") from None
    if not indices or min(indices) < 0 or len(set(indices)) != len(indices):
        raise ValueError(f"bad --devices {text!r}: distinct GPU indices such as 0,1, or all")
    return indices


def start_gpu(timing: Timing = Timing(), timeout_s: float = 30.0, seed: int = 0, workers: int | None = None,
              meanwhile: Callable[[], None] | None = None,
              devices: tuple[int, ...] | str | None = None) -> tuple[Runner | Runners, Builder]:
    """Start the GPU workers (one per device of `devices`, see `parse_devices`) and the compile pool
    together; while the first worker comes up (seconds of imports and CUDA start), load what the
    run will need and run `meanwhile` (e.g. capturing a model); then give the pool the device's
    target. The pool is one per host, shared by every device."""
    fake = importlib.import_module(SETTINGS.fake_gpu) if SETTINGS.fake_gpu else None
    make = partial(Runner, timing, timeout_s=timeout_s, seed=seed, **({"handlers": fake.handlers} if fake else {}))
    runner = first = make(device=0 if devices == "all" else devices[0] if devices else None)
    builder = None
    try:
        first.start()
        builder = Builder(workers=workers)
        if fake:
            builder.build = fake.build
        preload()
        if meanwhile is not None:
            meanwhile()
        info = first.device_info()
        builder.start(device_target(info), device_limits(info).shared_bytes)
        indices = range(info.get("device_count", 1)) if devices == "all" else devices or ()
        if len(indices) > 1:
            runner = Runners([first] + [make(device=i, watch=first.watch) for i in indices[1:]])
            _same_gpus(runner)
    except BaseException:
        if builder is not None:
            builder.close(now=True)
        runner.close(now=True)
        raise
    return runner, builder


def _same_gpus(runners: Runners) -> None:
    """Start every device's worker; timings are compared across devices, so they must be one GPU model."""
    for r in runners.each:
        r.start()
    infos = [r.device_info() for r in runners.each]
    keys = {(i["gpu"], i["capability"]) for i in infos}
    if len(keys) > 1:
        listed = ", ".join(f"{i.get('device')}: {i['gpu']}" for i in infos)
        raise WorkerDied(Status.CRASH, f"the devices are different GPUs ({listed}); tune each kind in a run of its own")


@contextmanager
def gpu_session(options: TuneOptions, meanwhile: Callable[[], None] | None = None) -> Iterator[tuple[Runner, Builder]]:
    """One GPU worker and compile pool, for tuning one workload or several in turn (`meanwhile`
    runs while they start); both are stopped at the end, at once if the run was interrupted or failed.
    With `options.cluster`, the GPUs are the cluster's hosts (`tritune.tuner.cluster`)."""
    if options.cluster:
        from tritune.tuner.cluster import connect

        runner, builder = connect(options.cluster, options.cluster_wait_s, meanwhile)
    else:
        runner, builder = start_gpu(timeout_s=options.timeout_s, seed=options.seed, workers=options.workers,
                                    meanwhile=meanwhile, devices=options.devices)
    interrupted = True
    try:
        yield runner, builder
        interrupted = False
    finally:
        builder.close(now=interrupted)
        runner.close(now=interrupted)


def tune_all(exprs: Sequence[Any], db: Database, options: TuneOptions, trials: Sequence[int] | None = None,
             announce: Callable[[int, Any, int], None] | None = None,
             gpu: tuple[Runner, Builder] | None = None) -> list[dict]:
    """Tune several workloads on one session's GPUs and compile pool (`gpu`, a started
    `gpu_session`, else one started here: starting them costs seconds per workload otherwise),
    each with its `trials` (default: the options'); their summaries, in order. Workloads come
    largest first: each GPU (each host of a cluster) tunes one at a time, and once none waits, the
    free ones join the last (`spread`). `announce(i, expr, trials)` runs as each starts."""
    if not exprs:
        return []
    if gpu is None:
        with gpu_session(options) as started:
            return tune_all(exprs, db, options, trials, announce, started)
    budgets = list(trials) if trials is not None else [options.trials] * len(exprs)
    runner, builder = gpu
    tasks = [device_task(expr, runner.device_info()) for expr in exprs]
    spaces = [None] + _enumerate_ahead(tasks[1:], builder)

    def one(i: int, group: Runners) -> dict:
        if announce is not None:
            announce(i, tasks[i].expr, budgets[i])
        if spaces[i] is not None:
            _take_valid(tasks[i], spaces[i])
        with Database(db.path, checked=True) as own:  # SQLite: a connection per thread
            return tune(tasks[i].expr, own, replace(options, trials=budgets[i]), (group, builder), tasks[i], bar)

    with display.progress() as bar:
        return spread(one, budgets, getattr(runner, "each", [runner]))


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
         task: Task | None = None, bar: Progress | None = None) -> dict:
    """Tune `expr`, print progress and the final table, and return the summary numbers; `gpu` is a
    started `gpu_session` to reuse (else one is started for this workload alone), `task` the
    expression's task on that GPU where already made, `bar` a progress display to add a line to
    (workloads tuned at once share one)."""
    if gpu is None:
        with gpu_session(options) as started:
            return tune(expr, db, options, started, task, bar)
    start = time.time()
    runner, builder = gpu
    before = [w.snapshot() for w in _watches(runner, builder)]
    task = task or device_task(expr, runner.device_info())
    nothing = {"workload": expr.to_dict(), "trials": 0, "best_config": None, "space_valid": 0}
    if not len(task.space.valid_indices):
        display.console.print(f"[red]{expr.describe()}: no config of the space can run on this GPU[/red]")
        return nothing
    strategy = make_strategy(options.strategy, task.space, seed=options.seed, features=task.featurize,
                             prior=prior_for(db, task, options.prior))
    history, loop = _tune_loop(task, strategy, builder, runner, db, options, bar)
    best = best_of(history)
    display.console.print(display.status_line(history) + f"; worker restarts: {runner.restarts}")
    if best is None:
        display.console.print("[red]no candidate ran correctly[/red]")
        return {**nothing, "trials": len(history), "space_valid": len(task.space.valid_indices)}
    h2h = runner.head_to_head(expr, best.config)
    best, h2h = _judge(db, task, history, best, h2h)
    display.out.print(display.summary_table(expr, best, h2h, task.device.gpu))
    spent = [w.since(b) for w, b in zip(_watches(runner, builder), before)]
    times = breakdown.summary(time.time() - start, loop, *spent, getattr(builder, "workers", 1),
                              len(getattr(runner, "each", [runner])))
    if options.verbose:
        display.out.print(display.time_table(times))
    return {**_summary(expr, task, history, best, h2h, times["wall"]), "time": times}


# A tuned kernel replaces the library only when it beats every alternative by this fraction: the
# head-to-head itself reads one cuBLAS call 6% apart in two turns at 10 us (BENCHMARKS.md), and a
# near-tie is not worth leaving the library for.
MARGIN = 0.03


def _judge(db: Database, task: Task, history: list, best, h2h: dict) -> tuple:
    """Store what replay runs, from the head-to-head (long runs, in turns; the search's short runs
    can misorder near-ties): the tuned kernel where it beat every alternative by MARGIN, else the
    fastest library call (a compiled model then leaves the site to Inductor). Returns that trial,
    and the head-to-head with it as "ours" (the kernel's time kept as `tuned_kernel_ms`)."""
    libraries = {r.config.library: r for r in history if r.ok and r.config.library is not None}
    timed = {name: ms for name, ms in h2h["alternatives"].items() if name in libraries}
    beaten = h2h["ours_ms"] <= (1 - MARGIN) * h2h["best_alternative_ms"]
    if best.config.library is None and not beaten and timed:
        name = min(timed, key=timed.get)
        best, h2h = libraries[name], {**h2h, "tuned_kernel_ms": h2h["ours_ms"], "ours_ms": timed[name]}
    db.save_verdict(task.expr.key, task.device, best.config, h2h)
    return best, h2h


def _watches(runner: Runner, builder: Builder) -> list[breakdown.Stopwatch]:
    """The stopwatches of the runner and builder, which a session's workloads share (a stand-in
    without one counts nothing)."""
    return [getattr(x, "watch", None) or breakdown.Stopwatch() for x in (runner, builder)]


def _tune_loop(task: Task, strategy, builder, runner, db, options: TuneOptions,
               bar: Progress | None = None) -> tuple[list, dict]:
    if bar is None:
        with display.progress() as own:
            return _tune_loop(task, strategy, builder, runner, db, options, own)
    expr = task.expr
    job = bar.add_task(expr.describe(), total=options.trials, best="-", devices="")
    state, rates = {"best": None}, display.DeviceRates()

    def on_result(result) -> None:
        if result.ok and (state["best"] is None or result.t_median < state["best"]):
            state["best"] = result.t_median
        best = display.rate(expr, state["best"]) if state["best"] else "-"
        bar.update(job, advance=1, best=best, devices=rates.add(result.measured_on))

    tuner = Tuner(task, strategy, builder, runner, db, options.batch_size, options.early_stop,
                  options.faults, on_result)
    history = tuner.run(options.trials)
    if len(tuner.per_device) > 1:  # each GPU's share of the measurements
        bar.console.print(f"{expr.describe()}: measured per GPU: " + ", ".join(
            f"{name}: {n}" for name, n in sorted(tuner.per_device.items())))
    if tuner.stored:
        bar.console.print(f"resumed: {len(tuner.stored)} trials were already stored")
        bar.update(job, completed=len(history))
    return history, tuner.watch.snapshot()


def _summary(expr: Any, task: Task, history: list, best, h2h: dict, wall_s: float) -> dict:
    return {
        "workload": expr.to_dict(), "device": task.device.__dict__, "trials": len(history),
        "statuses": {s: sum(r.status.value == s for r in history) for s in {r.status.value for r in history}},
        "best_config": dict(best.config), "best_median_ms": best.t_median,
        "final_ours_ms": h2h["ours_ms"], "alternatives_ms": h2h["alternatives"],
        "best_alternative": h2h["best_alternative"], "best_alternative_ms": h2h["best_alternative_ms"],
        "ours_rate": display.rate(expr, h2h["ours_ms"]),
        "ratio_vs_best_alternative": h2h["best_alternative_ms"] / h2h["ours_ms"], "wall_s": wall_s,
        "space_valid": len(task.space.valid_indices), "space_size": task.space.size,
    }
