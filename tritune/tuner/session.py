"""One `tune-cli run`: start the GPU worker and compile pool, tune, compare with torch, report."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from tritune.kernels.device import device_key
from tritune.records.database import Database
from tritune.schedules.space import Limits
from tritune.search import Prior, make_strategy
from tritune.tuner import display
from tritune.tuner.builder import Builder
from tritune.tuner.measure import Timing
from tritune.tuner.recorded import bundled_prior
from tritune.tuner.runner import Runner
from tritune.tuner.tuner import Task, Tuner, best_of, warm_start


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


def device_task(expr: Any, info: dict) -> Task:
    """The task for an expression on the GPU the runner reported."""
    major, minor = (int(x) for x in info["capability"].split("."))
    known = Limits.for_capability(major, minor)
    limits = Limits(info["shared_bytes"] or known.shared_bytes, info["sms"] or known.sms)
    return Task(expr, device_key(info, expr.op), limits)


def start_gpu(expr: Any, timing: Timing = Timing(), timeout_s: float = 30.0, seed: int = 0,
              workers: int | None = None) -> tuple[Runner, Task, Builder]:
    """Start the GPU worker, read its device, and start a compile pool for that device's target."""
    from triton.backends.compiler import GPUTarget

    runner = Runner(timing, timeout_s=timeout_s, seed=seed)
    info = runner.device_info()
    task = device_task(expr, info)
    major, minor = (int(x) for x in info["capability"].split("."))
    return runner, task, Builder(GPUTarget("cuda", major * 10 + minor, 32), task.limits.shared_bytes, workers)


@contextmanager
def gpu_session(expr: Any, options: TuneOptions) -> Iterator[tuple[Runner, Builder]]:
    """One GPU worker and compile pool, for tuning one workload or several in turn."""
    runner, _, builder = start_gpu(expr, timeout_s=options.timeout_s, seed=options.seed, workers=options.workers)
    with runner:
        try:
            yield runner, builder
        finally:
            builder.close()


PRIORS = ("all", "db", "none")


def prior_for(db: Database, task: Task, which: str = "all") -> Prior | None:
    """The cost-model prior for a task: the database's trials of the op's other workloads on this
    GPU ("db"), plus the measurements shipped with tritune for this GPU generation ("all")."""
    if which not in PRIORS:
        raise ValueError(f"prior must be one of {PRIORS}, got {which!r}")
    if which == "none":
        return None
    return Prior.merge(warm_start(db, task), bundled_prior(task) if which == "all" else None)


def tune_all(exprs: Sequence[Any], db: Database, options: TuneOptions) -> list[dict]:
    """Tune several workloads in turn on one GPU worker and compile pool; their summaries."""
    with gpu_session(exprs[0], options) as gpu:
        return [tune(expr, db, options, gpu) for expr in exprs]


def tune(expr: Any, db: Database, options: TuneOptions, gpu: tuple[Runner, Builder] | None = None) -> dict:
    """Tune `expr`, print progress and the final table, and return the summary numbers; `gpu` is a
    started `gpu_session` to reuse (else one is started for this workload alone)."""
    if gpu is None:
        with gpu_session(expr, options) as started:
            return tune(expr, db, options, started)
    start = time.time()
    runner, builder = gpu
    task = device_task(expr, runner.device_info())
    nothing = {"workload": expr.to_dict(), "trials": 0, "best_config": None, "space_valid": 0}
    if not len(task.space.valid_indices):
        display.console.print(f"[red]{expr.describe()}: no config of the space can run on this GPU[/red]")
        return nothing
    strategy = make_strategy(options.strategy, task.space, seed=options.seed, features=task.featurize,
                             prior=prior_for(db, task, options.prior))
    history = _tune_loop(task, strategy, builder, runner, db, options)
    best = best_of(history)
    display.console.print(display.status_line(history) + f"; worker restarts: {runner.restarts}")
    if best is None:
        display.console.print("[red]no candidate ran correctly[/red]")
        return {**nothing, "trials": len(history), "space_valid": len(task.space.valid_indices)}
    h2h = runner.head_to_head(expr, best.config)
    display.out.print(display.summary_table(expr, best, h2h, task.device.gpu))
    return _summary(expr, task, history, best, h2h, time.time() - start)


def _tune_loop(task: Task, strategy, builder, runner, db, options: TuneOptions) -> list:
    expr = task.expr
    with display.progress() as bar:
        job = bar.add_task(expr.describe(), total=options.trials, best="-")
        state = {"best": None}

        def on_result(result) -> None:
            if result.ok and (state["best"] is None or result.t_median < state["best"]):
                state["best"] = result.t_median
            best = display.rate(expr, state["best"]) if state["best"] else "-"
            bar.update(job, advance=1, best=best)

        tuner = Tuner(task, strategy, builder, runner, db, options.batch_size, options.early_stop,
                      options.faults, on_result)
        history = tuner.run(options.trials)
        if tuner.stored:
            bar.console.print(f"resumed: {len(tuner.stored)} trials were already stored")
            bar.update(job, completed=len(history))
    return history


def _summary(expr: Any, task: Task, history: list, best, h2h: dict, wall_s: float) -> dict:
    return {
        "workload": expr.to_dict(), "device": task.device.__dict__, "trials": len(history),
        "statuses": {s: sum(r.status.value == s for r in history) for s in {r.status.value for r in history}},
        "best_config": dict(best.config), "best_median_ms": best.t_median,
        "final_ours_ms": h2h["ours_ms"], "final_torch_ms": h2h["torch_ms"],
        "ours_rate": display.rate(expr, h2h["ours_ms"]), "torch_rate": display.rate(expr, h2h["torch_ms"]),
        "ratio_vs_torch": h2h["torch_ms"] / h2h["ours_ms"], "wall_s": wall_s,
        "space_valid": len(task.space.valid_indices), "space_size": task.space.size,
    }
