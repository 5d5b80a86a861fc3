"""Column ranges of one tensor as the ATen graph takes them: x[..., a:b] (a slice of the last
dimension; `narrow` traces to it), and the parts of x.split(size, -1), x.split([sizes], -1) and
x.chunk(n, -1) (which traces to split). A projection fused into one weight (Phi-3's gate_up_proj)
is read through them: each range of its output's columns is a range of the weight's rows."""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from tritune.kernels.backend.epilogue_match import MAX_NODES, VIEWS, static, val

A = torch.ops.aten
SPLITS = (A.split.Tensor, A.split_with_sizes.default)


def columns(node: Any) -> tuple[fx.Node, int, int] | None:
    """(x, start, stop) where `node` is x's columns [start, stop) along its last dimension (a slice
    of step 1, or a part of a split), or None."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    if node.target == A.slice.Tensor:
        x, dim, start, stop, step = (*node.args, *(0, None, None, 1)[len(node.args) - 1:])[:5]  # defaults filled in
        width = _width(x, dim)
        if width is None or step != 1:
            return None
        start, stop = _clip(start or 0, width), _clip(width if stop is None else stop, width)
        return (x, start, stop) if start < stop else None
    if node.target is operator.getitem and _is_split(node.args[0]):
        split, i = node.args
        bounds = _parts(split)
        return None if bounds is None or not 0 <= i < len(bounds) else (split.args[0], *bounds[i])
    return None


def column_readers(node: fx.Node) -> dict[fx.Node, tuple[int, int]] | None:
    """Every reader of `node` (through views that keep its rows whole) as a column range of it:
    {range node: (start, stop)}; None where anything reads it otherwise."""
    found: dict[fx.Node, tuple[int, int]] = {}
    todo = [node]
    while todo and len(found) + len(todo) < MAX_NODES:
        n = todo.pop()
        for user in n.users:
            if user.op == "call_function" and user.target in VIEWS and _width(user, -1) == _width(node, -1):
                todo.append(user)
            elif _is_split(user) and user.args[0] is n:
                todo.append(user)  # its parts are the readers
            elif (cols := columns(user)) is not None and cols[0] is (n.args[0] if _is_split(n) else n):
                found[user] = cols[1:]
            else:
                return None
    return None if todo else found


def _is_split(node: Any) -> bool:
    """Whether `node` splits its input along the last dimension."""
    return (isinstance(node, fx.Node) and node.op == "call_function" and node.target in SPLITS
            and _width(node.args[0], node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) is not None)


def _parts(split: fx.Node) -> list[tuple[int, int]] | None:
    """The column range of each part of a split of the last dimension."""
    width, size = _width(split.args[0], -1), split.args[1]
    sizes = [min(size, width - s) for s in range(0, width, size)] if isinstance(size, int) else list(size)
    if not sizes or sum(sizes) != width or min(sizes) < 1:
        return None
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def _width(x: Any, dim: Any) -> int | None:
    """The size of x's last dimension, where `dim` names it (else None)."""
    v = val(x)
    if not isinstance(x, fx.Node) or not static(v) or v.dim() == 0 or dim not in (-1, v.dim() - 1):
        return None
    return v.shape[-1]


def _clip(i: int, width: int) -> int:
    """A slice bound as torch reads it: negative from the end, clamped to [0, width]."""
    return max(0, min(width, i + width if i < 0 else i))
