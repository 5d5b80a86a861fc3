"""What an attention site reads before torch's SDPA: rotary embeddings applied to q and k, and k and v
repeated over the query heads of their group (grouped-query attention), as models write them; the
attention kernel does both as it loads its rows, so the pointwise kernels that would compute them
are left unread (dead-code elimination drops them unless something else reads them, e.g. a cache).

Rotary embeddings (Llama, Qwen2, Mistral; NeoX on a part of each head):

    rotated = x·cos + cat(-x[..., h:], x[..., :h])·sin      (h = half the rotated lanes)
    q_or_k = rotated, or cat(rotated of x[..., :r], x[..., r:]) for a partial rotation (r may be
             every lane: Phi-3 writes its whole-head rotation so)

with cos and sin broadcastable to [batch, 1, rows, lanes] (the same for every head). The repeat of
k and v is x[:, :, None].expand(B, Hkv, G, L, D).reshape(B, Hkv·G, L, D) (`repeat_kv`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from tritune.kernels.backend.epilogue_match import static, val

A = torch.ops.aten
VIEWS = (A.view.default, A._unsafe_view.default, A.reshape.default)


@dataclass(frozen=True)
class Rotary:
    """x rotated on its first `lanes` lanes by the tables cos and sin (nodes)."""

    x: fx.Node
    cos: fx.Node
    sin: fx.Node
    lanes: int


def rotary(node: Any) -> Rotary | None:
    """The rotation `node` computes, whole or partial, or None."""
    if _is(node, A.cat.default) and len(node.args[0]) == 2 and _last_dim(node):
        rot, rest = node.args[0]
        r = rotary(rot)  # the rotated part x[..., :lanes], then the lanes that pass x[..., lanes:]
        if r is None or not _is(r.x, A.slice.Tensor, A.alias.default):
            return None
        # all lanes rotated (Phi-3 writes the partial form for whole heads): the part is an alias of
        # x, torch's trace of x[..., :lanes], and the lanes that pass an empty slice
        x = r.x.args[0]
        part = _sliced(r.x, x, 0, r.lanes) or _is(r.x, A.alias.default)
        return Rotary(x, r.cos, r.sin, r.lanes) if part and _sliced(rest, x, r.lanes, None) else None
    if not _is(node, A.add.Tensor) or len(node.args) != 2:
        return None
    for plain, turned in (node.args, node.args[::-1]):
        found = _turned(turned)
        if found is None:
            continue
        x, sin = found
        cos = _other(plain, x)
        if cos is not None and _table(cos, x) and _table(sin, x):
            return Rotary(x, cos, sin, val(x).shape[-1])
    return None


def table_dims(*tables: Any) -> str:
    """The rotary tables' dimensions (of "bn": batch, row) along which any of them varies."""
    shapes = [shape4(val(t)) for t in tables if t is not None]
    return ("b" if any(s[0] > 1 for s in shapes) else "") + ("n" if any(s[2] > 1 for s in shapes) else "")


def repeated(node: Any) -> tuple[fx.Node, int] | None:
    """(x, G) where `node` is x [B, Hkv, L, D] repeated to [B, Hkv·G, L, D] as repeat_kv writes it."""
    if not (_is(node, *VIEWS) and _is(node.args[0], A.clone.default)):
        return None
    expand = node.args[0].args[0]
    if not (_is(expand, A.expand.default) and _is(expand.args[0], A.unsqueeze.default)):
        return None
    x, dim = expand.args[0].args[:2]
    big, out = val(expand), val(node)
    if not (static(val(x), big, out) and dim == 2 and big.dim() == 5 and val(x).dim() == 4):
        return None
    b, hk, g, length, d = big.shape
    if tuple(val(x).shape) != (b, hk, length, d) or tuple(out.shape) != (b, hk * g, length, d):
        return None
    return x, g


def same_for_rows(r: Rotary) -> bool:
    """Whether a rotation is the same for every head and row (its tables vary along batch and lane
    only): then a view that regroups heads and rows commutes with it."""
    return all(shape4(val(t))[1:3] == (1, 1) for t in (r.cos, r.sin))


def _turned(node: Any) -> tuple[fx.Node, fx.Node] | None:
    """(x, sin) where `node` is cat(-x2, x1)·sin, either operand first."""
    if not _is(node, A.mul.Tensor):
        return None
    for cat, sin in (node.args, node.args[::-1]):
        if _is(cat, A.cat.default) and len(cat.args[0]) == 2 and _last_dim(cat):
            neg, first = cat.args[0]
            if _is(neg, A.neg.default) and _is(first, A.slice.Tensor):
                x = first.args[0]
                lanes = val(x).shape[-1] if static(val(x)) else 0
                if lanes and lanes % 2 == 0 and _sliced(first, x, 0, lanes // 2) \
                        and _sliced(neg.args[0], x, lanes // 2, None):
                    return x, sin
    return None


def _other(node: Any, x: fx.Node) -> fx.Node | None:
    """The other operand of `node` = x·t (either order), or None."""
    if not _is(node, A.mul.Tensor):
        return None
    a, b = node.args[:2]
    return b if a is x else a if b is x else None


def table_fits(table: Any, batch: int, rows: int, lanes: int) -> bool:
    """Whether a tensor's shape is a rotary table's for x [batch, heads, rows, lanes]: one row of
    lanes per (batch, row), the same for every head, [batch or 1, 1, rows or 1, lanes]."""
    if table.dim() > 4:
        return False
    b, h, n, d = shape4(table)
    return b in (1, batch) and h == 1 and n in (1, rows) and d == lanes


def shape4(t: Any) -> tuple[int, ...]:
    """A tensor's shape right-aligned to 4-D (1 for the dimensions it lacks)."""
    return (1,) * (4 - t.dim()) + tuple(t.shape)


def _table(t: Any, x: fx.Node) -> bool:
    """Whether t is a tensor node in x's dtype that is a rotary table for x [B, H, L, lanes]."""
    tv, xv = val(t), val(x)
    return isinstance(t, fx.Node) and static(tv, xv) and xv.dim() == 4 and tv.dtype == xv.dtype \
        and table_fits(tv, xv.shape[0], xv.shape[2], xv.shape[3])


def _sliced(node: Any, x: Any, start: int, end: int | None) -> bool:
    """Whether `node` is x[..., start:end] (end None: to the last lane) along the last dimension."""
    if not _is(node, A.slice.Tensor) or node.args[0] is not x or x is None or not static(val(x)):
        return False
    dim, lo, hi, step = (*node.args[1:], *(0, None, None, 1)[len(node.args) - 1:])[:4]  # defaults filled in
    size = val(x).shape[-1]
    hi = size if hi is None or hi >= size else hi  # torch writes "to the end" as sys.maxsize
    return dim in (-1, val(x).dim() - 1) and (lo or 0) == start and hi == (size if end is None else end) and step == 1


def _last_dim(cat: fx.Node) -> bool:
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    return static(val(cat)) and dim in (-1, val(cat).dim() - 1)


def _is(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets
