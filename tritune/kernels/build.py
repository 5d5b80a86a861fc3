"""Specialise, compile and launch a generated contraction kernel.

A kernel binary assumes things about its arguments (which ints equal 1, which are multiples of
16, which pointers are 16-byte aligned), exactly as Triton's JIT would; `Problem` holds those facts
so the same binary is built ahead of time by the builder and found again by the runner and replay.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritune.kernels import template
from tritune.kernels.expr import INT32_MAX, Matmul
from tritune.schedules.config import Config
from tritune.settings import SETTINGS

TRITON_DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}


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


def specialization(expr: Matmul, problem: Problem, config: Config) -> tuple[dict, dict, dict]:
    """Triton (signature, constexprs, attrs) the way its JIT would specialise these arguments."""
    names = pointer_names(expr) + int_names(expr)
    signature: dict[str, str] = {}
    consts: dict[str, Any] = {}
    attrs: dict[tuple[int], list] = {}
    for i, (name, aligned) in enumerate(zip(pointer_names(expr), problem.aligned)):
        signature[name] = "*" + TRITON_DTYPES[expr.dtype]
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    for i, (name, value) in enumerate(zip(int_names(expr), problem.ints), start=len(problem.aligned)):
        if value == 1:
            signature[name], consts[name] = "constexpr", 1
            continue
        signature[name] = "i64" if abs(value) > INT32_MAX else "i32"
        if value % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
    for name, value in constexprs(expr, config).items():
        signature[name], consts[name] = "constexpr", value
    assert list(signature) == names + list(template.CONSTEXPRS)
    return signature, consts, attrs


def compile_kernel(expr: Matmul, config: Config, problem: Problem, target: Any) -> Any:
    """Compile one candidate for a target (no GPU needed); returns Triton's CompiledKernel."""
    import triton
    from triton.compiler import ASTSource

    fn = template.load(expr, config.get("fault"))
    signature, consts, attrs = specialization(expr, problem, config)
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    return triton.compile(ASTSource(fn, signature, consts, attrs), target=target, options=options)


def grid(expr: Matmul, config: Config) -> tuple[int, int, int]:
    """Launch grid: one program per output tile, one grid row per batch entry."""
    tiles_m = -(-expr.m // config["BLOCK_M"])
    tiles_n = -(-expr.n // config["BLOCK_N"])
    return (tiles_m * tiles_n, expr.batch, 1)


class Kernel:
    """One candidate bound to one problem; call it with tensors (a, b, out[, bias]) to launch."""

    def __init__(self, expr: Matmul, config: Config, problem: Problem, target: Any = None) -> None:
        self.expr, self.config, self.problem = expr, config, problem
        self._grid = grid(expr, config)
        self._consts = constexprs(expr, config)
        if SETTINGS.interpret:
            self._fn = template.load(expr, config.get("fault"))
            self.compiled = None
        else:
            self.compiled = compile_kernel(expr, config, problem, target or _current_target())
            self._launch = None

    def __call__(self, a: Any, b: Any, c: Any, bias: Any = None) -> None:
        """Launch on tensors whose problem matches the one this kernel was built for."""
        tensors = (a, b, c, bias) if self.expr.has_bias else (a, b, c)
        if self.compiled is None:
            self._fn[self._grid](*tensors, *self.problem.ints, **self._consts,
                                 num_warps=self.config["num_warps"], num_stages=self.config["num_stages"])
            return
        if self._launch is None:
            self._launch = self.compiled[self._grid]  # loads the binary; raises OutOfResources
        # Triton >= 3.3 launchers take constexpr arguments too and skip them
        self._launch(*tensors, *self.problem.ints, *self._consts.values())

    @property
    def shared_bytes(self) -> int | None:
        """Shared memory the compiled binary needs (None under the interpreter)."""
        return None if self.compiled is None else self.compiled.metadata.shared


def _current_target() -> Any:
    from triton.runtime import driver

    return driver.active.get_current_target()
