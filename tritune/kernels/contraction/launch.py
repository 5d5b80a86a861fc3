"""Specialise and launch a generated contraction kernel.

`Problem` holds the facts a binary assumes about its arguments (ints, pointer alignment) so the
same binary is built ahead of time by the builder and found again by the runner and replay.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritune.kernels import norm
from tritune.kernels.codegen import Binary, Launcher, divisibility, use_torch_scratch
from tritune.kernels.contraction import template
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.device import current_sms, interpreted
from tritune.kernels.expr import DTYPE_BYTES
from tritune.schedules.config import Config

# Replay's last resort: valid for any contraction.
DEFAULT = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3, UNROLL=1)


@dataclass(frozen=True)
class Problem:
    """The integer arguments of one launch and the alignment of its pointers."""

    batch: int
    ints: tuple[int, ...]  # M, N, K, 9 strides (A, B, C), bias stride, the extra inputs' strides
    aligned: tuple[bool, ...]  # A, B, C, BIAS, then each extra input's data pointer 16-byte aligned, then the norm's

    def stride(self, name: str) -> int:
        """One stride by its kernel argument name, e.g. 'stride_am'."""
        return self.ints[INT_NAMES.index(name)]


POINTER_NAMES = ("A", "B", "C", "BIAS")  # then WS, LOCKS: split-K scratch, always aligned; then E0, E1, ..; G[, GB]
NORM_POINTERS = ("G", "GB")  # a row norm's weight, a LayerNorm's bias
INT_NAMES = template.INT_NAMES


def canonical_problem(expr: Matmul) -> Problem:
    """The problem of freshly allocated operands in the expression's layout."""
    m, n, k = expr.m, expr.n, expr.k
    a = (m * k, 1, m) if expr.trans_a else (m * k, k, 1)
    b = (k * n, 1, k) if expr.trans_b else (k * n, n, 1)
    c = (m * n, n, 1)
    # extra inputs as `inputs` allocates them: a contiguous [B, M, N] residual, contiguous vectors
    extra = [s for inp in expr.inputs for s in ((m * n, n, 1) if inp.shape == "mn" else (1,))]
    return Problem(expr.batch, (m, n, k, *a, *b, *c, 1 if expr.has_bias else 0, *extra),
                   (True,) * (4 + len(expr.inputs) + norm_tensors(expr)))


def norm_tensors(expr: Matmul) -> int:
    """How many tensors a launch's row norm adds after the epilogue's inputs (`norm.tensors`)."""
    return norm.tensors(expr.norm_eps, expr.layer_norm)


def epilogue_inputs(expr: Matmul, inputs: tuple) -> tuple:
    """The epilogue's extra inputs among a launch's trailing tensors (a row norm's come last)."""
    return inputs[:len(inputs) - norm_tensors(expr)]


def ints_of(expr: Matmul, a: Any, b: Any, c: Any, bias: Any = None, *inputs: Any) -> tuple[int, ...]:
    """The kernel's integer arguments for torch tensors (2-D, or 3-D with a leading batch
    dimension; real or fake: only shapes and strides are read); `inputs` are the epilogue's extra
    inputs in order (`expr.inputs`): a residual 2-D (shared by the batch) or 3-D, vectors 1-D; then,
    with a row norm, its weight (LayerNorm: and bias; no integer arguments of their own)."""
    inputs = epilogue_inputs(expr, inputs)

    def strides(t: Any) -> tuple[int, ...]:
        s = t.stride()
        return s if t.dim() == 3 else (0, *s)

    kinds = expr.inputs
    if len(inputs) != len(kinds):
        raise ValueError(f"{expr.describe()} takes {len(kinds)} extra epilogue inputs, got {len(inputs)}")
    extra = [s for kind, t in zip(kinds, inputs) for s in (strides(t) if kind.shape == "mn" else t.stride()[-1:])]
    bias_stride = bias.stride(0) if expr.has_bias else 0
    return (expr.m, expr.n, expr.k, *strides(a), *strides(b), *strides(c), bias_stride, *extra)


