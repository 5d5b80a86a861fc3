"""Triton source of the gated dual GEMM, generated from a Gated expression.

Each program computes one [BLOCK_M, BLOCK_N] tile of both products from one walk over K: every
step loads the x tile once and the W1 and W2 tiles beside it, with pointer loads or (TMA=1)
tensor descriptors, which fetch whole tiles through the TMA unit (zero-filled past the edges).
FUSE=0 feeds two accumulators with two MMAs; FUSE=1 joins the two weight tiles into one [BLOCK_K, 2*BLOCK_N] tile (columns
interleaved: g0 u0 g1 u1 ...) and issues one MMA twice as wide, split again after the loop;
GEMV=1 (a few rows) multiplies without tensor cores, both products summed in fp32 registers. The
bias, the activation and the product run on the fp32 tiles before the one store. SPLIT_K > 1
splits the K loop over that many programs per tile; the last to arrive adds the others' partial
tiles (and, with a row norm, their rows' sums of squares) and finishes the tile.
"""
from __future__ import annotations

from typing import Any

from tritune.kernels import norm
from tritune.kernels.codegen import Emitter, load_source
from tritune.kernels.contraction.template import PDL_WAIT, PRELUDE
from tritune.kernels.weights import weight_descriptor
from tritune.kernels.gated.expr import Gated

KERNEL_NAME = "tritune_gated"
# the kernel's integer parameters: sizes, then the strides of x, the weights (as [K, N]), out, the biases
INT_NAMES = ("M", "N", "K", "stride_xm", "stride_xk", "stride_wk", "stride_wn", "stride_cm", "stride_cn", "stride_b")

_TEMPLATE = PRELUDE + '''{norm_helpers}

@triton.jit
def _split_fixup_pair(g, u, WS, LOCKS, slot, split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLIT_K: tl.constexpr{fixup_ss_param}):
    # Each K slice parks its fp32 partial tiles of both products{fixup_ss_doc}; the slice that arrives
    # last adds the others in and finishes the tile, then re-arms the tile's counter for the next launch.
    tile_elems: tl.constexpr = BLOCK_M * BLOCK_N
    part: tl.constexpr = 2 * tile_elems + BLOCK_M  # one slice's tiles (and rows' sums of squares)
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    rows = tl.arange(0, BLOCK_M)
    base = WS + slot.to(tl.int64) * (SPLIT_K * part)
    tl.store(base + split * part + offs, g)
    tl.store(base + split * part + tile_elems + offs, u)
{fixup_ss_store}    tl.debug_barrier()  # every thread's partials are stored before the counter says so
    arrived = tl.atomic_add(LOCKS + slot, 1, sem="acq_rel")
    last = arrived == SPLIT_K - 1
    if last:
        tl.debug_barrier()
        for s in tl.static_range(SPLIT_K):
            if s != split:
                g += tl.load(base + s * part + offs, cache_modifier=".cg")
                u += tl.load(base + s * part + tile_elems + offs, cache_modifier=".cg")
{fixup_ss_add}        tl.store(LOCKS + slot, 0)
    return g, u{fixup_ss_ret}, last


@triton.jit
def {name}(
    X, W1, W2, C, B1, B2,{norm_pointer} WS, LOCKS,
{int_params}
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UNROLL: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, FUSE: tl.constexpr,
    TMA: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr, PDL_K: tl.constexpr, GEMV: tl.constexpr,
):
    # {description}
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # split-K: this program walks K slice `split`; the slice arriving last finishes the tile
    split = tl.program_id(2)
    k_iters = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_iters, SPLIT_K)
    k_lo = split * per_split
    k_first = k_lo * BLOCK_K + offs_k
    if PDL == 2:
        _prefetch_weights(W1, pid_n, k_lo, N, K, stride_wk, stride_wn, BLOCK_N, BLOCK_K, PDL_K, {trans_b})
        _prefetch_weights(W2, pid_n, k_lo, N, K, stride_wk, stride_wn, BLOCK_N, BLOCK_K, PDL_K, {trans_b})
{pdl_wait}{bias_loads}    # rows/columns past the edge wrap onto valid ones, so the K loop needs no M/N masks; the
    # store is masked, so the duplicates are never written
    x_ptrs = X + (offs_m % M)[:, None] * stride_xm + k_first[None, :] * stride_xk
    w_offs = k_first[:, None] * stride_wk + (offs_n % N)[None, :] * stride_wn
    if TMA:
        # x row-major; the weights as stored ([N, K] tiles flipped after the load, or [K, N])
        x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
{w_descs}
    if FUSE:
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    elif GEMV:  # without tensor cores: both products in fp32 registers, summed along K after the loop
        g3 = _gemv_zeros(BLOCK_M, BLOCK_N, BLOCK_K, {trans_b})
        u3 = _gemv_zeros(BLOCK_M, BLOCK_N, BLOCK_K, {trans_b})
    else:
        g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{norm_init}    # a GEMV's loop names its num_stages (the GEMV constexpr), else Triton never pipelines it (no tl.dot)
    for k in tl.range(k_lo, tl.minimum(k_lo + per_split, k_iters), loop_unroll_factor=UNROLL,
                      num_stages=GEMV if GEMV else None):
        if TMA:
            x = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
{w_loads}
        elif EVEN_K:
            x = tl.load(x_ptrs)
            w1 = tl.load(W1 + w_offs)
            w2 = tl.load(W2 + w_offs)
        else:
            left = K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=offs_k[None, :] < left, other=0.0)
            w1 = tl.load(W1 + w_offs, mask=offs_k[:, None] < left, other=0.0)
            w2 = tl.load(W2 + w_offs, mask=offs_k[:, None] < left, other=0.0)
{norm_apply}        if FUSE:
            w = tl.reshape(tl.join(w1, w2), (BLOCK_K, 2 * BLOCK_N))
            acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        elif GEMV:
            g3 += _gemv_step(x, w1, {trans_b})
            u3 += _gemv_step(x, w2, {trans_b})
        else:
            g = tl.dot(x, w1, g, input_precision=DOT_PRECISION)
            u = tl.dot(x, w2, u, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_offs += BLOCK_K * stride_wk
    if FUSE:
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    elif GEMV:
        g, u = _gemv_sum(g3, {trans_b}), _gemv_sum(u3, {trans_b})
{norm_done}    if SPLIT_K > 1:
        g, u{fixup_ss_ret}, last = _split_fixup_pair(g, u, WS, LOCKS, tl.program_id(0), split, BLOCK_M, BLOCK_N,
                                       SPLIT_K{fixup_ss_arg})
    else:
        last = True
    if last:
{norm_scale}{bias}{activation}
        c_ptrs = C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, (g * u).to(C.dtype.element_ty), mask=mask)
'''

