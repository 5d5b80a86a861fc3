"""What the GPU worker does with a candidate: fresh inputs, poisoned output, a check against the
float64 reference, then timing (`tritune.tuner.timing`); and the end-of-run head-to-head of the best
against every alternative. Runs inside the worker process; torch is imported where it is used."""
from __future__ import annotations

import hashlib
import math
import statistics
import time
from typing import Any, Callable

from tritune.kernels.family import family
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.tuner.timing import (
    COMPARE,
    LOSER,
    Timing,
    copy_bandwidth_gbps,
    covered_runs,
    graph_candidate,
    graph_timed,
    in_turns,
    kernel_median_ms,
    operand_sets,
    time_candidate,
    time_fn,
)


def seed_for(seed: int, label: str) -> int:
    """A reproducible 63-bit seed for one candidate's inputs."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{label}".encode()).digest()[:8], "little") >> 1


def rel_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref||, infinite when any output is NaN/inf (e.g. never written)."""
    # one reduction and one read back: a NaN or inf anywhere in the output makes the norm non-finite
    err = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))
    return err if math.isfinite(err) else float("inf")


def measure_candidate(expr: Any, config: Config, seed: int, timing: Timing, best_ms: float | None = None) -> dict:
    """Build (a cache hit after the builder), check against float64, then time one candidate;
    one that is clearly slower than `best_ms` after a few runs is not timed further."""
    start = time.perf_counter()
    kernel, args, err, tol = check_candidate(expr, config, seed)
    checked = time.perf_counter()
    if not err <= tol:
        return {"status": Status.WRONG_ANSWER, "message": f"relative error {err:.3g} > {tol:.1g}",
                "spent": {"check": checked - start}}
    if small(kernel, args):
        if "sets" not in _current:
            _current["sets"] = _sets(expr, seed, args, expr.key)
        sets = _current["sets"]
        times, runs, stopped = graph_candidate([lambda a=a: kernel(*a) for a in sets], timing, best_ms)
        how = f"CUDA-graph replays over {len(sets)} operand sets"
    else:
        times, runs, stopped = time_candidate(lambda: kernel(*args), timing, best_ms)
        how = "launches, L2 flushed"
    note = f"; stopped after {runs} runs, > {LOSER}x the best" if stopped else f"; {runs} runs ({how})"
    return {"status": Status.OK, "times": times, "message": f"relative error {err:.2g}{note}",
            "spent": {"check": checked - start, "timing": time.perf_counter() - checked}}


def check_candidate(expr: Any, config: Config, seed: int,
                    device: str = "cuda") -> tuple[Callable[..., Any], tuple, float, float]:
    """One candidate loaded and run once on the workload's operands: the kernel, those operands, its
    relative error against the float64 reference and the family's tolerance for it."""
    fam = family(expr.op)
    x, ref = _workload(expr, seed, device)
    match_precision(expr)
    # the builder built this binary (its problem is `canonical_problem`): loading it is a cache hit
    kernel = fam.kernel(expr, config, fam.problem_of(expr, x.args))
    out = kernel(*x.args)  # a library call may return a fresh tensor; a kernel writes the output
    # rel_error reads its result back: that waits for the launch, and raises what it raised
    return kernel, x.args, rel_error(x.out if out is None else out, ref), fam.tolerance(expr)


# The workload being tuned: its operands (as generated, to restore before each candidate) and its
# float64 reference, computed once and reused by every candidate of the workload.
_current: dict = {}


def _workload(expr: Any, seed: int, device: str = "cuda") -> tuple[Any, Any]:
    """The workload's operands, restored to their generated values with the output poisoned, and
    its float64 reference (a candidate that wrote outside its output cannot fail the next one)."""
    if _current.get("key") != (expr.key, seed, device):
        _current.clear()  # frees the previous workload's tensors first
        fam = family(expr.op)
        x = fam.inputs(expr, seed_for(seed, expr.key), device)
        _current.update(key=(expr.key, seed, device), x=x, ref=fam.reference(expr, x.args),
                        pristine=[a.clone() if hasattr(a, "clone") else a for a in x.args])
    x = _current["x"]
    for arg, kept in zip(x.args, _current["pristine"]):
        if hasattr(arg, "copy_"):
            arg.copy_(kept)
    return x, _current["ref"]


def small(kernel: Callable[..., Any], args: tuple) -> bool:
    """Whether `kernel(*args)` (fastest of three launches, L2 flushed, the host's time kept out:
    `timing.covered_runs`) is timed without the host and the flush, as CUDA-graph replays
    (`timing.graph_timed`, `timing.graph_candidate`)."""
    return graph_timed(min(covered_runs(lambda: kernel(*args), 3)), nbytes(args))


