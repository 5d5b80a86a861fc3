"""Specialise and launch a generated attention kernel (see contraction.launch for why a `Problem`
holds the ints and pointer alignment a binary assumes).

A launch takes (q, k, v, out[, mask[, cos_q, sin_q, cos_k, sin_k]]): q, out [B, H, Lq, D], k, v
[B, H / group, Lk, D], any strides; the mask broadcastable to [B, H, Lq, Lk] (a dimension it does not
vary along has stride 0); rotary tables broadcastable to [B, H, Lq, rope_q] (q's) and [B, H / group,
Lk, rope_k] (k's), cos and sin of one side alike (None for a side without); where the kernel computes
the tables (`rope_pos`), each side's positions broadcastable to [B, 1, rows, 1] and its frequencies
[rope / 2] instead. The kernel then takes a key split's scratch (`scratch`), which a launcher
allocates once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tritune.kernels.attention import template
from tritune.kernels.attention.expr import OUT_DIMS, Attention
from tritune.kernels.codegen import Binary, Launcher, divisibility, specialize
from tritune.schedules.config import Config

# Replay's last resort: valid for any attention (MMAs: no [M, N, D] product in registers at 64 rows).
DEFAULT = Config.of(BLOCK_N=16, DOT=1, num_warps=4, num_stages=1)
MMA_ROWS = 16  # tl.dot's least M and K


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def block_m(rows: int, dot: int) -> int:
    """Query rows of a program's tile (Lq x group): padded to a power of two (to 16 for MMAs)."""
    return max(MMA_ROWS if dot else 1, _pow2(rows))


def block_d(d: int) -> int:
    """Head-dim lanes of a tile: D padded to a power of two, at least 16 (an MMA's K)."""
    return max(MMA_ROWS, _pow2(d))


@dataclass(frozen=True)
class Problem:
    """The integer arguments of one launch (template.int_names) and the 16-byte alignment of its
    pointers (template.POINTER_NAMES; the mask's stands in for itself when there is none)."""

    ints: tuple[int, ...]
    aligned: tuple[bool, ...]


def dense_strides(shape: tuple[int, ...], order: str) -> tuple[int, ...]:
    """The strides of a dense [B, H, Lq, D] tensor laid out in `order` (of "bhqd", outermost first)."""
    strides, step = [0] * 4, 1
    for dim in reversed(order):
        i = OUT_DIMS.index(dim)
        strides[i], step = step, step * shape[i]
    return tuple(strides)


def out_strides(expr: Attention) -> tuple[int, ...]:
    """The output's strides (b, h, q, d), dense in `expr.out_order`."""
    return dense_strides((expr.batch, expr.heads, expr.lq, expr.d), expr.out_order)


def _mask_strides(expr: Attention) -> tuple[int, int, int, int]:
    """A contiguous mask of `expr.mask_shape()`'s strides, 0 where it is broadcast."""
    return _broadcast_strides(expr.mask_shape())