# the biases are loaded before the K loop, so that their latency hides behind it rather than
# following its last step; they are converted where they are used (a conversion next to the
# load would wait for it there)
_BIAS_LOADS = ("    b1 = tl.load(B1 + offs_n * stride_b, mask=offs_n < N, other=0.0)\n"
               "    b2 = tl.load(B2 + offs_n * stride_b, mask=offs_n < N, other=0.0)\n")
_BIAS = ("        g += b1.to(tl.float32)[None, :]\n"
         "        u += b2.to(tl.float32)[None, :]\n")


# Loads of the weight tiles through their descriptors: [N, K] tiles flipped, or [K, N]
_W_LOAD = {True: "            w{i} = w{i}_desc.load([pid_n * BLOCK_N, k * BLOCK_K]).T",
           False: "            w{i} = w{i}_desc.load([k * BLOCK_K, pid_n * BLOCK_N])"}


def source(expr: Gated, specialize: bool = False) -> str:
    """The Triton source of the kernel computing `expr`; `specialize`: its sizes and strides are
    constexprs (one binary per shape, launched with pointers only: what a compiled model replays)."""
    emit = Emitter()
    emit.run((expr.act,), "g")
    kind = ": tl.constexpr" if specialize else ""
    w_descs = "\n".join("        " + weight_descriptor(expr.trans_b, f"W{i}", f"w{i}_desc") for i in (1, 2))
    w_loads = "\n".join(_W_LOAD[expr.trans_b].format(i=i) for i in (1, 2))
    return _TEMPLATE.format(name=KERNEL_NAME, description=expr.describe(), bias=_BIAS if expr.bias else "",
                            bias_loads=_BIAS_LOADS if expr.bias else "",
                            w_descs=w_descs, w_loads=w_loads, pdl_wait=PDL_WAIT, trans_b=expr.trans_b,
                            int_params="    " + " ".join(f"{n}{kind}," for n in INT_NAMES),
                            activation="".join(f"        {line}\n" for line in emit.lines),
                            norm_pointer="" if expr.norm_eps is None else " G,",
                            norm_init=norm.init(expr.norm_eps, "    "), norm_apply=norm.apply(expr.norm_eps, "x", " " * 8),
                            norm_done=norm.done(expr.norm_eps, "    "), norm_helpers=norm.helpers(expr.norm_eps),
                            norm_scale=norm.scale(expr.norm_eps, ("g", "u"), " " * 8), **_fixup(expr.norm_eps))


def _fixup(norm_eps: float | None) -> dict[str, str]:
    """The split-K fixup's parts for the rows' sums of squares of a row norm (empty without one)."""
    if norm_eps is None:
        return dict.fromkeys(("fixup_ss_param", "fixup_ss_doc", "fixup_ss_store", "fixup_ss_add", "fixup_ss_ret",
                              "fixup_ss_arg"), "")
    return {"fixup_ss_param": ", ss", "fixup_ss_doc": " and its rows' partial sums of squares",
            "fixup_ss_store": "    tl.store(base + split * part + 2 * tile_elems + rows, ss)\n",
            "fixup_ss_add": " " * 16 + "ss += tl.load(base + s * part + 2 * tile_elems + rows, cache_modifier=\".cg\")\n",
            "fixup_ss_ret": ", ss", "fixup_ss_arg": ", ss"}


def load(expr: Gated, specialize: bool = False) -> Any:
    """The @triton.jit function of the generated source for `expr` (see `source`)."""
    return load_source(source(expr, specialize), KERNEL_NAME)
