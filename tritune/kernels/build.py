"""Specialise, compile and launch a generated contraction kernel.

`Problem` holds the facts a binary assumes about its arguments (ints, pointer alignment) so the
same binary is built ahead of time by the builder and found again by the runner and replay.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritune.kernels import template
from tritune.kernels.codegen import Binary, Launcher, divisibility
from tritune.kernels.expr import Matmul
from tritune.schedules.config import Config

# Replay's last resort: valid for any contraction.
DEFAULT = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3, UNROLL=1)


@dataclass(frozen=True)
class Problem:
    """The integer arguments of one launch and the alignment of its pointers."""

    batch: int
    ints: tuple[int, ...]  # M, N, K, 9 strides (A, B, C), [bias stride]
    aligned: tuple[bool, ...]  # A, B, C, [BIAS] data pointers 16-byte aligned

    @property
    def m(self) -> int:
        return self.ints[0]

    @property
    def n(self) -> int:
        return self.ints[1]

    @property
    def k(self) -> int:
        return self.ints[2]


def pointer_names(expr: Matmul) -> list[str]:
    """Pointer arguments of the generated kernel, in order."""
    return ["A", "B", "C"] + (["BIAS"] if expr.has_bias else [])


def int_names(expr: Matmul) -> list[str]:
    """Integer arguments of the generated kernel, in order."""
    strides = [f"stride_{t}{d}" for t, dims in (("a", "bmk"), ("b", "bkn"), ("c", "bmn")) for d in dims]
    return ["M", "N", "K", *strides] + (["stride_bias"] if expr.has_bias else [])


def canonical_problem(expr: Matmul) -> Problem:
    """The problem of freshly allocated operands in the expression's layout."""
    m, n, k = expr.m, expr.n, expr.k
    a = (m * k, 1, m) if expr.trans_a else (m * k, k, 1)
    b = (k * n, 1, k) if expr.trans_b else (k * n, n, 1)
    c = (m * n, n, 1)
    bias = (1,) if expr.has_bias else ()
    return Problem(expr.batch, (m, n, k, *a, *b, *c, *bias), (True,) * len(pointer_names(expr)))


def problem_of(expr: Matmul, a: Any, b: Any, c: Any, bias: Any = None) -> Problem:
    """The problem of concrete torch tensors (2-D, or 3-D with a leading batch dimension)."""
    def strides(t: Any) -> tuple[int, ...]:
        s = t.stride()
        return s if t.dim() == 3 else (0, *s)

    tensors = [a, b, c] + ([bias] if expr.has_bias else [])
    bias_stride = (bias.stride(0),) if expr.has_bias else ()
    ints = (expr.m, expr.n, expr.k, *strides(a), *strides(b), *strides(c), *bias_stride)
    return Problem(expr.batch, ints, tuple(t.data_ptr() % 16 == 0 for t in tensors))


def constexprs(expr: Matmul, config: Config) -> dict[str, Any]:
    """Compile-time parameters of the template for one config."""
    return {
        "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
        "GROUP_M": config["GROUP_M"], "UNROLL": config["UNROLL"],
        "EVEN_K": expr.k % config["BLOCK_K"] == 0,
        "DOT_PRECISION": "ieee" if expr.dtype == "fp32" and not expr.tf32 else "tf32",
    }


def binary(expr: Matmul, config: Config, problem: Problem) -> Binary:
    """What the candidate's binary is built from, specialised the way Triton's JIT would, except
    that ints get the largest power-of-two divisibility (up to 16) they have: strides that are
    multiples of 8 fp16 elements still allow 16-byte loads.
    """
    fn = template.load(expr, config.get("fault"))
    pointers = tuple((name, expr.dtype, aligned) for name, aligned in zip(pointer_names(expr), problem.aligned))
    ints = tuple((name, v, divisibility(v)) for name, v in zip(int_names(expr), problem.ints))
    options = (("num_warps", config["num_warps"]), ("num_stages", config["num_stages"]))
    return Binary(fn, pointers, ints, tuple(constexprs(expr, config).items()), options)


def compile_kernel(expr: Matmul, config: Config, problem: Problem, target: Any) -> Any:
    """Compile one candidate for a target (no GPU needed); returns Triton's CompiledKernel."""
    return binary(expr, config, problem).compile(target)


def grid(expr: Matmul, config: Config) -> tuple[int, int, int]:
    """Launch grid: one program per output tile, one grid row per batch entry."""
    tiles_m = -(-expr.m // config["BLOCK_M"])
    tiles_n = -(-expr.n // config["BLOCK_N"])
    return (tiles_m * tiles_n, expr.batch, 1)


class Kernel:
    """One candidate bound to one problem; call it with tensors (a, b, out[, bias]) to launch."""

    def __init__(self, expr: Matmul, config: Config, problem: Problem, target: Any = None) -> None:
        self.expr, self.config, self.problem = expr, config, problem
        self._launcher = Launcher(binary(expr, config, problem), grid(expr, config), target)
        self.compiled = self._launcher.compiled

    def __call__(self, a: Any, b: Any, c: Any, bias: Any = None) -> None:
        """Launch on tensors whose problem matches the one this kernel was built for."""
        if self.expr.has_bias:
            self._launcher(a, b, c, bias)
        else:
            self._launcher(a, b, c)

    @property
    def shared_bytes(self) -> int | None:
        """Shared memory the compiled binary needs (None under the interpreter)."""
        return self._launcher.shared_bytes
