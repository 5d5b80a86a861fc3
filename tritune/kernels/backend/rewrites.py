"""How a compiled graph's tuned sites become calls of their ops: one function per kind of site
(`tuned_op.KINDS` says which kind takes which), each inserting one call of the kind's op that
replaces the values the site computed. The backend's `compiler.rewrite` drives them."""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from tritune.kernels.backend import graph


class GraphEdit:
    """A graph being rewritten site by site, and which node now stands for each value replaced so
    far (a later site may read an earlier one's output)."""

    def __init__(self, g: fx.Graph) -> None:
        self.graph, self.replaced = g, {}

    def get(self, node: Any) -> Any:
        """The node that now computes `node`'s value (itself unless replaced)."""
        return self.replaced.get(node, node)

    def stand_in(self, m: graph.Match | graph.GatedMatch, fused: fx.Node, out: Any = None) -> None:
        """Let `fused`, the value of `m`'s contraction with its epilogue (`out`: its value where that
        is not the contraction's), replace `m.last` (viewed to its shape where the epilogue went
        through views); inserted where the graph's cursor is."""
        fused.meta["val"] = out = graph.val(m.node) if out is None else out
        if graph.val(m.last).shape != out.shape:
            fused = self.graph.call_function(torch.ops.aten.view.default, (fused, list(graph.val(m.last).shape)))
            fused.meta["val"] = graph.val(m.last)
        m.last.replace_all_uses_with(fused)
        self.replaced[m.last] = fused

    def read_through(self, m: Any, read: fx.Node) -> tuple[fx.Node, tuple]:
        """The input a site's kernel reads, and its op's trailing arguments: `read` itself and none,
        or, where the site took a row norm into its kernel, the norm's input shaped as `read` and
        the norm's weight (LayerNorm: and bias; the norm's own nodes are left to dead-code elimination)."""
        if m.norm is None:
            return self.get(read), ()
        x = self.shaped(self.get(m.norm.x), graph.val(m.norm.x), list(graph.val(read).shape))
        return x, tuple(self.get(t) for t in m.norm.tensors)

    def shaped(self, node: fx.Node, value: Any, shape: list[int]) -> fx.Node:
        """`node` reshaped to `shape` (itself where it has that shape already)."""
        if list(value.shape) == shape:
            return node
        return self.graph.call_function(torch.ops.aten.reshape.default, (node, shape))


def contraction(edit: GraphEdit, m: graph.Match, spec: str, op: Any) -> None:
    """op(a, b, bias, inputs, spec[, norm[, norm_bias]]) in place of the contraction and its fused epilogue, the
    bias and inputs shaped as the op takes them."""
    get, expr, out = edit.get, m.expr, graph.val(m.node)
    shapes = {"mn": list(out.shape), "m": [expr.m], "n": [expr.n]}
    with edit.graph.inserting_before(m.last):
        bias = None if m.bias is None else edit.shaped(get(m.bias), graph.val(m.bias), [expr.n])
        inputs = [edit.shaped(get(n), graph.val(n), shapes[kind.shape]) for n, kind in zip(m.inputs, expr.inputs)]
        a, norm = edit.read_through(m, m.a)
        edit.stand_in(m, edit.graph.call_function(op, (a, get(m.b), bias, inputs, spec, *norm)))


def gated(edit: GraphEdit, m: graph.GatedMatch, spec: str, op: Any) -> None:
    """op(x, w1, w2, b1, b2, spec[, norm]) in place of the gated pair's product, the biases as [N]
    vectors; of a gate/up projection in one weight, w1 and w2 (and the biases) are views of its
    column ranges (`_column_ranges`)."""
    get, n = edit.get, m.expr.n
    with edit.graph.inserting_before(m.last):
        if m.columns is None:
            b1, b2 = (None if b is None else edit.shaped(get(b), graph.val(b), [n]) for b in (m.b1, m.b2))
            w1, w2, out = get(m.w1), get(m.w2), None
        else:
            w1, w2, b1, b2 = _column_ranges(edit, m)
            out = graph.val(m.node).new_empty((m.expr.m, n))  # the kernel's [M, N], not the contraction's [M, 2N]
        x, norm = edit.read_through(m, m.x)
        edit.stand_in(m, edit.graph.call_function(op, (x, w1, w2, b1, b2, spec, *norm)), out)


