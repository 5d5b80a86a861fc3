"""GPU-side measurement of one candidate: fresh inputs, poisoned output, check, then time.

Runs inside the runner's worker process only; it is the one module of tritune that touches CUDA.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tritune.kernels.build import Kernel, problem_of
from tritune.kernels.expr import Matmul
from tritune.records.result import Status
from tritune.schedules.config import Config

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
QUANTILES = (0.0, 0.2, 0.5, 0.8)
# Relative Frobenius error allowed per operand type: output rounding of fp16 is ~3e-4 and of
# bf16 ~2e-3; tf32 rounds inputs to 10 mantissa bits, like fp16.
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2, "tf32": 2e-3, "fp32": 1e-5}


@dataclass(frozen=True)
class Timing:
    """do_bench settings: warm-up and repetition budgets in milliseconds."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0


@dataclass
class Inputs:
    """Operands in the expression's layout, and an output buffer."""

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    bias: torch.Tensor | None


def seed_for(seed: int, label: str) -> int:
    """A reproducible 63-bit seed for one candidate's inputs."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{label}".encode()).digest()[:8], "little") >> 1


def make_inputs(expr: Matmul, seed: int, device: str = "cuda") -> Inputs:
    """Fresh random operands (never zeros: they hide unwritten outputs) and a NaN-poisoned output."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = TORCH_DTYPES[expr.dtype]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    bm, m, n, k = expr.batch, expr.m, expr.n, expr.k
    a = rand(bm, k, m).transpose(1, 2) if expr.trans_a else rand(bm, m, k)
    b = rand(bm, n, k).transpose(1, 2) if expr.trans_b else rand(bm, k, n)
    bias = rand(n) if expr.has_bias else None
    c = torch.full((bm, m, n), float("nan"), device=device, dtype=dt)
    return Inputs(a, b, c, bias)


def reference(expr: Matmul, x: Inputs) -> torch.Tensor:
    """The expression in float64."""
    out = torch.matmul(x.a.double(), x.b.double())
    bias = None if x.bias is None else x.bias.double()
    for step in expr.epilogue:
        out = step.reference(out, bias)
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, infinite when any output is NaN/inf (e.g. never written)."""
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def tolerance(expr: Matmul) -> float:
    """The error a correct kernel stays under for this dtype."""
    return TOLERANCE["tf32" if expr.tf32 else expr.dtype]


def time_fn(fn: Callable[[], Any], timing: Timing) -> tuple[float, ...]:
    """(min, p20, median, p80) in ms: warmed up, L2 flushed before each run, CUDA events."""
    from triton.testing import do_bench

    return tuple(float(t) for t in do_bench(fn, warmup=timing.warmup_ms, rep=timing.rep_ms,
                                            quantiles=list(QUANTILES)))


def measure_candidate(expr: Matmul, config: Config, seed: int, timing: Timing) -> dict:
    """Build (a cache hit after the builder), check against float64, then time one candidate."""
    x = make_inputs(expr, seed_for(seed, config.key))
    kernel = Kernel(expr, config, problem_of(expr, x.a, x.b, x.c, x.bias))
    kernel(x.a, x.b, x.c, x.bias)
    torch.cuda.synchronize()
    err = rel_error(x.c, reference(expr, x))
    if not err <= tolerance(expr):
        return {"status": Status.WRONG_ANSWER, "message": f"relative error {err:.3g} > {tolerance(expr):.1g}"}
    times = time_fn(lambda: kernel(x.a, x.b, x.c, x.bias), timing)
    return {"status": Status.OK, "times": times, "message": f"relative error {err:.2g}"}


def torch_fn(expr: Matmul, x: Inputs) -> Callable[[], Any]:
    """What a user would run in eager PyTorch for the same expression (cuBLAS for the product)."""
    def run() -> Any:
        out = torch.matmul(x.a, x.b, out=x.c)
        for step in expr.epilogue:
            out = step.reference(out, x.bias)
        return out
    return run


def measure_torch(expr: Matmul, seed: int, timing: Timing) -> tuple[float, ...]:
    """Time the eager PyTorch version of the expression."""
    x = make_inputs(expr, seed_for(seed, "torch"))
    return time_fn(torch_fn(expr, x), timing)


def head_to_head(expr: Matmul, config: Config, seed: int, timing: Timing, rounds: int = 3) -> dict:
    """Median times of the tuned kernel and of PyTorch, alternated on the same inputs."""
    x = make_inputs(expr, seed_for(seed, "final"))
    kernel = Kernel(expr, config, problem_of(expr, x.a, x.b, x.c, x.bias))
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(time_fn(lambda: kernel(x.a, x.b, x.c, x.bias), timing)[2])
        theirs.append(time_fn(torch_fn(expr, x), timing)[2])
    return {"ours_ms": sorted(ours)[rounds // 2], "torch_ms": sorted(theirs)[rounds // 2]}
