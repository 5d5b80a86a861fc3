"""The row normalisation a projection may read its input through, fused into the GEMM's prologue:
RMSNorm as Llama, Qwen and Mistral write it, y = g * (x * rsqrt(mean(x², last dim) + eps)), and,
in a plain contraction, LayerNorm as GPT-2 and GPT-NeoX run it, y = (x - mean) / sqrt(var + eps) * g + b.

The kernel never writes y. RMSNorm: because rsqrt(...) is one scalar per row, (x * r * g) @ W equals
r * ((x * g) @ W): the main loop multiplies each input tile by g and sums the squares of the raw
tile beside the product, and the row's scale multiplies the accumulator once, before the bias and
the epilogue. So the row's statistics need the whole of K: a plain contraction with the prologue
is not split along K (the wide and gated kernels are: their split-K fixup adds up the slices'
sums of squares before it scales), and never warp-specialised (its producer warps never see the
input tile).

LayerNorm needs the row's mean before a tile can be normalised. With tensor cores the kernel
first reads its rows once (`_row_stats`: a few rows of at most a few thousand elements, just
written by the previous kernel and still in L2) for their mean and 1/std, then normalises each
input tile in the main loop exactly as the norm would write it (rounded to the input's dtype)
before the product; every statistic is whole before the loop, so this prologue may be split along
K (each slice reads the statistics itself). That pass holds up every program before its first
weight load, which a GEMV's many short programs cannot hide (on an H100 it cost 5 us of a 35 us
LM head), so the GEMV path (fp32 products) takes the statistics in its one pass instead: with d =
x - x[0] per row, LN(x) @ W = rstd * ((d * g) @ W - mean(d) * (g @ W)) + b @ W, the sums of d and
d² and the products g @ W and b @ W gathered beside (d * g) @ W, and the row's first element
keeping the differences small where the mean is large against the spread. That needs the whole
K loop in one program. Neither prologue is warp-specialised.
"""
from __future__ import annotations

import math
from typing import Any

from tritune.kernels.expr import ExprError


def check_norm(norm_eps: Any) -> None:
    """ExprError unless `norm_eps` is None (no norm) or a positive finite epsilon."""
    if norm_eps is None:
        return
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not (
            math.isfinite(norm_eps) and norm_eps > 0):
        raise ExprError(f"norm_eps must be a positive number (the RMSNorm epsilon), got {norm_eps!r}")


def describe(norm_eps: float | None, layer: bool = False) -> str:
    """' rmsnorm' (with a non-default epsilon: ' rmsnorm(1e-05)'), ' layernorm' (its default
    epsilon 1e-05) or ''."""
    if norm_eps is None:
        return ""
    name, default = ("layernorm", 1e-5) if layer else ("rmsnorm", 1e-6)
    return f" {name}" if norm_eps == default else f" {name}({norm_eps:g})"


def tensors(norm_eps: float | None, layer: bool = False) -> int:
    """How many tensors the norm adds to the kernel's arguments: RMSNorm its weight, LayerNorm its
    weight and bias."""
    return 0 if norm_eps is None else 2 if layer else 1


def rms_norm(x: Any, g: Any, eps: float) -> Any:
    """y = g * (x * rsqrt(mean(x², -1) + eps)) as the models compute it: the statistics in fp32
    (float64 inputs stay float64), the normalised rows rounded to x's dtype before the weight."""
    import torch

    wide = x.double() if x.dtype == torch.float64 else x.float()
    return g * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def layer_norm(x: Any, g: Any, b: Any, eps: float) -> Any:
    """F.layer_norm over the last dimension as the models run it: statistics and the affine step
    in fp32 (float64 inputs stay float64), the result rounded to x's dtype."""
    import torch.nn.functional as F

    wide = x if x.dtype.itemsize >= 4 else x.float()
    return F.layer_norm(wide, (x.shape[-1],), g.to(wide.dtype), b.to(wide.dtype), eps).to(x.dtype)


def normed(x: Any, tensors: tuple, norm_eps: float | None, layer: bool = False) -> Any:
    """x read through the norm whose weight (and, LayerNorm, bias) are `tensors`; x without one."""
    if norm_eps is None:
        return x
    return layer_norm(x, *tensors, norm_eps) if layer else rms_norm(x, tensors[0], norm_eps)


# ----- Triton source, empty without a norm (kernels without one are generated as before)

def param(norm_eps: float | None, layer: bool = False) -> str:
    """The main loop's extra parameters: the norm weight's pointer (LayerNorm: and its bias's)."""
    return "" if norm_eps is None else ", G, GB" if layer else ", G"


def init(norm_eps: float | None, indent: str, layer: bool = False, k_last: bool = True) -> str:
    """Before the K loop: the rows' sums of squares (RMSNorm). LayerNorm: in the GEMV path, sums
    of the rows' differences from their first element and the norm weight's and bias's products
    with the weight, all gathered by the main loop; else the rows' mean and 1/std, from a pass
    over A's rows as the main loop reads them (`helpers`)."""
    if norm_eps is None:
        return ""
    if layer:
        lines = ("if GEMV:",
                 "    pivot = _row_pivot(A + batch * stride_ab, pid_m, M, stride_am, BLOCK_M)",
                 "    s1 = tl.zeros((BLOCK_M,), dtype=tl.float32)",
                 "    s2 = tl.zeros((BLOCK_M,), dtype=tl.float32)",
                 f"    g_products = _gemv_zeros(1, BLOCK_N, BLOCK_K, {k_last})",
                 f"    b_products = _gemv_zeros(1, BLOCK_N, BLOCK_K, {k_last})",
                 "else:",
                 "    mean, rstd = _row_stats(A + batch * stride_ab, pid_m, M, K, stride_am, stride_ak, BLOCK_M, BLOCK_K)")
        return "".join(f"{indent}{line}\n" for line in lines)
    return f"{indent}ss = tl.zeros((BLOCK_M,), dtype=tl.float32)\n"