def problem_of(expr: Matmul, a: Any, b: Any, c: Any, bias: Any = None, *inputs: Any) -> Problem:
    """The problem of concrete torch tensors (2-D, or 3-D with a leading batch dimension)."""
    pointers = (a, b, c, bias if expr.has_bias else c, *inputs)
    return Problem(expr.batch, ints_of(expr, a, b, c, bias, *inputs), tuple(t.data_ptr() % 16 == 0 for t in pointers))


def tma_unfit(expr: Matmul, problem: Problem, store: bool = False) -> str | None:
    """Why tensor descriptors cannot read these operands (or, `store`, also write the output):
    None when they can. TMA needs the unit stride last in memory, 16-byte aligned bases and every
    other stride a multiple of 16 bytes.
    """
    size = DTYPE_BYTES[expr.dtype]
    operands = (("a", expr.trans_a, "mk"), ("b", expr.trans_b, "kn")) + ((("c", False, "mn"),) if store else ())
    for x, trans, dims in operands:
        inner, outer = (dims[0], dims[1]) if trans else (dims[1], dims[0])
        if problem.stride(f"stride_{x}{inner}") != 1:
            return f"operand {x.upper()} is not contiguous along {inner.upper()}"
        others = [problem.stride(f"stride_{x}{outer}")] + ([problem.stride(f"stride_{x}b")] if problem.batch > 1 else [])
        if any(v * size % 16 for v in others):
            return f"{'output' if x == 'c' else 'operand'} {x.upper()} has a row stride that is not a multiple of 16 bytes"
    if not all(problem.aligned[:3 if store else 2]):
        return "an operand is not 16-byte aligned"
    return None


def constexprs(expr: Matmul, config: Config) -> dict[str, Any]:
    """Compile-time parameters of the template for one config (knobs added later default off)."""
    return {
        "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
        "GROUP_M": config["GROUP_M"], "UNROLL": config["UNROLL"],
        "EVEN_K": expr.k % config["BLOCK_K"] == 0,
        "DOT_PRECISION": "ieee" if expr.dtype == "fp32" and not expr.tf32 else "tf32",
        "SPLIT_K": config.get("SPLIT_K", 1), "TMA": config.get("TMA", 0), "PERSISTENT": config.get("PERSISTENT", 0),
        "WARP_SPEC": config.get("WARP_SPEC", 0), **pdl_constexprs(config),
        "GEMV": config["num_stages"] if config.get("GEMV", 0) else 0,  # 0 off, else its K loop's stages
    }


def pdl_constexprs(config: Config) -> dict[str, int]:
    """PDL (programmatic dependent launch: 0 off, 1 on, 2 with the weights prefetched) and PDL_K,
    how far along K the prefetch reaches: the pipeline's first steps, as a power of two (0 unless
    PDL=2, so that PDL=0 and 1 share their other constexprs)."""
    pdl = config.get("PDL", 0)
    reach = config["num_stages"] * config["BLOCK_K"]
    return {"PDL": pdl, "PDL_K": max(128, 1 << (reach - 1).bit_length()) if pdl == 2 else 0}


def launch_options(config: Config) -> tuple[tuple[str, Any], ...]:
    """Triton's compile options of a config's binary: warps, stages, and the programmatic-dependence
    launch attribute where the config asks for it."""
    pdl = (("launch_pdl", True),) if config.get("PDL", 0) else ()
    return (("num_warps", config["num_warps"]), ("num_stages", config["num_stages"]), *pdl)


