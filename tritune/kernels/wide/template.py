"""Triton source of the wide GEMM, generated from a Wide expression.

The grid covers M tiles x (tiles of N_1 + tiles of N_2 [+ tiles of N_3]) in the grouped order of
every GEMM here; a program finds its weight from its N-tile index by an if/elif chain over the
segments' tile boundaries (constexprs), so no tile straddles two weights. The chain picks that
segment's weight, output, bias, width and strides; one tile of that product follows, by the
contraction template's own main loop (plain, GEMV=1 without tensor cores, or TMA=1 with
tensor-descriptor loads) and epilogue (its bias only). SPLIT_K > 1 splits each tile's K loop over
that many programs, finished by the contraction template's in-kernel fixup; with a row norm the
slices' sums of squares are added up there too, before the rows are scaled (decode's q/k/v: few
tiles, so the K slices fill the GPU).
"""
from __future__ import annotations

from typing import Any

from tritune.kernels import norm
from tritune.kernels.codegen import load_source
from tritune.kernels.contraction import template as contraction
from tritune.kernels.weights import weight_descriptor
from tritune.kernels.wide.expr import Wide

KERNEL_NAME = "tritune_wide"
SHARED_INTS = ("M", "K", "stride_xm", "stride_xk")
# per segment: its width, its weight's strides (as [K, N]), its output's, its bias's
SEGMENT_INTS = ("N{i}", "stride_w{i}k", "stride_w{i}n", "stride_c{i}m", "stride_c{i}n", "stride_b{i}")

_KERNEL = '''

@triton.jit
def _split_fixup_rows(acc, ss, WS, LOCKS, slot, split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLIT_K: tl.constexpr):
    # _split_fixup with a row norm: each K slice also parks its rows' partial sums of squares
    # (after every slot's tiles), and the last one adds both up before the rows are scaled
    tile_elems: tl.constexpr = BLOCK_M * BLOCK_N
    rows = tl.arange(0, BLOCK_M)
    base = WS + tl.num_programs(0).to(tl.int64) * (SPLIT_K * tile_elems) + slot.to(tl.int64) * (SPLIT_K * BLOCK_M)
    tl.store(base + split * BLOCK_M + rows, ss)
    acc, last = _split_fixup(acc, WS, LOCKS, slot, split, BLOCK_M, BLOCK_N, SPLIT_K)
    if last:
        for s in tl.static_range(SPLIT_K):
            if s != split:
                ss += tl.load(base + s * BLOCK_M + rows, cache_modifier=".cg")
    return acc, ss, last


@triton.jit
def {name}(
    X, {pointers}, WS, LOCKS,
{int_params}
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UNROLL: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
    SPLIT_K: tl.constexpr, PDL: tl.constexpr, PDL_K: tl.constexpr, GEMV: tl.constexpr, {ends},
):
    # {description}
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), END{last}, GROUP_M)
    # the chain picks the segment's operands only: one main loop after it, not one per branch
    # (Triton gives every inlined loop its own pipeline buffers: three loops, three times the
    # shared memory)
{branches}    # split-K: K slice `split` of the tile; the slice arriving last finishes it (_split_fixup)
    split = tl.program_id(2)
    k_iters = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_iters, SPLIT_K)
    k_lo = split * per_split
    if PDL == 2:
        _prefetch_weights(W, pid_n, k_lo, N, K, stride_wk, stride_wn, BLOCK_N, BLOCK_K, PDL_K, {trans_b})
{pdl_wait}    if TMA:
        # tensor descriptors over x and the segment's weight: whole tiles, zero-filled past the edges
        x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
        {w_desc}
    else:
        x_desc, w_desc = X, W  # stand-ins, never read without TMA
{early}    acc{norm_returned} = _mainloop(X, W, x_desc, w_desc, 0, pid_m, pid_n, k_lo, tl.minimum(k_lo + per_split, k_iters), M,
                    N, K, 0, stride_xm, stride_xk, 0, stride_wk, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, UNROLL, EVEN_K,
                    DOT_PRECISION, TMA, 0, GEMV{norm_arg})
{late}    if SPLIT_K > 1:
        acc, {fixup_out} = {fixup_call}
        if last:
{norm_scale_split}            _finish(acc, C, 0, pid_m, pid_n, M, N, 0, stride_cm, stride_cn,{finish_args} BLOCK_M, BLOCK_N, 0)
    else:
{norm_scale}        _finish(acc, C, 0, pid_m, pid_n, M, N, 0, stride_cm, stride_cn,{finish_args} BLOCK_M, BLOCK_N, 0)
'''

