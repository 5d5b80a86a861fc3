"""Row norms a site reads its input through, found in the ATen graph: RMSNorm as Llama, Qwen and
Mistral write it,

    xf = x.to(float32)                                  (absent when x is fp32)
    y  = xf * rsqrt(mean(xf ** 2, -1, keepdim) + eps)
    out = g * y.to(x.dtype)                             (or y * g; the cast absent for fp32)

and LayerNorm as torch's module runs it, `out = native_layer_norm(x, [K], g, b, eps)[0]`.

When every reader of `out` (through views) is the input of one site (a projection, a gated pair,
the q/k/v of a wide group; for LayerNorm, a projection of a few rows over a weight stored [N, K]
that is no LM head: see LAYER_NORM_MAX_ROWS), the site takes the norm into its kernel's
prologue (`tritune.kernels.norm`): it reads x and g (LayerNorm: and b), and the norm's own kernel
disappears from the graph. The rows may come with any leading dimensions: [tokens, hidden] as
serving engines flatten them (the site reads the norm's output itself), [batch, tokens, hidden] or
more (the site reads a 2-D view of it).
A norm with other readers stays a kernel, and the site reads its output as before. So does a
norm over more than MAX_ROWS rows: there the GEMM is bound by its arithmetic, which the prologue's
per-tile scaling slows more than the norm's own kernel costs.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.expr import ExprError
from tritune.kernels.backend.epilogue_match import ALIASES, MAX_NODES, VIEWS, static, val
from tritune.kernels.backend.helpers import DTYPE_NAMES
from tritune.schedules.contraction import GEMV_MAX_ROWS

A = torch.ops.aten
WHOLE = (*VIEWS, A.alias.default)  # views of a whole tensor (an LM head reads the final norm through an alias)
# Rows up to which a site takes the norm in: decode (a few sequences, speculative tokens), where the
# step streams weights. At 2048 rows (Llama prefill, H200) the normed gated kernel took 0.240 ms and
# q/k/v 0.104 ms against Inductor's norm and GEMMs' 0.165 and 0.057 ms.
MAX_ROWS = 64
# Where a LayerNorm goes into a projection's prologue: the GEMV path's few rows, a weight stored
# [N, K], and at most LAYER_NORM_MAX_WIDTH times as many columns as the norm's width. Each program
# of the kernel first reads its rows for their mean and 1/std, which holds up its weight loads. On
# an H100 (K = 1024) a 4-8 MB [N, K] projection at one row paid about what the norm's own kernel
# costs (1.5 us) and saved its launch, but an LM head (1x50432x1024, thousands of short programs)
# took 40.8 us against 35.5 without the norm; [K, N] weights (GPT-2's Conv1D), whose GEMV tiles
# take many short K steps, lost to the norm's kernel and cuBLAS (12.1-12.9 against 9.0-9.6 us);
# and at 16 rows every normed kernel lost (the head 54.5 against 37.5 us, a 4096-column
# projection 9.9 against 6.1 us and a 1.6 us norm).
LAYER_NORM_MAX_ROWS = GEMV_MAX_ROWS
LAYER_NORM_MAX_WIDTH = 8


@dataclass(frozen=True)
class Norm:
    """A row norm a site reads its input through: its input `x`, weight `g` ([K]) and epsilon; a
    LayerNorm's bias `b` ([K]), None for an RMSNorm."""

    x: fx.Node
    g: fx.Node
    eps: float
    b: fx.Node | None = None

    @property
    def tensors(self) -> tuple[fx.Node, ...]:
        """What the site's kernel reads besides x, in its argument order."""
        return (self.g,) if self.b is None else (self.g, self.b)


def with_norm(site: Any, inputs: tuple[fx.Node, ...], kernels: tuple[fx.Node, ...]) -> Any:
    """`site` with the norm its input is read through taken into its kernel (its expression's
    `norm_eps` set, its `norm` field the norm), or `site` unchanged. `inputs`: the nodes the site's
    kernel reads as its input (every projection's view of it, or the norm's output itself where the
    rows are already 2-D); `kernels`: the site's contractions, which read them. The norm must have
    no other reader."""
    if site.expr.m > MAX_ROWS:
        return site
    out = viewed(inputs[0])
    norm = rms_norm_of(out) or layer_norm_of(out)
    if norm is None or not _only_read_by(out, set(kernels)):
        return site
    layer, x, expr = norm.b is not None, val(norm.x), site.expr
    if layer and not _takes_layer_norm(expr):
        return site
    weights = [val(t) for t in norm.tensors]
    if not static(x, *weights) or DTYPE_NAMES.get(str(x.dtype)) != expr.dtype or any(
            w.dtype != x.dtype or w.shape != (expr.k,) for w in weights):
        return site
    # the kernel reads x as the [M, K] rows the site's input had: a view of a contiguous x
    if not x.is_contiguous() or x.numel() != val(inputs[0]).numel() or x.shape[-1] != expr.k:
        return site
    try:
        return replace(site, expr=replace(expr, norm_eps=norm.eps, **({"layer_norm": True} if layer else {})),
                       norm=norm)
    except ExprError:
        return site


