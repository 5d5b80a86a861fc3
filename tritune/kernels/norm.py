"""The row normalisation a projection may read its input through: RMSNorm as Llama, Qwen and
Mistral write it, y = g * (x * rsqrt(mean(x², last dim) + eps)), fused into the GEMM's prologue.

The kernel never writes y. Because rsqrt(...) is one scalar per row, (x * r * g) @ W equals
r * ((x * g) @ W): the main loop multiplies each input tile by g and sums the squares of the raw
tile beside the product, and the row's scale multiplies the accumulator once, before the bias and
the epilogue. So the row's statistics need the whole of K: a plain contraction with the prologue
is not split along K (the wide and gated kernels are: their split-K fixup adds up the slices'
sums of squares before it scales), and never warp-specialised (its producer warps never see the
input tile).
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


def describe(norm_eps: float | None) -> str:
    """' rmsnorm' (with a non-default epsilon: ' rmsnorm(1e-05)') or ''."""
    if norm_eps is None:
        return ""
    return " rmsnorm" if norm_eps == 1e-6 else f" rmsnorm({norm_eps:g})"


def rms_norm(x: Any, g: Any, eps: float) -> Any:
    """y = g * (x * rsqrt(mean(x², -1) + eps)) as the models compute it: the statistics in fp32
    (float64 inputs stay float64), the normalised rows rounded to x's dtype before the weight."""
    import torch

    wide = x.double() if x.dtype == torch.float64 else x.float()
    return g * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# ----- Triton source, empty without a norm (kernels without one are generated as before)

def param(norm_eps: float | None) -> str:
    """The main loop's extra parameter: the norm weight's pointer."""
    return "" if norm_eps is None else ", G"


def init(norm_eps: float | None, indent: str) -> str:
    """Before the K loop: the rows' sums of squares."""
    return "" if norm_eps is None else f"{indent}ss = tl.zeros((BLOCK_M,), dtype=tl.float32)\n"


def apply(norm_eps: float | None, var: str, indent: str) -> str:
    """In the K loop, after the input tile `var` (k-th step of BLOCK_K) is loaded: add its squares
    to the sums, then scale its columns by the norm weight (masked past K, where the tile is 0)."""
    if norm_eps is None:
        return ""
    lines = ("gk_offs = k * BLOCK_K + tl.arange(0, BLOCK_K)",
             "gk = tl.load(G + gk_offs, mask=gk_offs < K, other=0.0).to(tl.float32)",
             f"{var}32 = {var}.to(tl.float32)",
             f"ss += tl.sum({var}32 * {var}32, axis=1)",
             f"{var} = ({var}32 * gk[None, :]).to({var}.dtype)")
    return "".join(f"{indent}{line}\n" for line in lines)


def returned(norm_eps: float | None) -> str:
    """What the main loop returns beside the accumulator (and its callers unpack)."""
    return "" if norm_eps is None else ", ss"


def scale(norm_eps: float | None, accumulators: tuple[str, ...], indent: str) -> str:
    """After the K loop: each accumulator times its rows' 1 / RMS."""
    if norm_eps is None:
        return ""
    out = f"{indent}rstd = tl.rsqrt(ss / K + {float(norm_eps)!r})[:, None]\n"
    return out + "".join(f"{indent}{acc} = {acc} * rstd\n" for acc in accumulators)