def _broadcast_strides(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """A contiguous tensor's strides, 0 along every dimension of size 1."""
    strides, step = [0] * 4, 1
    for i in reversed(range(4)):
        strides[i] = step if shape[i] > 1 else 0
        step *= shape[i]
    return tuple(strides)


def canonical_problem(expr: Attention) -> Problem:
    """The problem of the family's operands: contiguous q, k, v, the output in its order, the mask."""
    h, hk, lq, lk, d = expr.heads, expr.kv_heads, expr.lq, expr.lk, expr.d
    ints = (h, lq, lk, d, expr.group, h * lq * d, lq * d, d, 1, hk * lk * d, lk * d, d, 1, hk * lk * d, lk * d, d, 1,
            *out_strides(expr), *_mask_strides(expr), *_rope_strides(expr, lq, expr.rope_q),
            *_rope_strides(expr, lk, expr.rope_k))
    return Problem(ints, (True,) * len(template.POINTER_NAMES))


def _rope_strides(expr: Attention, rows: int, lanes: int) -> tuple[int, ...]:
    """A side's contiguous rotary operands' strides (b, h, row, lane): its tables', or its positions'
    and (lane) its frequencies'; all 0 for a side without rotation."""
    if not lanes:  # no operands: as `rope_strides` gives for None, or the worker's binary is not the builder's
        return (0, 0, 0, 0)
    if not expr.rope_pos:
        return _broadcast_strides(expr.rope_shape(rows, lanes))
    return (*_broadcast_strides(expr.rope_shape(rows, 1))[:3], 1)


def rope_strides(expr: Attention, cos: Any, sin: Any) -> tuple[int, ...]:
    """A side's rotary operands' strides as the kernel takes them: its cos table's (`mask_strides`),
    or (rope_pos) its positions' and its frequencies' along the lane."""
    if cos is None or not expr.rope_pos:
        return mask_strides(expr, cos)
    return (*mask_strides(expr, cos)[:3], sin.stride(-1))


def mask_strides(expr: Attention, mask: Any) -> tuple[int, int, int, int]:
    """A mask (or rotary table) tensor's strides as the kernel takes them: right-aligned to 4-D, 0
    along every dimension of size 1 (broadcast)."""
    if mask is None:
        return (0, 0, 0, 0)
    shape, stride = (1,) * (4 - mask.dim()) + tuple(mask.shape), (0,) * (4 - mask.dim()) + tuple(mask.stride())
    return tuple(s if n > 1 else 0 for n, s in zip(shape, stride))


def ints_of(expr: Attention, q: Any, k: Any, v: Any, out: Any, mask: Any = None, cos_q: Any = None,
            sin_q: Any = None, cos_k: Any = None, sin_k: Any = None) -> tuple[int, ...]:
    """The kernel's integer arguments for 4-D q, k, v, out, a mask and the rotary tables (real or
    fake tensors: only strides are read; a sine's strides are its cosine's)."""
    return (expr.heads, expr.lq, expr.lk, expr.d, expr.group, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            *mask_strides(expr, mask), *rope_strides(expr, cos_q, sin_q), *rope_strides(expr, cos_k, sin_k))


def pointers(q: Any, k: Any, v: Any, out: Any, mask: Any = None, *tables: Any) -> tuple:
    """The kernel's pointer arguments: q stands in for an absent mask or table (never read)."""
    tables = (*tables, *(None,) * (4 - len(tables)))
    return (q, k, v, out, *(q if t is None else t for t in (mask, *tables)))


def problem_of(expr: Attention, *args: Any) -> Problem:
    """The problem of concrete tensors (kernel argument order, see the module's docstring)."""
    return Problem(ints_of(expr, *args), tuple(t.data_ptr() % 16 == 0 for t in pointers(*args)))


def constexprs(expr: Attention, config: Config) -> dict[str, Any]:
    """Compile-time parameters of the template for one config."""
    block_n, bd = config["BLOCK_N"], block_d(expr.d)
    return {"SCALE": expr.scale, "MASK": 0 if expr.mask is None else 2 if expr.mask == "bool" else 1,
            "CAUSAL": expr.causal, "BLOCK_M": block_m(expr.lq * expr.group, config["DOT"]), "BLOCK_N": block_n,
            "BLOCK_D": bd,
            "DOT": config["DOT"], "DOT_PRECISION": "ieee" if expr.dtype == "fp32" else "tf32",
            "SPLIT": config.get("SPLIT", 1),
            "EVEN_N": expr.lk % block_n == 0, "EVEN_D": expr.d == bd, "ROPE_Q": expr.rope_q, "ROPE_K": expr.rope_k,
            "ROPE_ANGLES": bool(expr.rope_pos), "ROPE_SCALE": expr.rope_scale, "ROPE_ROWS": "n" in expr.rope_dims}


class _Binary(Binary):
    """A Binary whose mask pointer may be boolean (`i1`, a type the shared dtype table lacks)."""

    def compile(self, target: Any) -> Any:
        import triton
        from triton.compiler import ASTSource

        ptrs = [(n, "fp16" if t == "bool" else t, a) for n, t, a in self.pointers]
        signature, consts, attrs = specialize(ptrs, self.ints, dict(self.consts))
        signature.update({n: "*i1" for n, t, _ in self.pointers if t == "bool"})
        return triton.compile(ASTSource(self.fn, signature, consts, attrs), target=target, options=dict(self.options))


def binary(expr: Attention, config: Config, problem: Problem) -> Binary:
    """What the candidate's binary is built from, ints specialised as the other families do."""
    rope = (expr.rope_pos, expr.rope_freq) if expr.rope_pos else (expr.dtype,) * 2
    dtypes = (expr.dtype,) * 4 + (expr.mask or expr.dtype,) + rope * 2
    pointers = tuple((n, t, a) for n, t, a in zip(template.POINTER_NAMES, dtypes, problem.aligned))
    pointers += (("WS", "fp32", True), ("LOCKS", "i32", True))
    ints = tuple((name, v, divisibility(v)) for name, v in zip(template.int_names(), problem.ints))
    options = (("num_warps", config["num_warps"]), ("num_stages", config["num_stages"]))
    kind = _Binary if expr.mask == "bool" else Binary
    return kind(template.load(expr), pointers, ints, tuple(constexprs(expr, config).items()), options)


def grid(expr: Attention, config: Config) -> tuple[int, int, int]:
    """Launch grid: one program per (batch, key/value head) and key split."""
    return (expr.batch * expr.kv_heads, config.get("SPLIT", 1), 1)


def scratch_sizes(expr: Attention, config: Config) -> tuple[int, int]:
    """A key split's scratch: fp32 elements of every split's partial accumulator, row maxima and
    row sums, and one arrival counter per (batch, key/value head) (int32, zero before the first
    launch; the kernel re-arms them); (0, 0) unsplit."""
    split = config.get("SPLIT", 1)
    if split == 1:
        return 0, 0
    rows = block_m(expr.lq * expr.group, config["DOT"])
    heads = expr.batch * expr.kv_heads
    return heads * split * rows * (block_d(expr.d) + 2), heads


def scratch(expr: Attention, config: Config, like: Any) -> tuple[Any, Any]:
    """A key split's scratch on `like`'s device (one element each unsplit: never read)."""
    import torch

    elements, counters = scratch_sizes(expr, config)
    return like.new_empty(max(elements, 1), dtype=torch.float32), like.new_zeros(max(counters, 1), dtype=torch.int32)


def launcher(expr: Attention, config: Config, problem: Problem, target: Any = None) -> Callable[..., None]:
    """The candidate bound to one problem: call it with (q, k, v, out[, mask[, cos_q, sin_q, cos_k,
    sin_k]]) to launch once. A split candidate owns its scratch: its launches must not overlap on
    different streams."""
    launch = Launcher(binary(expr, config, problem), grid(expr, config), target)
    owned: list = []  # the key split's scratch, allocated at the first launch (on the operands' device)

    def run(q: Any, k: Any, v: Any, out: Any, mask: Any = None, *tables: Any) -> None:
        if not owned:
            owned.extend(scratch(expr, config, q))
        launch(*pointers(q, k, v, out, mask, *tables), *owned)
    return run