def nbytes(args: Any) -> int:
    """Bytes of a launch's tensor operands: the least a call must move (each read or written once)."""
    return sum(a.numel() * a.element_size() for a in args if hasattr(a, "element_size"))


def _sets(expr: Any, seed: int, first: tuple, label: str) -> list[tuple]:
    """Operand sets to rotate through (`timing.operand_sets`), `first` the first of them."""
    fam = family(expr.op)
    return operand_sets(lambda i: first if i == 0 else fam.inputs(expr, seed_for(seed, f"{label}:{i}"), "cuda").args,
                        nbytes(first))


def measure_torch(expr: Any, seed: int, timing: Timing) -> tuple[float, ...]:
    """Time the eager PyTorch version of the expression."""
    fam = family(expr.op)
    return time_fn(fam.eager(expr, fam.inputs(expr, seed_for(seed, "torch"), "cuda")), timing)


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
    compiled, why = _ahead.pop(expr.key, None) or _compiled(fam.expression(expr), x.args)
    if compiled is not None:
        fns["torch.compile"] = compiled
    if small(ours, x.args):
        times, how = _in_graphs(fns, _sets(expr, seed, x.args, "final"), timing, rounds)
    else:
        calls = {name: (lambda f=f: f(*x.args)) for name, f in fns.items()}
        times, how = in_turns(calls, kernel_median_ms(timing), rounds), "one launch at a time, L2 flushed before each"
    medians = {name: statistics.median(t) for name, t in times.items()}
    ours_ms = medians.pop("ours")
    best = min(medians, key=medians.get)
    return {"ours_ms": ours_ms, "alternatives": medians, "best_alternative": best, "best_alternative_ms": medians[best],
            "compile_error": why, "timed_as": how, "bytes": nbytes(x.args), "copy_gbps": copy_bandwidth_gbps()}


# `torch.compile`'s lowering of the workload being tuned, compiled ahead by `prepare_alternatives`
# (workload key -> (compiled, why not)), for the head-to-head to take instead of compiling then.
_ahead: dict[str, tuple[Callable[..., Any] | None, str]] = {}


def prepare_alternatives(expr: Any, seed: int) -> dict:
    """Compile `torch.compile`'s lowering of the expression now, while the search runs (Inductor
    from cold takes seconds), for the head-to-head of the same expression to find it ready; how
    long it took and why it failed, if it did. One workload at a time: compiling another resets
    Dynamo, which drops what was compiled before."""
    start = time.perf_counter()
    fam = family(expr.op)
    x = fam.inputs(expr, seed_for(seed, "final"), "cuda")  # the head-to-head's inputs: same shapes and strides
    match_precision(expr)
    _ahead.clear()
    _ahead[expr.key] = _compiled(fam.expression(expr), x.args)
    return {"compile_s": time.perf_counter() - start, "error": _ahead[expr.key][1]}


def warm_compiler() -> dict:
    """Pay torch.compile's one-time costs in this process now (importing Dynamo and Inductor, their
    first compile and launch: seconds on a cold process) on a tiny expression, so that the first
    workload's alternatives (`prepare_alternatives`) compile in the time of their own; how long it
    took."""
    import torch

    start = time.perf_counter()
    x = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    _compiled(lambda a, w: torch.nn.functional.silu(a @ w) + a, (x, x))
    torch._dynamo.reset()
    return {"compile_s": time.perf_counter() - start}


def _in_graphs(fns: dict[str, Callable[..., Any]], sets: list[tuple], timing: Timing, rounds: int) -> tuple[dict, str]:
    """Small kernels timed in turns as CUDA-graph replays over rotating operand sets; a function
    that cannot be captured (named in the description) is timed by launches instead."""
    from tritune.errors import first_line

    failed: list[str] = []

    def time_one(calls: list) -> float:
        try:
            return graph_candidate(calls, timing)[0][2]
        except Exception as exc:  # noqa: BLE001 - e.g. a library call that syncs: timed with the host then
            failed.append(first_line(exc))
            return time_fn(calls[0], timing)[2]

    calls = {name: [lambda f=f, a=a: f(*a) for a in sets] for name, f in fns.items()}
    times = in_turns(calls, time_one, rounds)
    how = f"CUDA-graph replays of calls back to back over {len(sets)} operand sets (L2 cold: operands rotate)"
    return times, how + (f"; not capturable, timed by launches: {failed[0]}" if failed else "")


def _compiled(fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any] | None, str]:
    """`torch.compile(fn)` (Inductor, default mode, static shapes), warmed up on `args`; or None and
    why it could not compile (the head-to-head then compares with the library alone)."""
    import torch
    import torch._inductor.config as inductor_config

    from tritune.errors import first_line

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