def _column_ranges(edit: GraphEdit, m: graph.GatedMatch) -> tuple:
    """W1, W2, b1, b2 of a gated pair computed by one contraction: slices (views, nothing copied)
    of its [K, 2N] operand's columns and of its bias, at `m.columns` (b1 and b2 None without one)."""
    g, n = edit.graph, m.expr.n
    ws = [g.call_function(torch.ops.aten.slice.Tensor, (edit.get(m.w1), 1, c, c + n)) for c in m.columns]
    if m.b1 is None:
        return (*ws, None, None)
    bias = edit.shaped(edit.get(m.b1), graph.val(m.b1), [graph.val(m.b1).numel()])
    return (*ws, *(g.call_function(torch.ops.aten.slice.Tensor, (bias, 0, c, c + n)) for c in m.columns))


def wide(edit: GraphEdit, m: graph.WideMatch, spec: str, op: Any) -> None:
    """op(x, [w...], [b...], spec) in the first projection's place, each of its outputs replacing
    one projection; later projections' weights (views of parameters) move up."""
    g, get = edit.graph, edit.get
    order = {n: i for i, n in enumerate(g.nodes)}

    def before(node: fx.Node) -> fx.Node:
        # graph.find checked that a node after the first projection is views of nodes before it
        # or of parameters; a node this rewrite added stands where the one it replaced was
        if order.get(node, -1) < order[m.node]:
            return node
        return g.node_copy(node, lambda n: before(get(n)))

    with g.inserting_before(m.node):
        ws = [before(get(p.b)) for p in m.projections]
        bs = [edit.shaped(before(get(p.bias)), graph.val(p.bias), [p.expr.n]) for p in m.projections
              if p.bias is not None]
        x, norm = edit.read_through(m, m.x)
        call = g.call_function(op, (x, ws, bs, spec, *norm))
        call.meta["val"] = [graph.val(p.node) for p in m.projections]
        for i, p in enumerate(m.projections):
            edit.stand_in(p, g.call_function(operator.getitem, (call, i)))


def attention(edit: GraphEdit, m: graph.AttentionMatch, spec: str, op: Any) -> None:
    """op(q, k, v, mask, spec[, cos_q, sin_q, cos_k, sin_k]) where the SDPA node was (q and k read
    before their rotation, k and v before their repeat; the tables' operands viewed as the kernel
    reads them: positions [B or 1, 1, rows or 1, 1] and frequencies [lanes / 2]), its output
    replacing every read of the node's attention output. The node goes too: dead-code elimination
    keeps the SDPA ops that may draw random numbers for dropout (the mask's broadcast copies it
    leaves to it)."""
    g, get = edit.graph, edit.get
    with g.inserting_before(m.node):
        q = get(m.q) if m.q_shape is None else edit.shaped(get(m.q), graph.val(m.q), list(m.q_shape))
        tables = tuple(_viewed(edit, t, shape) for t, shape in zip(m.tables, m.table_views)) if any(m.tables) else ()
        call = g.call_function(op, (q, get(m.k), get(m.v), None if m.mask is None else get(m.mask), spec, *tables))
    call.meta["val"] = graph.val(m.outputs[0])
    for out in m.outputs:
        out.replace_all_uses_with(call)
        edit.replaced[out] = call
        g.erase_node(out)
    g.erase_node(m.node)  # the site reads nothing else of it


def _viewed(edit: GraphEdit, node: fx.Node | None, shape: tuple[int, ...] | None) -> fx.Node | None:
    """A table operand as the attention op reads it: `node` viewed to `shape` (None: as it is). The
    view carries its value, so that positions computed from no input fold into one constant of the
    op's shape (Inductor would inline a small 1-D constant and then copy it out for the op: a kernel)."""
    if node is None or shape is None:
        return None if node is None else edit.get(node)
    viewed = edit.shaped(edit.get(node), graph.val(node), list(shape))
    if viewed is not edit.get(node):
        viewed.meta["val"] = graph.val(node).reshape(shape)
    return viewed
