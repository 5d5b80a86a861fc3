"""The attention family (`--op attention`): softmax(scale·q·kᵀ + mask)·v for a few query rows."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels.attention import launch
from tritune.kernels.attention.expr import AWKWARD, Attention
from tritune.kernels.expr import (DTYPE_BYTES, TOLERANCE, ExprError, check_dtype, check_options, parse_dims,
                                  torch_dtype)
from tritune.kernels.family import Family, Operands
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space

POSITION_TYPES = {"i64": "int64", "i32": "int32"}  # rope_pos -> the torch dtype's name


class AttentionFamily(Family):
    """out = softmax(scale·q·kᵀ [+ mask])·v, q [B,H,Lq,D] (Lq <= 64), k, v [B,H/G,Lk,D], q and k
    optionally rotated (rotary embeddings); fp16/bf16/fp32."""

    op = "attention"
    baseline = "torch (F.scaled_dot_product_attention)"
    sources = ("attention/expr.py", "attention/template.py", "attention/launch.py")
    template_version = 1
    launch_module = "tritune.kernels.attention.launch"

    def from_dict(self, spec: dict) -> Attention:
        return Attention.from_dict(spec)

    @property
    def cli_help(self) -> str:
        return ("--shape B,H,Lq,Lk,D (batch, query heads, query rows <= 64, keys, head dim <= 256); no mask, "
                "scale 1/sqrt(D) (a model's masks come with tune-model); --group G: query heads per key/value "
                "head; --rope R: q and k rotated on their first R lanes, tables per position")

    def examples(self) -> tuple:
        return AWKWARD

    def from_cli(self, shape: str, dtype: str, options: dict[str, str]) -> Attention:
        check_options(options, ("group", "rope"), self.op)
        b, h, lq, lk, d = parse_dims(shape, (5,), "B,H,Lq,Lk,D")
        check_dtype(dtype)
        group, rope = (_count(options, name, default) for name, default in (("group", 1), ("rope", 0)))
        return Attention(b, h, lq, lk, d, dtype, group=group, rope_q=rope, rope_k=rope, rope_dims="n" if rope else "")

    def rate(self, expr: Attention, ms: float | None) -> tuple[float, str]:
        """Bandwidth: the bytes the op must move (`expr.bytes`) per second, in TB/s."""
        return (expr.bytes / (ms * 1e-3) / 1e12 if ms else 0.0), "TB/s"

    # ----- schedules and cost model
    def space(self, expr: Attention, limits: Limits) -> Space:
        from tritune.schedules.attention import attention_space

        rows = (launch.block_m(expr.lq * expr.group, 0), launch.block_m(expr.lq * expr.group, 1))
        return attention_space(expr.batch * expr.kv_heads, rows, expr.lk, launch.block_d(expr.d),
                               DTYPE_BYTES[expr.dtype], limits)

    def features(self, expr: Attention, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        from tritune.kernels.attention.features import features

        return features(expr, limits, configs)

    def default_config(self, expr: Attention) -> Config:
        return launch.DEFAULT

    # ----- semantics
    def inputs(self, expr: Attention, seed: int, device: str) -> Operands:
        """q, k, v ~ N(0, 1) (contiguous), a NaN output laid out in `out_order`, then the mask: an
        additive one N(0, 1) with a fifth of its entries -inf, or a boolean one four fifths True;
        key 0 is never left out (torch's fused kernels differ on rows with no key at all). With
        rotary embeddings the mask (None without) is followed by cos and sin of random angles for
        q, then for k (None for a side without); where the kernel computes the tables (`rope_pos`),
        by each side's positions (0 to 4095, [B or 1, 1, rows or 1, 1]) and frequencies (1e-4 to 1, as
        a model's range over its lanes) instead."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        dt = torch_dtype(expr.dtype)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device)

        b, h, hk, lq, lk, d = expr.batch, expr.heads, expr.kv_heads, expr.lq, expr.lk, expr.d
        q, k, v = rand(b, h, lq, d).to(dt), rand(b, hk, lk, d).to(dt), rand(b, hk, lk, d).to(dt)
        out = torch.full((b, h, lq, d), float("nan"), device=device, dtype=dt)
        out = out.as_strided(out.shape, launch.out_strides(expr))
        mask = None
        if expr.mask is not None:
            shape = expr.mask_shape()
            keep = torch.rand(shape, generator=gen, device=device) < 0.8
            keep[..., 0] = True
            mask = keep if expr.mask == "bool" else rand(*shape).masked_fill(~keep, float("-inf")).to(
                torch_dtype(expr.mask))
        if not (expr.rope_q or expr.rope_k):
            return Operands((q, k, v, out, *(() if mask is None else (mask,))), out)

        def tables(rows: int, lanes: int) -> tuple:
            if not lanes:
                return None, None
            if expr.rope_pos:
                positions = torch.randint(0, 4096, expr.rope_shape(rows, 1), generator=gen, device=device)
                freqs = 1e4 ** -torch.rand(lanes // 2, generator=gen, device=device)
                kind = getattr(torch, POSITION_TYPES[expr.rope_pos])
                return positions.to(kind), freqs.to(torch_dtype(expr.rope_freq))
            angles = rand(*expr.rope_shape(rows, lanes)) * 3
            return angles.cos().to(dt), angles.sin().to(dt)
        return Operands((q, k, v, out, mask, *tables(lq, expr.rope_q), *tables(lk, expr.rope_k)), out)

    def reference(self, expr: Attention, args: tuple) -> Any:
        import torch

        q, k, v = (t.double() for t in args[:3])
        q, k, v = _prepared(expr, q, k, v, *(None if t is None else t.double() for t in args[5:]))
        scores = q @ k.transpose(-1, -2) * expr.scale
        mask = _full_mask(expr, args[4] if len(args) > 4 else None, q.device)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
        top = scores.amax(-1, keepdim=True)
        weights = torch.exp(scores - top.masked_fill(top == float("-inf"), 0))
        total = weights.sum(-1, keepdim=True)
        return weights @ v / total.masked_fill(total == 0, 1)  # a row with no key: 0

    def eager(self, expr: Attention, x: Operands) -> Callable[[], Any]:
        return lambda: self.library(expr, "sdpa")(*x.args)

    def expression(self, expr: Attention) -> Callable[..., Any]:
        return lambda *args: sdpa(expr, *args)

    def libraries(self, expr: Attention) -> tuple[str, ...]:
        """torch's SDPA (it picks its backend: flash, memory-efficient, cuDNN or math)."""
        return ("sdpa",)

    def tolerance(self, expr: Attention) -> float:
        # fp32 softmax and accumulation: the output rounding of the storage type dominates, plus the
        # probabilities' rounding to it before the second product
        return TOLERANCE[expr.dtype]


def sdpa(expr: Attention, q: Any, k: Any, v: Any, out: Any = None, mask: Any = None, *tables: Any) -> Any:
    """The expression as torch computes it: q and k rotated and k and v repeated over their groups
    as models write it, then F.scaled_dot_product_attention (a fresh output)."""
    import torch.nn.functional as F

    q, k, v = _prepared(expr, q, k, v, *tables)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=expr.causal, scale=expr.scale)


def rotated(x: Any, cos: Any, sin: Any, lanes: int) -> Any:
    """Rotary embeddings on the first `lanes` lanes of x (as Llama and NeoX write them): x·cos +
    rotate_half(x)·sin, rotate_half((x1, x2)) = (-x2, x1); the other lanes unchanged."""
    import torch

    if not lanes:
        return x
    part, rest = x[..., :lanes], x[..., lanes:]
    half = lanes // 2
    turned = torch.cat([-part[..., half:], part[..., :half]], -1)
    return torch.cat([part * cos + turned * sin, rest], -1)


def angle_tables(expr: Attention, positions: Any, freqs: Any, lanes: int) -> tuple:
    """cos and sin tables of `lanes` lanes as transformers' rotary embeddings build them from positions
    [.., rows, 1] and frequencies [lanes / 2]: the angles in fp32 (lane j at frequency j mod lanes/2),
    cos and sin times `rope_scale`, rounded to the storage dtype; (None, None) without positions."""
    import torch

    if positions is None:
        return None, None
    f = freqs.float()
    angles = positions.float() * torch.cat([f, f])[:lanes]
    dt = torch_dtype(expr.dtype)
    return (angles.cos() * expr.rope_scale).to(dt), (angles.sin() * expr.rope_scale).to(dt)


def _prepared(expr: Attention, q: Any, k: Any, v: Any, cos_q: Any = None, sin_q: Any = None, cos_k: Any = None,
              sin_k: Any = None) -> tuple:
    """q and k rotated, k and v with one head per query head."""
    if expr.rope_pos:  # the tables' operands are positions and frequencies
        cos_q, sin_q = angle_tables(expr, cos_q, sin_q, expr.rope_q)
        cos_k, sin_k = angle_tables(expr, cos_k, sin_k, expr.rope_k)
    q, k = rotated(q, cos_q, sin_q, expr.rope_q), rotated(k, cos_k, sin_k, expr.rope_k)
    if expr.group > 1:
        k, v = k.repeat_interleave(expr.group, 1), v.repeat_interleave(expr.group, 1)
    return q, k, v


def _count(options: dict[str, str], name: str, default: int) -> int:
    """An option's whole number (ExprError naming it otherwise)."""
    text = options.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ExprError(f"bad --{name} {text!r}: expected a whole number") from None


def _full_mask(expr: Attention, mask: Any, device: Any) -> Any:
    """The mask as [.., Lq, Lk] (None without one); causal as a boolean one."""
    import torch

    if expr.causal:
        return torch.ones(expr.lq, expr.lk, dtype=torch.bool, device=device).tril()
    return mask


ATTENTION = AttentionFamily()
