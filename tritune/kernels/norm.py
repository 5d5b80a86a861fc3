"""The row normalisation a projection may read its input through, fused into the GEMM's prologue:
RMSNorm as Llama, Qwen and Mistral write it, y = g * (x * rsqrt(mean(x², last dim) + eps)), and,
in a plain contraction, LayerNorm as GPT-2 and GPT-NeoX run it, y = (x - mean) / sqrt(var + eps) * g + b.

The kernel never writes y. RMSNorm: because rsqrt(...) is one scalar per row, (x * r * g) @ W equals
r * ((x * g) @ W): the main loop multiplies each input tile by g and sums the squares of the raw
tile beside the product, and the row's scale multiplies the accumulator once, before the bias and
the epilogue. With 16-bit inputs in tiles of at most MMA_SQUARES_MAX_ROWS rows on the tensor cores,
the squares are summed by the tensor cores too, as the diagonal of x @ xᵀ (the products of 16-bit
values are exact in the fp32 accumulator, so the sums are the same as the fp32 sums of squares):
a reduction across the tile would hold it in a layout of its own, converted back for the MMA at
every step, which at 16 rows cost up to a third of the kernel's time. So the row's statistics need the whole of K: a plain contraction with the prologue
is not split along K (the wide and gated kernels are: their split-K fixup adds up the slices'
sums of squares before it scales), and never warp-specialised (its producer warps never see the
input tile).

LayerNorm: the row's mean is needed before any tile can be normalised, so the kernel first reads
its rows once (`_row_stats`: a few rows of at most a few thousand elements, just written by the
previous kernel and still in L2) for their mean and 1/std, then normalises each input tile in the
main loop exactly as the norm would write it (rounded to the input's dtype) before the product.
Every statistic is whole before the loop, so a LayerNorm prologue may be split along K (each
slice reads the rows' statistics itself); neither prologue is warp-specialised.
"""
from __future__ import annotations

import math
from typing import Any

from tritune.kernels.expr import ExprError

# Tiles of at most this many rows sum their rows' squares on the tensor cores (a BLOCK_M x BLOCK_M
# fp32 accumulator beside the tile's: 8 registers a thread at 32 rows on 4 warps); taller tiles
# (prefill, never decode) and GEMV steps reduce across the tile.
MMA_SQUARES_MAX_ROWS = 32


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


def init(norm_eps: float | None, indent: str, layer: bool = False) -> str:
    """Before the K loop: the rows' sums of squares (RMSNorm), or their mean and 1/std (LayerNorm,
    from A's rows as the main loop reads them: `helpers`)."""
    if norm_eps is None:
        return ""
    if layer:
        return (f"{indent}mean, rstd = _row_stats(A + batch * stride_ab, pid_m, M, K, stride_am, stride_ak, "
                f"BLOCK_M, BLOCK_K)\n")
    return (f"{indent}ss = tl.zeros((BLOCK_M,), dtype=tl.float32)\n"
            f"{indent}sq = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)\n")


def apply(norm_eps: float | None, var: str, indent: str, layer: bool = False) -> str:
    """In the K loop, after the input tile `var` (k-th step of BLOCK_K) is loaded: RMSNorm adds its
    squares to the sums, then scales its columns by the norm weight; LayerNorm normalises it as the
    norm writes its output (masked past K, where the tile, the weight and the bias are 0)."""
    if norm_eps is None:
        return ""
    if layer:
        lines = ("gk_offs = k * BLOCK_K + tl.arange(0, BLOCK_K)",
                 "gk = tl.load(G + gk_offs, mask=gk_offs < K, other=0.0).to(tl.float32)",
                 "bk = tl.load(GB + gk_offs, mask=gk_offs < K, other=0.0).to(tl.float32)",
                 f"{var} = ((({var}.to(tl.float32) - mean[:, None]) * rstd[:, None]) * gk[None, :]"
                 f" + bk[None, :]).to({var}.dtype)")
        return "".join(f"{indent}{line}\n" for line in lines)
    lines = ("gk_offs = k * BLOCK_K + tl.arange(0, BLOCK_K)",
             "gk = tl.load(G + gk_offs, mask=gk_offs < K, other=0.0).to(tl.float32)",
             f"if GEMV or BLOCK_M > {MMA_SQUARES_MAX_ROWS} or {var}.dtype.primitive_bitwidth > 16:",
             f"    {var}32 = {var}.to(tl.float32)",
             f"    ss += tl.sum({var}32 * {var}32, axis=1)",
             "else:  # on the tensor cores: the diagonal of x @ x^T (`done`)",
             f"    sq = tl.dot({var}, tl.trans({var}), sq)",
             f"{var} = ({var}.to(tl.float32) * gk[None, :]).to({var}.dtype)")
    return "".join(f"{indent}{line}\n" for line in lines)


def done(norm_eps: float | None, indent: str, layer: bool = False) -> str:
    """After the K loop: the rows' sums of squares that the tensor cores summed (`apply`) added to
    `ss` (zeros where the loop reduced across its tiles instead)."""
    if norm_eps is None or layer:
        return ""
    return f"{indent}ss += _diagonal(sq, BLOCK_M)\n"


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
def _row_stats(X, pid_m, M, K, stride_xm, stride_xk, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_k = tl.arange(0, BLOCK_K)
    pivot = tl.load(X + rows * stride_xm).to(tl.float32)
    s1 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=4):
        ks = k * BLOCK_K + offs_k
        x = tl.load(X + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=ks[None, :] < K, other=0.0)
        d = tl.where(ks[None, :] < K, x.to(tl.float32) - pivot[:, None], 0.0)
        s1 += tl.sum(d, axis=1)
        s2 += tl.sum(d * d, axis=1)
    shift = s1 / K
    var = tl.maximum(s2 / K - shift * shift, 0.0)
    return pivot + shift, tl.rsqrt(var + EPS)
"""


_DIAGONAL = """

@triton.jit
def _diagonal(sq, BLOCK_M: tl.constexpr):
    eye = tl.arange(0, BLOCK_M)[:, None] == tl.arange(0, BLOCK_M)[None, :]
    return tl.sum(tl.where(eye, sq, 0.0), axis=1)
"""


def helpers(norm_eps: float | None, layer: bool = False) -> str:
    """Triton functions the prologue calls, placed before the main loop: LayerNorm's `_row_stats`,
    RMSNorm's `_diagonal` (of the tensor cores' x @ x^T)."""
    if norm_eps is None:
        return ""
    return _ROW_STATS.replace("EPS", repr(float(norm_eps))) if layer else _DIAGONAL
