"""Where a tuning run's time goes: seconds per phase, added up as the run goes, and the summary
that `tune-cli run --summary-json` and `--verbose` show (proposal, model fit, waiting, compile,
correctness check, timing, idle GPU, idle compile pool, the parts outside the loop, each GPU)."""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class Stopwatch:
    """Seconds spent per phase; `with watch("phase"):` adds the block's wall time. Threads that
    share one (the measuring threads of a group of GPUs) can each tell what they added themselves
    (`by_this_thread`)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._threads = threading.local()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        """Count seconds measured elsewhere (in a worker process, on a cluster's host)."""
        self.spent[phase] += seconds
        mine = getattr(self._threads, "spent", None)
        if mine is None:
            mine = self._threads.spent = defaultdict(float)
        mine[phase] += seconds

    def by_this_thread(self) -> dict[str, float]:
        """The seconds per phase that the calling thread added."""
        return dict(getattr(self._threads, "spent", {}))

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """What was spent after a `snapshot()` (runner and builder serve several workloads in turn)."""
        return {k: v - before.get(k, 0.0) for k, v in self.spent.items()}

    def snapshot(self) -> dict[str, float]:
        """The seconds spent so far, per phase."""
        return dict(self.spent)


def summary(wall_s: float, tuner: dict, runner: dict, builder: dict, workers: int, devices: int = 1) -> dict:
    """The run's time by phase (seconds, rounded to 0.1 s), and how busy the GPUs (together, and each
    that measured) and the compile pool were.

    The loop's own phases (proposal to "outside the loop") add up to the wall time; the outside
    splits into the space and prior before it and the head-to-head after it (the rest: storing the
    verdict, reporting). The measuring threads' (waiting for compiles to storing results, and the
    GPU's check and timing of this workload's candidates, per device too; device-seconds, summed
    over `devices`) are in `tuner` too: they run alongside the loop, as do the pool and the second
    worker's compile of the head-to-head's alternatives (`runner`). The devices' own stopwatch is
    not where a workload's GPU seconds come from: workloads tuned at once share it.
    """
    gpu = tuner.get("check", 0.0) + tuner.get("timing", 0.0)
    loop = sum(tuner.get(k, 0.0) for k in ("propose", "learn", "wait", "store"))
    out = {
        "wall": wall_s,
        "proposal (search over the model)": tuner.get("propose", 0.0) - tuner.get("fit", 0.0),
        "model fit": tuner.get("fit", 0.0),
        "learning from results": tuner.get("learn", 0.0),
        "waiting for measurements": tuner.get("wait", 0.0),
        "claims (database)": tuner.get("store", 0.0),
        "outside the loop (space, prior, head-to-head)": wall_s - loop,
        "space and prior (before the loop)": tuner.get("space and prior", 0.0),
        "head-to-head (after the loop)": tuner.get("head-to-head", 0.0),
        "GPU waiting for compiles": tuner.get("compile_wait", 0.0),
        "correctness check (GPU worker)": tuner.get("check", 0.0),
        "timing (GPU worker)": tuner.get("timing", 0.0),
        "worker start and requests": tuner.get("measure", 0.0) - gpu,
        "storing results (database)": tuner.get("save", 0.0),
        "compile (CPU-seconds in the pool)": builder.get("compile", 0.0),
        "alternatives compiled ahead (second worker)": runner.get("alternatives", 0.0),
        "GPU idle": devices * wall_s - gpu,
    }
    out = {k: round(v, 1) for k, v in out.items()}
    out["GPU busy fraction"] = round(gpu / (devices * wall_s), 3) if wall_s else 0.0
    waited = runner.get("worker_start", 0.0) / devices  # a run started on the driver's facts waits for its worker
    if waited >= 0.5 and wall_s > waited:
        out["GPU busy fraction once its worker was up"] = round(gpu / (devices * (wall_s - waited)), 3)
    out["compile pool busy fraction"] = round(builder.get("compile", 0.0) / (workers * wall_s), 3) if wall_s else 0.0
    return {**out, **_per_device(tuner, wall_s)}


def _per_device(spent: dict, wall_s: float) -> dict:
    """"GPU busy fraction, host:index" for each device that measured (the measuring threads count
    check and timing seconds per device as "check on host:index", "timing on ..."): with one, it
    names the GPU that a workload of a run over several (tune-model --devices all) was measured on."""
    busy: dict[str, float] = defaultdict(float)
    for phase, seconds in spent.items():
        kind, _, device = phase.partition(" on ")
        if device and kind in ("check", "timing"):
            busy[device] += seconds
    if not busy or not wall_s:
        return {}
    return {f"GPU busy fraction, {device}": round(s / wall_s, 3) for device, s in sorted(busy.items())}


def process_age_s() -> float | None:
    """Seconds since this process started (its interpreter's start and imports included), from
    Linux's /proc; None where that cannot be read."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 2)  # field 22: start time in ticks
    except (OSError, ValueError, IndexError):
        return None


def startup(before_s: float | None, session_s: float, worker: dict) -> dict:
    """Where the time before the first round went: this process before it started its GPU session
    (interpreter, imports, argument checks); the session's start (GPU workers and compile pool,
    side by side), with the moments, counted from its beginning, when every process was spawned,
    this process had loaded the priors (and run the session's `meanwhile`), the first GPU worker
    had imported what it runs and started CUDA, and its answer came; and that worker's age when it
    answered. `worker`: what `start_gpu` and the worker reported (seconds); 0.1 s resolution."""
    out = {"this process before the session": before_s, "GPU session start (workers and compile pool)": session_s,
           "session: processes spawned at": worker.get("spawned_s"),
           "session: priors loaded at": worker.get("prepared_s"),
           "session: first GPU worker's imports done at": worker.get("imported_s"),
           "session: first GPU worker's CUDA up at": worker.get("up_s"),
           "session: first GPU worker's answer came at": worker.get("answered_s"),
           "first GPU worker's age then": worker.get("age_s")}
    return {k: round(v, 1) for k, v in out.items() if v is not None}