def binary(expr: Matmul, config: Config, problem: Problem) -> Binary:
    """What the candidate's binary is built from, specialised the way Triton's JIT would, except
    that ints get the largest power-of-two divisibility (up to 16) they have: strides that are
    multiples of 8 fp16 elements still allow 16-byte loads.
    """
    fn = template.load(expr)
    pointers = tuple((name, expr.dtype, aligned) for name, aligned in zip(POINTER_NAMES, problem.aligned))
    pointers += (("WS", "fp32", True), ("LOCKS", "i32", True))
    pointers += tuple((f"E{i}", inp.dtype, aligned) for i, (inp, aligned) in enumerate(zip(expr.inputs, problem.aligned[4:])))
    norms = norm_tensors(expr)
    pointers += tuple((name, expr.dtype, aligned) for name, aligned in zip(NORM_POINTERS[:norms],
                                                                          problem.aligned[len(problem.aligned) - norms:]))
    names = INT_NAMES + template.input_int_names(expr)
    ints = tuple((name, v, divisibility(v)) for name, v in zip(names, problem.ints))
    return Binary(fn, pointers, ints, tuple(constexprs(expr, config).items()), launch_options(config))


def tiles(expr: Matmul, config: Config) -> int:
    """Output tiles of one batch entry."""
    return -(-expr.m // config["BLOCK_M"]) * -(-expr.n // config["BLOCK_N"])


def grid(expr: Matmul, config: Config, sms: int) -> tuple[int, int, int]:
    """Launch grid: a program per output tile (and K slice) per batch entry, or, persistent, one
    program per SM (per batch entry) walking the tiles.
    """
    if config.get("PERSISTENT", 0):
        return (min(tiles(expr, config), sms), expr.batch, 1)
    return (tiles(expr, config), expr.batch, config.get("SPLIT_K", 1))


def launcher(expr: Matmul, config: Config, problem: Problem, target: Any = None) -> "Kernel":
    """The candidate bound to one problem: call it with (a, b, out[, bias, *inputs]) to launch once."""
    return Kernel(expr, config, problem, target)


class Kernel:
    """One candidate bound to one problem; call it with tensors (a, b, out[, bias, *inputs]) to
    launch (`bias` None where the epilogue has none; `inputs` the epilogue's extra inputs).

    Split-K kernels own a scratch area (fp32 partial tiles and one arrival counter per tile):
    launches of one Kernel must not overlap on different streams.
    """

    def __init__(self, expr: Matmul, config: Config, problem: Problem, target: Any = None) -> None:
        self.expr, self.config, self.problem = expr, config, problem
        if config.get("TMA", 0) and (why := tma_unfit(expr, problem, store=config["TMA"] == 2)):
            raise ValueError(f"config uses TMA but {why}")
        if expr.norm_eps is not None and config.get("WARP_SPEC", 0):
            raise ValueError("a row-norm prologue needs its input tile in every warp: no warp specialisation")
        if expr.norm_eps is not None and not expr.layer_norm and config.get("SPLIT_K", 1) > 1:
            raise ValueError("an RMSNorm prologue needs the whole K loop in one program: no split-K")
        self._launcher = Launcher(binary(expr, config, problem), grid(expr, config, current_sms()), target)
        self.compiled = self._launcher.compiled
        self._has_bias = expr.has_bias  # read on every launch: not a property walk each time
        self._scratch: tuple[Any, Any] | None = None

    def __call__(self, a: Any, b: Any, c: Any, bias: Any = None, *inputs: Any) -> None:
        """Launch on tensors whose problem matches the one this kernel was built for (`inputs`: the
        epilogue's, then a row norm's weight and LayerNorm's bias)."""
        scratch = self._scratch
        if scratch is None:
            scratch = self._scratch = self._allocate(a.device)
        self._launcher(a, b, c, bias if self._has_bias else c, *scratch, *inputs)

    def _allocate(self, device: Any) -> tuple[Any, Any]:
        import torch

        split, c = self.config.get("SPLIT_K", 1), self.config
        slots = tiles(self.expr, c) * self.expr.batch if split > 1 else 1
        ws = torch.empty(slots * split * c["BLOCK_M"] * c["BLOCK_N"] if split > 1 else 1, dtype=torch.float32,
                         device=device)
        if c.get("TMA", 0) and not interpreted():
            use_torch_scratch()
        return ws, torch.zeros(slots, dtype=torch.int32, device=device)

    @property
    def shared_bytes(self) -> int | None:
        """Shared memory the compiled binary needs (None under the interpreter)."""
        return self._launcher.shared_bytes

