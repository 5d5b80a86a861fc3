"""Specialise and launch a generated gated dual-GEMM kernel (see contraction.launch for why a
`Problem` holds the ints and pointer alignment a binary assumes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tritune.kernels.codegen import Binary, Launcher, divisibility
from tritune.kernels.contraction.launch import launch_options, pdl_constexprs
from tritune.kernels.expr import DTYPE_BYTES
from tritune.kernels.gated import template
from tritune.kernels.gated.expr import Gated
from tritune.kernels.weights import ready_for_tma
from tritune.schedules.config import Config

# Replay's last resort: valid for any dual GEMM.
DEFAULT = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3, UNROLL=1, FUSE=0)
POINTERS = ("X", "W1", "W2", "C", "B1", "B2", "G")  # G: a row norm's weight, with one
INTS = template.INT_NAMES


@dataclass(frozen=True)
class Problem:
    """The integer arguments of one launch (INTS) and the 16-byte alignment of its pointers (POINTERS)."""

    ints: tuple[int, ...]
    aligned: tuple[bool, ...]


def canonical_problem(expr: Gated) -> Problem:
    """The problem of freshly allocated operands: x [M, K], weights [N, K] (or [K, N]), out [M, N]."""
    m, n, k = expr.m, expr.n, expr.k
    w = (1, k) if expr.trans_b else (n, 1)  # the weights' strides as a [K, N] operand
    return Problem((m, n, k, k, 1, *w, n, 1, 1 if expr.bias else 0), (True,) * (6 + (expr.norm_eps is not None)))


def ints_of(expr: Gated, x: Any, w1: Any, w2: Any, c: Any, b1: Any = None, b2: Any = None) -> tuple[int, ...]:
    """The kernel's integer arguments (INTS) for 2-D x [M, K], weights and out [M, N] (real or fake
    tensors: only strides are read); both weights (and both biases) must share their strides."""
    if w1.stride() != w2.stride() or (expr.bias and b1.stride() != b2.stride()):
        raise ValueError("the two weights (and the two biases) must have the same strides")
    ws = w1.stride()
    stride_wk, stride_wn = (ws[1], ws[0]) if expr.trans_b else ws
    return (expr.m, expr.n, expr.k, *x.stride(), stride_wk, stride_wn, *c.stride(), b1.stride(0) if expr.bias else 0)


def problem_of(expr: Gated, x: Any, w1: Any, w2: Any, c: Any, b1: Any = None, b2: Any = None, g: Any = None) -> Problem:
    """The problem of concrete tensors (see ints_of; `g` a row norm's weight)."""
    pointers = (x, w1, w2, c, b1 if expr.bias else c, b2 if expr.bias else c) + (() if g is None else (g,))
    return Problem(ints_of(expr, x, w1, w2, c, b1, b2), tuple(t.data_ptr() % 16 == 0 for t in pointers))


def tma_unfit(expr: Gated, problem: Problem) -> str | None:
    """Why tensor descriptors cannot load these operands: None when they can. TMA needs the unit
    stride last (x row-major; the weights as stored always are), 16-byte aligned bases and row
    strides that are multiples of 16 bytes."""
    ints = dict(zip(INTS, problem.ints))
    size = DTYPE_BYTES[expr.dtype]
    w_row = ints["stride_wn"] if expr.trans_b else ints["stride_wk"]
    if ints["stride_xk"] != 1 or (ints["stride_wk"] if expr.trans_b else ints["stride_wn"]) != 1:
        return "x or a weight is not contiguous along its rows"
    if ints["stride_xm"] * size % 16 or w_row * size % 16:
        return "x or a weight has a row stride that is not a multiple of 16 bytes"
    if not all(problem.aligned[:3]):
        return "an operand is not 16-byte aligned"
    return None


def constexprs(expr: Gated, config: Config) -> dict[str, Any]:
    """Compile-time parameters of the template for one config (TMA, added later, defaults off)."""
    return {
        **{knob: config[knob] for knob in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "UNROLL", "FUSE")},
        "TMA": config.get("TMA", 0), "SPLIT_K": config.get("SPLIT_K", 1),
        "EVEN_K": expr.k % config["BLOCK_K"] == 0,
        "DOT_PRECISION": "ieee" if expr.dtype == "fp32" and not expr.tf32 else "tf32", **pdl_constexprs(config),
        "GEMV": config["num_stages"] if config.get("GEMV", 0) else 0,  # 0 off, else its K loop's stages
    }


def binary(expr: Gated, config: Config, problem: Problem) -> Binary:
    """What the candidate's binary is built from, ints specialised as the matmul family does."""
    pointers = tuple((name, expr.dtype, aligned) for name, aligned in zip(POINTERS, problem.aligned))
    pointers += (("WS", "fp32", True), ("LOCKS", "i32", True))
    ints = tuple((name, v, divisibility(v)) for name, v in zip(INTS, problem.ints))
    return Binary(template.load(expr), pointers, ints, tuple(constexprs(expr, config).items()), launch_options(config))


def tiles(expr: Gated, config: Config) -> int:
    """Output tiles."""
    return -(-expr.m // config["BLOCK_M"]) * -(-expr.n // config["BLOCK_N"])


def grid(expr: Gated, config: Config) -> tuple[int, int, int]:
    """Launch grid: one program per output tile (and K slice)."""
    return (tiles(expr, config), 1, config.get("SPLIT_K", 1))


def scratch(expr: Gated, config: Config, like: Any) -> tuple[Any, Any]:
    """Split-K's scratch on `like`'s device: each slice's fp32 partial tiles of both products and
    its rows' sums of squares, per tile, and the tiles' arrival counters (int32, zero before the
    first launch; the kernel re-arms them); one element each unsplit (never read)."""
    import torch

    split, bm = config.get("SPLIT_K", 1), config["BLOCK_M"]
    count = tiles(expr, config) if split > 1 else 0
    elements = count * split * (2 * bm * config["BLOCK_N"] + bm)
    return like.new_empty(max(elements, 1), dtype=torch.float32), like.new_zeros(max(count, 1), dtype=torch.int32)


def launcher(expr: Gated, config: Config, problem: Problem, target: Any = None) -> Callable[..., None]:
    """The candidate bound to one problem: call it with (x, w1, w2, out[, b1, b2][, g]) to launch
    once (b1, b2 None without biases where a row norm's weight g follows); ValueError for
    tensor-descriptor loads of operands they cannot read. A split-K candidate owns its scratch:
    its launches must not overlap on different streams."""
    ready_for_tma(config, lambda: tma_unfit(expr, problem))
    launch = Launcher(binary(expr, config, problem), grid(expr, config), target)
    bias = expr.bias
    owned: list = []  # split-K's scratch, allocated at the first launch (on its operands' device)

    def run(x: Any, w1: Any, w2: Any, c: Any, b1: Any = None, b2: Any = None, g: Any = None) -> None:
        if not owned:
            owned.extend(scratch(expr, config, x))
        launch(x, w1, w2, c, b1 if bias else c, b2 if bias else c, *(() if g is None else (g,)), *owned)
    return run