def apply(norm_eps: float | None, var: str, indent: str, layer: bool = False, k_last: bool = True) -> str:
    """In the K loop, after the input tile `var` (k-th step of BLOCK_K) is loaded: RMSNorm adds its
    squares to the sums, then scales its columns by the norm weight. LayerNorm, in the GEMV path,
    adds the tile's differences from the pivot to the sums and the products of the norm's weight
    and bias with the weight tile to theirs, and scales the differences by the norm weight (fp32:
    the GEMV's products are); else it normalises the tile as the norm writes its output. Masked
    past K, where the tile, the weight and the bias are 0."""
    if norm_eps is None:
        return ""
    if layer:
        lines = ("gk_offs = k * BLOCK_K + tl.arange(0, BLOCK_K)",
                 "gk = tl.load(G + gk_offs, mask=gk_offs < K, other=0.0).to(tl.float32)",
                 "bk = tl.load(GB + gk_offs, mask=gk_offs < K, other=0.0).to(tl.float32)",
                 "if GEMV:",
                 f"    d = tl.where(gk_offs[None, :] < K, {var}.to(tl.float32) - pivot[:, None], 0.0)",
                 "    s1 += tl.sum(d, axis=1)",
                 "    s2 += tl.sum(d * d, axis=1)",
                 f"    g_products += _gemv_step(gk[None, :], b, {k_last})",
                 f"    b_products += _gemv_step(bk[None, :], b, {k_last})",
                 f"    {var} = d * gk[None, :]",
                 "else:",
                 f"    {var} = ((({var}.to(tl.float32) - mean[:, None]) * rstd[:, None]) * gk[None, :]"
                 f" + bk[None, :]).to({var}.dtype)")
        return "".join(f"{indent}{line}\n" for line in lines)
    lines = ("gk_offs = k * BLOCK_K + tl.arange(0, BLOCK_K)",
             "gk = tl.load(G + gk_offs, mask=gk_offs < K, other=0.0).to(tl.float32)",
             f"{var}32 = {var}.to(tl.float32)",
             f"ss += tl.sum({var}32 * {var}32, axis=1)",
             f"{var} = ({var}32 * gk[None, :]).to({var}.dtype)")
    return "".join(f"{indent}{line}\n" for line in lines)


def gemv_finish(norm_eps: float | None, indent: str, layer: bool = False, k_last: bool = True) -> str:
    """LayerNorm in the GEMV path, once its products are summed into `acc` (the differences from
    the pivot times the norm weight, times the weight): the rows' statistics, then
    LN(x) @ W = rstd * (acc - (mean - pivot) * (g @ W)) + b @ W. Empty otherwise."""
    if norm_eps is None or not layer:
        return ""
    lines = ("shift = s1 / K",
             f"rstd = tl.rsqrt(tl.maximum(s2 / K - shift * shift, 0.0) + {float(norm_eps)!r})",
             f"acc = rstd[:, None] * (acc - shift[:, None] * _gemv_sum(g_products, {k_last})) + "
             f"_gemv_sum(b_products, {k_last})")
    return "".join(f"{indent}{line}\n" for line in lines)


def returned(norm_eps: float | None, layer: bool = False) -> str:
    """What the main loop returns beside the accumulator (and its callers unpack)."""
    return "" if norm_eps is None or layer else ", ss"


def scale(norm_eps: float | None, accumulators: tuple[str, ...], indent: str, layer: bool = False) -> str:
    """After the K loop: each accumulator times its rows' 1 / RMS (LayerNorm: nothing left to do)."""
    if norm_eps is None or layer:
        return ""
    out = f"{indent}rstd = tl.rsqrt(ss / K + {float(norm_eps)!r})[:, None]\n"
    return out + "".join(f"{indent}{acc} = {acc} * rstd\n" for acc in accumulators)


# LayerNorm's row statistics, in one pass over A's rows: sums of each element's difference from
# its row's first element, so that the variance stays exact where the mean is large against the
# spread (E[x²] - E[x]² would cancel). Rows past M wrap onto valid ones, as the main loop's do.
_ROW_STATS = """

@triton.jit
def _row_pivot(X, pid_m, M, stride_xm, BLOCK_M: tl.constexpr):
    return tl.load(X + ((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M) * stride_xm).to(tl.float32)


@triton.jit
def _row_stats(X, pid_m, M, K, stride_xm, stride_xk, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_k = tl.arange(0, BLOCK_K)
    pivot = _row_pivot(X, pid_m, M, stride_xm, BLOCK_M)
    s1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=2):
        ks = k * BLOCK_K + offs_k
        x = tl.load(X + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=ks[None, :] < K, other=0.0)
        d = tl.where(ks[None, :] < K, x.to(tl.float32) - pivot[:, None], 0.0)
        s1 += tl.sum(d, axis=1)
        s2 += tl.sum(d * d, axis=1)
    shift = s1 / K
    var = tl.maximum(s2 / K - shift * shift, 0.0)
    return pivot + shift, tl.rsqrt(var + EPS)
"""


def helpers(norm_eps: float | None, layer: bool = False) -> str:
    """Triton functions the prologue calls, placed before the main loop: LayerNorm's `_row_pivot`
    and `_row_stats`."""
    return _ROW_STATS.replace("EPS", repr(float(norm_eps))) if norm_eps is not None and layer else ""
