"""GPU-side measurement of one candidate: fresh inputs, poisoned output, check, then time.

Runs inside the runner's worker process only; it is the one module of tritune that touches CUDA.
torch is imported where it is used: the tuning process reads `Timing` from here without paying for it.
"""
from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from tritune.kernels.family import family
from tritune.records.result import Status
from tritune.schedules.config import Config

QUANTILES = (0.0, 0.2, 0.5, 0.8)


@dataclass(frozen=True)
class Timing:
    """How long to time: warm-up and repetition budgets in milliseconds of kernel time; for
    candidates also how many runs decide that one is a loser, and the bounds on the runs timed."""

    warmup_ms: float = 10.0
    rep_ms: float = 20.0
    first_runs: int = 5
    min_runs: int = 20
    max_runs: int = 300


# Comparisons that are reported (the end-of-run head-to-head, benchmarks) time longer than candidates.
COMPARE = Timing(warmup_ms=25.0, rep_ms=100.0)

# A candidate whose fastest of its first runs is this much slower than the best median so far is not
# timed further: the spread of a config's runs stays far below this on the recorded spaces (see
# tests/test_timing.py), so it cannot be the best.
LOSER = 1.25


def clearly_slower(fastest_ms: float, best_ms: float | None) -> bool:
    """True when a candidate's fastest run so far already loses to the best median by LOSER."""
    return best_ms is not None and fastest_ms > LOSER * best_ms


def runs_for(estimate_ms: float, timing: Timing) -> int:
    """How many runs fill the repetition budget for a kernel of this runtime (within the bounds)."""
    return int(min(timing.max_runs, max(timing.min_runs, timing.rep_ms / max(estimate_ms, 1e-6))))


def seed_for(seed: int, label: str) -> int:
    """A reproducible 63-bit seed for one candidate's inputs."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{label}".encode()).digest()[:8], "little") >> 1


def rel_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref||, infinite when any output is NaN/inf (e.g. never written)."""
    import torch

    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def time_fn(fn: Callable[[], Any], timing: Timing) -> tuple[float, ...]:
    """(min, p20, median, p80) in ms: warmed up, L2 flushed before each run, CUDA events."""
    from triton.testing import do_bench

    return tuple(float(t) for t in do_bench(fn, warmup=timing.warmup_ms, rep=timing.rep_ms,
                                            quantiles=list(QUANTILES)))


def measure_candidate(expr: Any, config: Config, seed: int, timing: Timing, best_ms: float | None = None) -> dict:
    """Build (a cache hit after the builder), check against float64, then time one candidate;
    one that is clearly slower than `best_ms` after a few runs is not timed further."""
    import torch

    start = time.perf_counter()
    fam = family(expr.op)
    x, ref = _workload(expr, seed)
    match_precision(expr)
    kernel = fam.kernel(expr, config, fam.problem_of(expr, x.args))
    out = kernel(*x.args)  # a library call may return a fresh tensor; a kernel writes the output
    torch.cuda.synchronize()
    err, tol = rel_error(x.out if out is None else out, ref), fam.tolerance(expr)
    checked = time.perf_counter()
    if not err <= tol:
        return {"status": Status.WRONG_ANSWER, "message": f"relative error {err:.3g} > {tol:.1g}",
                "spent": {"check": checked - start}}
    times, runs, stopped = time_candidate(lambda: kernel(*x.args), timing, best_ms)
    note = f"; stopped after {runs} runs, > {LOSER}x the best" if stopped else f"; {runs} runs"
    return {"status": Status.OK, "times": times, "message": f"relative error {err:.2g}{note}",
            "spent": {"check": checked - start, "timing": time.perf_counter() - checked}}


# The workload being tuned: its operands (as generated, to restore before each candidate) and its
# float64 reference, computed once and reused by every candidate of the workload.
_current: dict = {}


def _workload(expr: Any, seed: int) -> tuple[Any, Any]:
    """The workload's operands, restored to their generated values with the output poisoned, and
    its float64 reference (a candidate that wrote outside its output cannot fail the next one)."""
    if _current.get("key") != (expr.key, seed):
        _current.clear()  # frees the previous workload's tensors first
        fam = family(expr.op)
        x = fam.inputs(expr, seed_for(seed, expr.key), "cuda")
        _current.update(key=(expr.key, seed), x=x, ref=fam.reference(expr, x.args),
                        pristine=[a.clone() if hasattr(a, "clone") else a for a in x.args])
    x = _current["x"]
    for arg, kept in zip(x.args, _current["pristine"]):
        if hasattr(arg, "copy_"):
            arg.copy_(kept)
    return x, _current["ref"]