def _takes_layer_norm(expr: Any) -> bool:
    """Whether a site's kernel takes a LayerNorm into its prologue: a plain contraction (the only
    one with that prologue) of a few rows over a weight stored [N, K], with not many more columns
    than the norm is wide."""
    return (isinstance(expr, Matmul) and expr.m <= LAYER_NORM_MAX_ROWS and expr.trans_b
            and expr.n <= LAYER_NORM_MAX_WIDTH * expr.k)


def without_norm(site: Any) -> Any:
    """A site that took a norm into its kernel as it was before (the norm a kernel of its own)."""
    layer = {"layer_norm": False} if isinstance(site.expr, Matmul) else {}
    return replace(site, expr=replace(site.expr, norm_eps=None, **layer), norm=None)


def rms_norm_of(node: fx.Node) -> Norm | None:
    """The RMSNorm whose output `node` is (see the module's docstring), or None."""
    if not _is(node, A.mul.Tensor):
        return None
    for g, y in (node.args[:2], node.args[1::-1]):
        if not isinstance(g, fx.Node) or not isinstance(y, fx.Node) or not static(val(g)) or val(g).dim() != 1:
            continue
        scaled = y.args[0] if _is_cast(y) else y
        found = _scaled(scaled)
        if found is not None:
            return Norm(found[0], g, found[1])
    return None


def layer_norm_of(node: fx.Node) -> Norm | None:
    """The LayerNorm over the last dimension, with a weight and a bias, whose normalised rows
    `node` is (`native_layer_norm(x, [K], g, b, eps)[0]`), or None."""
    if not (_is(node, operator.getitem) and node.args[1] == 0 and _is(node.args[0], A.native_layer_norm.default)):
        return None
    x, shape, g, b, eps = node.args[0].args[:5]
    if not all(isinstance(t, fx.Node) for t in (x, g, b)) or list(shape) != [val(x).shape[-1]]:
        return None
    if any(val(t).dim() != 1 for t in (g, b)) or not isinstance(eps, (int, float)):
        return None
    return Norm(x, g, float(eps), b)


def _scaled(node: Any) -> tuple[fx.Node, float] | None:
    """(x, eps) where `node` = xf * rsqrt(mean(xf ** 2, -1, keepdim) + eps), xf x or x.to(float32)."""
    if not _is(node, A.mul.Tensor):
        return None
    for xf, r in (node.args[:2], node.args[1::-1]):
        if not _is(r, A.rsqrt.default) or not _is(r.args[0], A.add.Tensor):
            continue
        mean, eps = r.args[0].args[:2]
        if not isinstance(eps, (int, float)) or not _is(mean, A.mean.dim) or not _last_dim(mean):
            continue
        square = mean.args[0]
        if _is(square, A.pow.Tensor_Scalar) and square.args[0] is xf and square.args[1] == 2:
            return (xf.args[0] if _is_cast(xf) else xf), float(eps)
    return None


def _last_dim(mean: fx.Node) -> bool:
    dims, keep = mean.args[1], (mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False))
    rank = val(mean.args[0]).dim()
    return keep and list(dims) in ([-1], [rank - 1])


def _is(node: Any, target: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target == target


def _is_cast(node: Any) -> bool:
    """A dtype conversion that stays on the device (what `.to(dtype)` traces to)."""
    return (_is(node, A._to_copy.default) and set(node.kwargs) <= {"dtype"}) or _is(
        node, torch.ops.prims.convert_element_type.default)


def viewed(node: fx.Node) -> fx.Node:
    """The node that `node` is whole views of (itself if it is none)."""
    for _ in range(MAX_NODES):
        if node.op != "call_function" or node.target not in WHOLE or not isinstance(node.args[0], fx.Node):
            break
        node = node.args[0]
    return node


def _only_read_by(node: fx.Node, readers: set[fx.Node]) -> bool:
    """Whether every reader of `node`, through views, is one of `readers` (the site's contractions:
    whatever the rows' leading dimensions, and so whether or not the site reads a view of `node`)."""
    todo, seen = [node], 0
    while todo and seen < MAX_NODES:
        n = todo.pop()
        seen += 1
        for user in n.users:
            if user in readers:
                continue
            if user.op == "call_function" and user.target in ALIASES:
                todo.append(user)
                continue
            return False
    return not todo
