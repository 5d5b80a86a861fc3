"""Triton source of the attention kernel, generated from an Attention expression.

One program per (batch, key/value head) holds all its query rows (at most 64, those of every query
head of its group: one head without grouped-query attention) and walks the keys in blocks of
BLOCK_N with an online softmax: a running row max m and sum l in fp32, the accumulator rescaled by
exp(m_old - m_new) whenever a block raises the max. Scores go through exp2 (the scale folded with
log2(e)). A row whose scores are all -inf so far keeps m at -inf; its exponents are taken against 0
instead (no -inf - -inf), so it stays 0 and ends as 0, as torch's SDPA defines a fully masked row.
Keys past Lk and head-dim lanes past D are masked (D padded to a power of two).

DOT=1 computes both products with tl.dot (rows padded to 16, what an MMA needs); DOT=0 with
broadcast multiplies and sums in fp32 (CUDA cores: one or a few rows waste no MMA rows).

Grouped-query attention (GROUP query heads share one key/value head) runs one program per (batch,
key/value head) over the query rows of all its query heads (tile row r: head r // Lq of the group,
query row r % Lq): k and v are read once for the group, and no repeated copy of them is made.

ROPE_Q / ROPE_K > 0 apply rotary embeddings to the first that many lanes of each q / k row as it is
loaded (x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1) of the two halves of those lanes;
the other lanes pass), the cos and sin tables read at the row's position: the pointwise kernel that
rotates q and k before attention is not needed. With ROPE_ANGLES the tables' pointers are each row's
position and the lanes' frequencies instead, and the kernel computes cos(position·frequency)·ROPE_SCALE
(fp32, rounded to the storage dtype, as transformers builds the tables): no kernel builds them either.

SPLIT > 1 (flash-decoding) splits the keys of each (batch, head) over that many programs, so that
few heads over many keys still fill the GPU: each parks its partial accumulator, max and sum in
fp32 scratch, and the one arriving last (an atomic counter per head) merges them and stores.
"""
from __future__ import annotations

from typing import Any

from tritune.kernels.attention.expr import Attention
from tritune.kernels.codegen import load_source

KERNEL_NAME = "tritune_attention"
# then WS, LOCKS: a key split's scratch
POINTER_NAMES = ("Q", "K", "V", "Out", "Mask", "CosQ", "SinQ", "CosK", "SinK")
SIZE_NAMES = ("H", "LQ", "LK", "D", "GROUP")
# q, k, v and out: batch, head, row, head dim; the mask: batch, head, query row, key; the rotary
# tables of q and of k (cos and sin alike): batch, head, row, lane (ROPE_ANGLES: the positions'
# batch, head and row, and the frequencies' lane)
STRIDE_NAMES = tuple(f"stride_{t}{dim}" for t in "qkvo" for dim in "bhnd") + tuple(
    f"stride_m{dim}" for dim in "bhqk") + tuple(f"stride_r{t}{dim}" for t in "qk" for dim in "bhnd")