def time_candidate(fn: Callable[[], Any], timing: Timing, best_ms: float | None = None) -> tuple[tuple[float, ...], int, bool]:
    """(min, p20, median, p80) ms of a candidate, how many runs were timed, and whether timing
    stopped early because the candidate is clearly slower than `best_ms`. L2 is flushed before
    each timed run (as triton's do_bench does), after a warm-up of `timing.warmup_ms`."""
    warm_up(fn, timing)
    first = timed_runs(fn, timing.first_runs)
    if clearly_slower(min(first), best_ms):
        return quantiles(first), len(first), True
    rest = timed_runs(fn, max(0, runs_for(statistics.median(first), timing) - len(first)))
    return quantiles(first + rest), len(first) + len(rest), False


def warm_up(fn: Callable[[], Any], timing: Timing) -> None:
    """Run fn for about `timing.warmup_ms` (clocks up, caches and the launch path warm)."""
    estimate = timed_runs(fn, 1)[0]
    for _ in range(int(min(timing.max_runs, max(1, timing.warmup_ms / max(estimate, 1e-6))))):
        fn()


def timed_runs(fn: Callable[[], Any], runs: int) -> list[float]:
    """ms of each of `runs` runs, each after an L2 flush, by CUDA events."""
    import torch

    flush = _flush_buffer()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in pairs:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def quantiles(times: list[float]) -> tuple[float, ...]:
    """(min, p20, median, p80) of run times, interpolated as do_bench reports them."""
    import numpy as np

    return tuple(float(q) for q in np.quantile(times, QUANTILES))


_flush: list = []


def _flush_buffer() -> Any:
    """256 MB on the GPU, zeroed before each timed run so that no run finds its operands in L2."""
    import torch

    if not _flush:
        _flush.append(torch.empty(64 * 2**20, dtype=torch.int32, device="cuda"))
    return _flush[0]


def measure_torch(expr: Any, seed: int, timing: Timing) -> tuple[float, ...]:
    """Time the eager PyTorch version of the expression."""
    fam = family(expr.op)
    return time_fn(fam.eager(expr, fam.inputs(expr, seed_for(seed, "torch"), "cuda")), timing)


def in_turns(fns: dict[str, Callable[[], Any]], timing: Timing, rounds: int = 3) -> dict[str, list[float]]:
    """Each function's median ms in each of `rounds` rounds, a round timing them one after the
    other (so clock and thermal drift hit all alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_fn(fn, timing)[2])
    return times


def match_precision(expr: Any) -> None:
    """Let fp32 library calls (cuBLAS, cuDNN) use tf32 exactly when the workload allows it (the
    float64 reference is not affected by these switches)."""
    import torch

    tf32 = bool(getattr(expr, "tf32", False))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32


def head_to_head(expr: Any, config: Config, seed: int, timing: Timing = COMPARE, rounds: int = 3) -> dict:
    """Median ms of the tuned best (`config`, which may itself be a library call), of every library
    implementation of the expression, and of `torch.compile`'s default lowering of it, timed in
    turns on the same inputs; the fastest alternative is named."""
    fam = family(expr.op)
    x = fam.inputs(expr, seed_for(seed, "final"), "cuda")
    match_precision(expr)
    ours = fam.kernel(expr, config, fam.problem_of(expr, x.args))
    fns = {"ours": ours, **{name: fam.library(expr, name) for name in fam.libraries(expr)}}
    compiled, why = _compiled(fam.expression(expr), x.args)
    if compiled is not None:
        fns["torch.compile"] = compiled
    times = in_turns({name: (lambda f=f: f(*x.args)) for name, f in fns.items()}, timing, rounds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    ours_ms = medians.pop("ours")
    best = min(medians, key=medians.get)
    return {"ours_ms": ours_ms, "alternatives": medians, "best_alternative": best, "best_alternative_ms": medians[best],
            "compile_error": why}


def _compiled(fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any] | None, str]:
    """`torch.compile(fn)` (Inductor, default mode, static shapes), warmed up on `args`; or None and
    why it could not compile (the head-to-head then compares with the library alone)."""
    import torch
    import torch._inductor.config as inductor_config

    from tritune.kernels.frontend.extract import first_line

    torch._dynamo.reset()  # every workload's expression is the same code: Dynamo would stop compiling after 8
    try:
        compiled = torch.compile(fn, dynamic=False)
        # one small kernel at most: compiling it here beats starting Inductor's pool of compile processes
        with inductor_config.patch(compile_threads=1):
            compiled(*args)
        torch.cuda.synchronize()
        return compiled, ""
    except Exception as exc:  # noqa: BLE001 - a comparison that cannot run is reported, not fatal
        return None, first_line(exc)