_BRANCH = '''\
    {keyword}:
        W, C, B, N = W{i}, C{i}, B{i}, N{i}
        stride_wk, stride_wn, stride_b = stride_w{i}k, stride_w{i}n, stride_b{i}
        stride_cm, stride_cn = stride_c{i}m, stride_c{i}n
{shift}'''


def int_names(expr: Wide) -> tuple[str, ...]:
    """The kernel's integer parameters: the shared sizes and x's strides, then each segment's."""
    return SHARED_INTS + tuple(name.format(i=i) for i in range(len(expr.ns)) for name in SEGMENT_INTS)


def pointer_names(expr: Wide) -> tuple[str, ...]:
    """The kernel's pointers after X: the weights, the outputs, the biases (then a row norm's weight;
    then split-K's scratch, WS and LOCKS, which are not the expression's operands)."""
    return tuple(f"{kind}{i}" for kind in "WCB" for i in range(len(expr.ns))) + (("G",) if expr.norm_eps else ())


def _branches(count: int) -> str:
    out = ""
    for i in range(count):
        keyword = "else" if i == count - 1 else "if pid_n < END0" if i == 0 else f"elif pid_n < END{i}"
        out += _BRANCH.format(keyword=keyword, i=i, shift=f"        pid_n -= END{i - 1}\n" if i else "")
    return out


def source(expr: Wide, specialize: bool = False) -> str:
    """The Triton source of the kernel computing `expr`; `specialize`: its sizes and strides are
    constexprs (one binary per shape, launched with pointers only: what a compiled model replays)."""
    kind = ": tl.constexpr" if specialize else ""
    names = int_names(expr)
    groups = (names[:len(SHARED_INTS)], *(names[j:j + len(SEGMENT_INTS)]
                                          for j in range(len(SHARED_INTS), len(names), len(SEGMENT_INTS))))
    count = len(expr.ns)
    # the segment's bias, loaded before or after the K loop by the tile's size (the contraction
    # template's _epilogue_loads)
    early, late, finish_args = contraction.early_loads(expr.as_matmul(), "    ", "B, 0", "stride_b", warp_spec=False)
    # the contraction template's module brings _tile_of, _mainloop and _finish (the bias only:
    # the Matmul has no other epilogue); its own kernel stays unused
    return contraction.source(expr.as_matmul()) + _KERNEL.format(
        name=KERNEL_NAME, description=expr.describe(), pointers=", ".join(pointer_names(expr)),
        int_params="\n".join("    " + " ".join(f"{n}{kind}," for n in group) for group in groups),
        ends=", ".join(f"END{i}: tl.constexpr" for i in range(count)), last=count - 1,
        branches=_branches(count), early=early, late=late, finish_args=finish_args, w_desc=weight_descriptor(expr.trans_b, "W", "w_desc"),
        norm_returned=norm.returned(expr.norm_eps), norm_arg=norm.param(expr.norm_eps),
        norm_scale=norm.scale(expr.norm_eps, ("acc",), " " * 8),
        norm_scale_split=norm.scale(expr.norm_eps, ("acc",), " " * 12), pdl_wait=contraction.PDL_WAIT, trans_b=expr.trans_b,
        **_fixup(expr.norm_eps))


def _fixup(norm_eps: float | None) -> dict[str, str]:
    """The split-K fixup's call: with a row norm, the partial sums of squares are added up too."""
    if norm_eps is None:
        return {"fixup_out": "last", "fixup_call": "_split_fixup(acc, WS, LOCKS, tl.program_id(0), split, BLOCK_M, BLOCK_N, "
                "SPLIT_K)"}
    return {"fixup_out": "ss, last", "fixup_call": "_split_fixup_rows(acc, ss, WS, LOCKS, tl.program_id(0), split, BLOCK_M, "
            "BLOCK_N, SPLIT_K)"}


def load(expr: Wide, specialize: bool = False) -> Any:
    """The @triton.jit function of the generated source for `expr` (see `source`)."""
    return load_source(source(expr, specialize), KERNEL_NAME)