_SOURCE = '''\
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _tile(ptrs, ok, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=ok, other=0.0)


@triton.jit
def _sincos(x):
    # sin and cos of fp32 angles, within 1e-7 of float64's up to |x| ~ 4096 (1e-6 at 1e5): x reduced
    # to [-pi/4, pi/4] by its quadrant k (pi/2 in three parts, the first two short enough that their
    # products with k are exact), then Taylor polynomials, swapped and negated by k mod 4. The
    # library's sin and cos (exact for any argument) made a decode site's kernel 2.8 us slower.
    k = tl.floor(x * 0.6366197723675814 + 0.5)
    r = ((x - k * 1.5703125) - k * 0.0004837512969970703) - k * 7.549790126404332e-08
    r2 = r * r
    s = r + r * r2 * (-0.16666666666666666 + r2 * (0.008333333333333333 + r2 * (-0.0001984126984126984
                                                                                  + r2 * 2.7557319223985893e-06)))
    c = 1.0 + r2 * (-0.5 + r2 * (0.041666666666666664 + r2 * (-0.001388888888888889 + r2 * (
        2.48015873015873e-05 - r2 * 2.755731922398589e-07))))
    quadrant = k.to(tl.int32) & 3
    sin = tl.where(quadrant == 0, s, tl.where(quadrant == 1, c, tl.where(quadrant == 2, -s, -c)))
    cos = tl.where(quadrant == 0, c, tl.where(quadrant == 1, -s, tl.where(quadrant == 2, -c, s)))
    return sin, cos


@triton.jit
def _rotary(rows, x, cos, sin, at, first, cols, stride_d, stride_rd, ok, ROT: tl.constexpr, ANGLES: tl.constexpr,
            ROPE_SCALE: tl.constexpr, PER_ROW: tl.constexpr):
    # x's first ROT lanes rotated: x·cos + rotate_half(x)·sin, where rotate_half negates the second
    # half and swaps the halves; `rows` points at each row's lane 0, `at` is each row's offset in the
    # tables `cos` and `sin` (ANGLES: in the positions `cos`; `sin` holds the frequencies; `first` is
    # the tile's offset where every row has the same position, PER_ROW=0), `ok` masks the tile
    half: tl.constexpr = ROT // 2
    rot = cols < ROT
    lanes = ok & rot[None, :]
    partner = tl.load(rows + tl.where(cols < half, cols + half, cols - half)[None, :] * stride_d, mask=lanes,
                      other=0.0).to(tl.float32)
    if ANGLES:
        f = tl.load(sin + (cols % half) * stride_rd, mask=rot, other=0.0).to(tl.float32)
        if PER_ROW:
            angle = tl.load(cos + at + 0 * cols[None, :], mask=lanes, other=0).to(tl.float32) * f[None, :]
        else:  # one row of angles for the whole tile: cos and sin once per lane, not once per element
            angle = (tl.load(cos + first).to(tl.float32) * f)[None, :]
        s, c = _sincos(angle)
        c = (c * ROPE_SCALE).to(x.dtype).to(tl.float32)
        s = (s * ROPE_SCALE).to(x.dtype).to(tl.float32)
    else:
        c = tl.load(cos + at + cols[None, :] * stride_rd, mask=lanes, other=0.0).to(tl.float32)
        s = tl.load(sin + at + cols[None, :] * stride_rd, mask=lanes, other=0.0).to(tl.float32)
    turned = tl.where((cols < half)[None, :], -partner, partner)
    return tl.where(rot[None, :], x.to(tl.float32) * c + turned * s, x.to(tl.float32)).to(x.dtype)


@triton.jit
def _rescale(m_i, m_new):
    # exp2(m_i - m_new) and the exponent base of a new block: rows with no key yet (m at -inf)
    # take 0 instead, so their exponentials stay 0 (no -inf - -inf)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return tl.math.exp2(m_i - m_safe), m_safe


@triton.jit
def _merge(acc, m_i, l_i, WS, LOCKS, slot, split, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
           SPLIT: tl.constexpr):
    # Each key split parks its unnormalised accumulator, row max and row sum; the split that arrives
    # last merges them all (rescaled to the largest max), then re-arms the counter for the next launch.
    part: tl.constexpr = BLOCK_M * BLOCK_D + 2 * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    offs = rows[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    base = WS + slot.to(tl.int64) * (SPLIT * part)
    tl.store(base + split * part + offs, acc)
    tl.store(base + split * part + BLOCK_M * BLOCK_D + rows, m_i)
    tl.store(base + split * part + BLOCK_M * BLOCK_D + BLOCK_M + rows, l_i)
    tl.debug_barrier()  # every thread's part is stored before the counter says so
    last = tl.atomic_add(LOCKS + slot, 1, sem="acq_rel") == SPLIT - 1
    if last:
        tl.debug_barrier()
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for s in tl.static_range(SPLIT):
            m_s = tl.load(base + s * part + BLOCK_M * BLOCK_D + rows, cache_modifier=".cg")
            m_new = tl.maximum(m_i, m_s)
            alpha, m_safe = _rescale(m_i, m_new)
            beta = tl.math.exp2(m_s - m_safe)
            l_i = l_i * alpha + tl.load(base + s * part + BLOCK_M * BLOCK_D + BLOCK_M + rows,
                                        cache_modifier=".cg") * beta
            acc = acc * alpha[:, None] + tl.load(base + s * part + offs, cache_modifier=".cg") * beta[:, None]
            m_i = m_new
        tl.store(LOCKS + slot, 0)
    return acc, l_i, last


@triton.jit
def {name}(
    Q, K, V, Out, Mask, CosQ, SinQ, CosK, SinK, WS, LOCKS,
    {sizes},
{strides}
    SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, ROPE_Q: tl.constexpr, ROPE_K: tl.constexpr,
    ROPE_ANGLES: tl.constexpr, ROPE_SCALE: tl.constexpr, ROPE_ROWS: tl.constexpr,
):
    # {description}
    pid = tl.program_id(0)
    HK = H // GROUP  # key/value heads: one program each (and key split)
    off_b = (pid // HK).to(tl.int64)  # 64-bit batch offsets: B x H x L x D may pass 2**31 elements
    off_h = pid % HK
    rows = tl.arange(0, BLOCK_M)
    q_h = off_h * GROUP + rows // LQ  # each tile row's query head and its row in that head
    q_i = rows % LQ
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < GROUP * LQ
    col_ok = cols < D
    q_ok = row_ok[:, None] & col_ok[None, :]
    q_rows = Q + (off_b * stride_qb + q_h * stride_qh + q_i * stride_qn)[:, None]
    q = tl.load(q_rows + cols[None, :] * stride_qd, mask=q_ok, other=0.0)
    if ROPE_Q:
        r_q = (off_b * stride_rqb + q_h * stride_rqh + q_i * stride_rqn)[:, None]
        q = _rotary(q_rows, q, CosQ, SinQ, r_q, off_b * stride_rqb, cols, stride_qd, stride_rqd, q_ok, ROPE_Q,
                    ROPE_ANGLES, ROPE_SCALE, ROPE_ROWS)
    if not DOT:
        q = q.to(tl.float32) * (SCALE * LOG2E)
    k_rows = K + off_b * stride_kb + off_h * stride_kh
    k_base = k_rows + cols[None, :] * stride_kd
    v_base = V + off_b * stride_vb + off_h * stride_vh + cols[None, :] * stride_vd
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi = 0, LK
    if SPLIT > 1:  # this program's share of the keys: whole blocks, the last split's ending at Lk
        per = tl.cdiv(tl.cdiv(LK, SPLIT), BLOCK_N) * BLOCK_N
        lo = tl.program_id(1) * per
        hi = tl.minimum(lo + per, LK)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < LK
        tile_ok = key_ok[:, None] & col_ok[None, :]
        # every load of the block first: one round trip to memory, not one per use
        k = _tile(k_base + keys[:, None] * stride_kn, tile_ok, EVEN_N and EVEN_D)
        v = _tile(v_base + keys[:, None] * stride_vn, tile_ok, EVEN_N and EVEN_D)
        if MASK:  # (a launch without a mask passes None for it: no pointer arithmetic on it)
            m_ptrs = (Mask + (off_b * stride_mb + q_h * stride_mh + q_i * stride_mq)[:, None]
                      + keys[None, :] * stride_mk)
            mk = tl.load(m_ptrs, mask=row_ok[:, None] & key_ok[None, :], other=0)
        if ROPE_K:
            r_k = (off_b * stride_rkb + off_h * stride_rkh + keys * stride_rkn)[:, None]
            k = _rotary(k_rows + keys[:, None] * stride_kn, k, CosK, SinK, r_k, off_b * stride_rkb, cols, stride_kd,
                        stride_rkd, tile_ok, ROPE_K, ROPE_ANGLES, ROPE_SCALE, ROPE_ROWS)
        if DOT:
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (SCALE * LOG2E)
        else:
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], 2)
        if MASK == 1:  # additive
            s += mk.to(tl.float32) * LOG2E
        elif MASK == 2:  # boolean: False leaves the key out
            s = tl.where(mk != 0, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= q_i[:, None], s, float("-inf"))
        if not EVEN_N:
            s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha, m_safe = _rescale(m_i, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], 1)
        m_i = m_new
    last = True
    if SPLIT > 1:
        acc, l_i, last = _merge(acc, m_i, l_i, WS, LOCKS, pid, tl.program_id(1), BLOCK_M, BLOCK_D, SPLIT)
    if last:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a fully masked row: 0
        o_ptrs = Out + (off_b * stride_ob + q_h * stride_oh + q_i * stride_on)[:, None] + cols[None, :] * stride_od
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=q_ok)
'''


def int_names() -> tuple[str, ...]:
    """The kernel's integer parameters, in order: sizes, then each operand's four strides."""
    return SIZE_NAMES + STRIDE_NAMES


def source(expr: Attention, specialize: bool = False) -> str:
    """The Triton source of the kernel computing `expr`; `specialize`: its sizes and strides are
    constexprs (one binary per shape, launched with pointers only: what a compiled model replays)."""
    kind = ": tl.constexpr" if specialize else ""
    strides = "\n".join("    " + " ".join(f"{n}{kind}," for n in STRIDE_NAMES[i:i + 4])
                        for i in range(0, len(STRIDE_NAMES), 4))
    return _SOURCE.format(name=KERNEL_NAME, description=expr.describe(),
                          sizes=" ".join(f"{n}{kind}," for n in SIZE_NAMES)[:-1], strides=strides)


def load(expr: Attention, specialize: bool = False) -> Any:
    """The @triton.jit function of the generated source for `expr` (see `source`)."""
    return load_source(source(expr, specialize), KERNEL_NAME)
