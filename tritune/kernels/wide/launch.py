"""Specialise and launch a generated wide-GEMM kernel (see contraction.launch for why a `Problem`
holds the ints and pointer alignment a binary assumes).

A launch takes (x, W_1.., out_1.., [b_1..][, g]): the weights as stored ([N_i, K], or [K, N_i]), one
output [M, N_i] each (any strides), the biases [N_i] with a bias, a row norm's weight [K] with one.
The kernel then takes split-K's scratch (`scratch`), which a launcher allocates once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tritune.kernels.codegen import Binary, Launcher, divisibility
from tritune.kernels.contraction import launch as contraction
from tritune.kernels.expr import DTYPE_BYTES
from tritune.kernels.wide import template
from tritune.kernels.weights import ready_for_tma
from tritune.kernels.wide.expr import Wide
from tritune.schedules.config import Config

# Replay's last resort: valid for any wide GEMM.
DEFAULT = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3, UNROLL=1)
# the contraction template's constexprs this template takes too
SHARED_CONSTS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "UNROLL", "EVEN_K", "DOT_PRECISION", "TMA", "SPLIT_K", "PDL",
                 "PDL_K", "GEMV")


@dataclass(frozen=True)
class Problem:
    """The integer arguments of one launch (template.int_names) and the 16-byte alignment of its
    pointers (X, then template.pointer_names)."""

    ints: tuple[int, ...]
    aligned: tuple[bool, ...]


def split(expr: Wide, args: Sequence[Any]) -> tuple[Any, list, list, list]:
    """(x, weights, outputs, biases) of a launch's arguments (biases None without a bias)."""
    n = len(expr.ns)
    x, ws, cs, bs = args[0], list(args[1:1 + n]), list(args[1 + n:1 + 2 * n]), list(args[1 + 2 * n:])
    return x, ws, cs, (bs[:n] if expr.bias else [None] * n)


def norm_weight(expr: Wide, args: Sequence[Any]) -> Any:
    """A row norm's weight among a launch's arguments (the last), or None without a norm."""
    return None if expr.norm_eps is None else args[-1]


def _weight_strides(expr: Wide, stride: Sequence[int]) -> tuple[int, int]:
    """A weight's strides as the [K, N] operand of x @ w."""
    return (stride[1], stride[0]) if expr.trans_b else (stride[0], stride[1])


def canonical_problem(expr: Wide) -> Problem:
    """The problem of the family's operands: x [M, K], weights [N_i, K] (or [K, N_i]), the outputs
    side by side in one [M, sum N_i] buffer (see WideFamily.inputs), fresh biases."""
    width, eb = sum(expr.ns), DTYPE_BYTES[expr.dtype]
    flat, outputs, offset = [], [], 0
    for n in expr.ns:
        flat += [*_weight_strides(expr, (expr.k, 1) if expr.trans_b else (n, 1)), width, 1, 1 if expr.bias else 0]
        outputs.append(offset * eb % 16 == 0)
        offset += n
    biases = [True] * len(expr.ns) if expr.bias else outputs  # the outputs stand in for absent biases
    return Problem((expr.m, expr.k, expr.k, 1) + _segment_ints(expr, flat),
                   (True,) * (1 + len(expr.ns)) + tuple(outputs + biases) + ((True,) if expr.norm_eps else ()))


def _segment_ints(expr: Wide, flat: Sequence[int]) -> tuple[int, ...]:
    """Each segment's ints with its width first (SEGMENT_INTS order)."""
    per = len(template.SEGMENT_INTS) - 1
    return tuple(v for i, n in enumerate(expr.ns) for v in (n, *flat[i * per:(i + 1) * per]))


def ints_of(expr: Wide, x: Any, ws: Sequence[Any], cs: Sequence[Any], bs: Sequence[Any]) -> tuple[int, ...]:
    """The kernel's integer arguments for 2-D x, weights and outputs (real or fake tensors: only
    strides are read)."""
    flat = []
    for w, c, b in zip(ws, cs, bs):
        flat += [*_weight_strides(expr, w.stride()), *c.stride(), b.stride(0) if expr.bias else 0]
    return (expr.m, expr.k, *x.stride()) + _segment_ints(expr, flat)


def problem_of(expr: Wide, *args: Any) -> Problem:
    """The problem of concrete tensors (kernel argument order, see the module's docstring)."""
    x, ws, cs, bs = split(expr, args)
    g = norm_weight(expr, args)
    pointers = (x, *ws, *cs, *(bs if expr.bias else cs), *(() if g is None else (g,)))
    return Problem(ints_of(expr, x, ws, cs, bs), tuple(t.data_ptr() % 16 == 0 for t in pointers))


