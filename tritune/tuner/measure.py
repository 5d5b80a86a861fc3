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
    """do_bench settings: warm-up and repetition budgets in milliseconds."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0


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


def measure_candidate(expr: Any, config: Config, seed: int, timing: Timing) -> dict:
    """Build (a cache hit after the builder), check against float64, then time one candidate."""
    import torch

    start = time.perf_counter()
    fam = family(expr.op)
    x = fam.inputs(expr, seed_for(seed, config.key), "cuda")
    kernel = fam.kernel(expr, config, fam.problem_of(expr, x.args))
    kernel(*x.args)
    torch.cuda.synchronize()
    err, tol = rel_error(x.out, fam.reference(expr, x.args)), fam.tolerance(expr)
    checked = time.perf_counter()
    if not err <= tol:
        return {"status": Status.WRONG_ANSWER, "message": f"relative error {err:.3g} > {tol:.1g}",
                "spent": {"check": checked - start}}
    times = time_fn(lambda: kernel(*x.args), timing)
    return {"status": Status.OK, "times": times, "message": f"relative error {err:.2g}",
            "spent": {"check": checked - start, "timing": time.perf_counter() - checked}}


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


def head_to_head(expr: Any, config: Config, seed: int, timing: Timing, rounds: int = 3) -> dict:
    """Median times of the tuned kernel and of PyTorch, alternated on the same inputs."""
    fam = family(expr.op)
    x = fam.inputs(expr, seed_for(seed, "final"), "cuda")
    kernel = fam.kernel(expr, config, fam.problem_of(expr, x.args))
    times = in_turns({"ours": lambda: kernel(*x.args), "torch": fam.eager(expr, x)}, timing, rounds)
    return {"ours_ms": statistics.median(times["ours"]), "torch_ms": statistics.median(times["torch"])}