def ends(expr: Wide, block_n: int) -> tuple[int, ...]:
    """The N-tile index where each segment's tiles end (the last: all N tiles)."""
    out, total = [], 0
    for n in expr.ns:
        total += -(-n // block_n)
        out.append(total)
    return tuple(out)


def tma_unfit(expr: Wide, problem: Problem) -> str | None:
    """Why tensor descriptors cannot load x and every weight: None when they can (the unit stride
    last, 16-byte aligned bases, row strides that are multiples of 16 bytes)."""
    ints = dict(zip(template.int_names(expr), problem.ints))
    size = DTYPE_BYTES[expr.dtype]
    rows = [("x", ints["stride_xk"], ints["stride_xm"])]
    for i in range(len(expr.ns)):
        unit, row = ("k", "n") if expr.trans_b else ("n", "k")
        rows.append((f"weight {i + 1}", ints[f"stride_w{i}{unit}"], ints[f"stride_w{i}{row}"]))
    for name, unit, row in rows:
        if unit != 1 or row * size % 16:
            return f"{name}'s rows are not contiguous, or not 16-byte aligned"
    if not all(problem.aligned[:1 + len(expr.ns)]):
        return "an operand is not 16-byte aligned"
    return None


def constexprs(expr: Wide, config: Config) -> dict[str, Any]:
    """Compile-time parameters of the template for one config."""
    shared = contraction.constexprs(expr.as_matmul(), config)
    return {**{name: shared[name] for name in SHARED_CONSTS},
            **{f"END{i}": end for i, end in enumerate(ends(expr, config["BLOCK_N"]))}}


def binary(expr: Wide, config: Config, problem: Problem) -> Binary:
    """What the candidate's binary is built from, ints specialised as the matmul family does."""
    names = ("X", *template.pointer_names(expr))
    pointers = tuple((name, expr.dtype, aligned) for name, aligned in zip(names, problem.aligned))
    pointers += (("WS", "fp32", True), ("LOCKS", "i32", True))
    ints = tuple((name, v, divisibility(v)) for name, v in zip(template.int_names(expr), problem.ints))
    return Binary(template.load(expr), pointers, ints, tuple(constexprs(expr, config).items()),
                  contraction.launch_options(config))


def tiles(expr: Wide, config: Config) -> int:
    """Output tiles of every segment together."""
    return -(-expr.m // config["BLOCK_M"]) * ends(expr, config["BLOCK_N"])[-1]


def grid(expr: Wide, config: Config) -> tuple[int, int, int]:
    """Launch grid: one program per output tile of every segment (and K slice)."""
    return (tiles(expr, config), 1, config.get("SPLIT_K", 1))


def scratch_sizes(expr: Wide, config: Config) -> tuple[int, int]:
    """Split-K's scratch: fp32 elements of the partial tiles (and, with a row norm, of the partial
    sums of squares after them), and the tiles' arrival counters (int32, zero before the first
    launch; the kernel re-arms them); (0, 0) unsplit."""
    split = config.get("SPLIT_K", 1)
    if split == 1:
        return 0, 0
    rows = config["BLOCK_M"] if expr.norm_eps is not None else 0
    return tiles(expr, config) * split * (config["BLOCK_M"] * config["BLOCK_N"] + rows), tiles(expr, config)


def scratch(expr: Wide, config: Config, like: Any) -> tuple[Any, Any]:
    """Split-K's scratch on `like`'s device (one element each unsplit: never read)."""
    import torch

    elements, counters = scratch_sizes(expr, config)
    return like.new_empty(max(elements, 1), dtype=torch.float32), like.new_zeros(max(counters, 1), dtype=torch.int32)


def launcher(expr: Wide, config: Config, problem: Problem, target: Any = None) -> Callable[..., None]:
    """The candidate bound to one problem: call it with (x, W_1.., out_1.., [b_1..][, g]) to launch
    once; ValueError for tensor-descriptor loads of operands they cannot read. A split-K candidate
    owns its scratch: its launches must not overlap on different streams."""
    ready_for_tma(config, lambda: tma_unfit(expr, problem))
    launch = Launcher(binary(expr, config, problem), grid(expr, config), target)
    owned: list = []  # split-K's scratch, allocated at the first launch (on its operands' device)

    def run(*args: Any) -> None:
        x, ws, cs, bs = split(expr, args)
        g = norm_weight(expr, args)
        if not owned:
            owned.extend(scratch(expr, config, x))
        # the outputs stand in for absent biases
        launch(x, *ws, *cs, *(cs if not expr.bias else bs), *(() if g is None else (g,)), *owned)
    return run

