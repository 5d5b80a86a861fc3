"""Contractions in a traced model: each mm / addmm / bmm / baddbmm with the pointwise epilogue
after it (`epilogue_match`), gated pairs act(x @ W1ᵀ [+ b1]) * (x @ W2ᵀ [+ b2]) as one site, and
2 or 3 projections of one input with no epilogue but their bias (q, k, v) as one wide site.
Outer products (K = 1, e.g. rotary embeddings' position x frequency) are no contraction worth a kernel
(the backend makes them broadcast multiplies: `outer`).
A site whose input is a row norm's output read by it alone (an RMSNorm; a LayerNorm where that pays)
takes the norm into its kernel (`norm_match`).
Attention over a few query rows (torch's SDPA in any of its ATen forms) is a site of its own (`attention_match`).

Task extraction and the torch.compile backend match on one normal form (`aten_graph`): the model
traced to ATen ops on fake tensors, where linear and matmul have decomposed into t / view +
mm / addmm / bmm and pointwise ops stay whole (aten.gelu stays gelu, unlike in Inductor's own
decompositions). Both therefore see the same workloads, and the backend finds what was tuned.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Binary, Gelu, Scale, Unary
from tritune.kernels.expr import ExprError
from tritune.kernels.backend import attention_match
from tritune.kernels.backend.attention_match import AttentionMatch
from tritune.kernels.backend.epilogue_match import (ALIASES, MAX_NODES, VIEWS, Scope, follow, is_view_of, static,
                                                     val, written)
from tritune.kernels.backend.helpers import DTYPE_NAMES, contraction_expr, layout_of
from tritune.kernels.backend.norm_match import Norm, viewed, with_norm
from tritune.kernels.backend.split_match import column_readers, columns
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import MAX_WEIGHTS, Wide

A = torch.ops.aten
CONTRACTIONS = (A.mm.default, A.addmm.default, A.bmm.default, A.baddbmm.default)
# the gate's epilogue -> the gated kernel's activation
ACTIVATIONS = {(Unary("silu"),): "silu", (Binary("mul", (Unary("sigmoid"),)),): "silu", (Gelu(),): "gelu",
               (Gelu("tanh"),): "gelu_tanh"}


@dataclass(frozen=True)
class Match:
    """One contraction and the epilogue fused after it.

    The kernel reads `a`, `b`, `bias` and the extra epilogue `inputs` (in `expr.inputs` order), and
    its output replaces the value of `last` (the contraction itself, or the last fused pointwise
    op); `nodes` are those it computes. `unfused` names the elementwise op after `last` that reads
    the result but could not fuse, or is empty. `norm`: the row norm `a` is the output of, taken into
    the kernel (which then reads the norm's input and weight, and a LayerNorm's bias), or None.
    """

    expr: Matmul
    node: fx.Node
    a: fx.Node
    b: fx.Node
    bias: fx.Node | None
    last: fx.Node
    unfused: str = ""
    inputs: tuple[fx.Node, ...] = ()
    nodes: frozenset[fx.Node] = frozenset()
    norm: Norm | None = None


@dataclass(frozen=True)
class GatedMatch:
    """act(x @ w1 [+ b1]) * (x @ w2 [+ b2]): the gate's contraction `node`, the other one's `up`,
    their shared input `x` and [K, N] operands `w1`, `w2`; the kernel's output replaces `last` (the
    product). `projections` are the two contractions' own matches, for when the gated kernel does
    not run."""

    expr: Gated
    node: fx.Node
    up: fx.Node
    x: fx.Node
    w1: fx.Node
    w2: fx.Node
    b1: fx.Node | None
    b2: fx.Node | None
    last: fx.Node
    projections: tuple[Match, ...] = ()
    unfused: str = ""
    norm: Norm | None = None  # the row norm x is the output of, taken into the kernel
    # one contraction computes both products (`node` is `up`, w1 is w2: a weight of both): the
    # first columns of W1's and of W2's ranges in that [K, 2N] operand (and in its bias); else None
    columns: tuple[int, int] | None = None


@dataclass(frozen=True)
class WideMatch:
    """x @ w_i [+ b_i] for 2 or 3 projections of one input `x`: the members' own matches, in graph
    order (for when the wide kernel does not run); output i replaces projection i's `last`."""

    expr: Wide
    x: fx.Node
    projections: tuple[Match, ...]
    norm: Norm | None = None  # the row norm x is the output of, taken into the kernel

    @property
    def node(self) -> fx.Node:
        """The first projection's contraction: where the wide kernel runs."""
        return self.projections[0].node

    @property
    def unfused(self) -> str:
        return ", ".join(p.unfused for p in self.projections if p.unfused)


Matched = Match | GatedMatch | WideMatch | AttentionMatch  # every kind of site `find` returns


def aten_graph(fn: Callable, args: Sequence[Any], fake_mode: Any = None) -> fx.GraphModule:
    """`fn(*args)` traced to the ATen normal form on fake tensors (nothing is computed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    # a fresh mode may meet real parameters of the model: those become fake on first use
    mode = fake_mode or FakeTensorMode(allow_non_fake_inputs=True)
    with mode, torch.no_grad():
        fake = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args]
        gm = make_fx(fn, tracing_mode="real")(*fake)  # "real": the inputs already are fake
    gm.graph.eliminate_dead_code()  # tracing leaves unused detach nodes that look like extra users
    gm.recompile()
    return gm


def tf32_allowed() -> bool:
    """Whether fp32 contractions may use tf32, as torch's matmul precision setting says."""
    return torch.get_float32_matmul_precision() != "highest"


def find(gm: fx.GraphModule, allow_tf32: bool = True) -> list[Matched]:
    """Every site of the graph a tritune kernel can compute, in graph order: contractions (a later
    one does not fuse ops an earlier one already did), gated pairs and wide groups, which carry
    the matches of their contractions instead of listing them, and attention."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    matches: dict[fx.Node, Match] = {}
    claimed: frozenset[fx.Node] = frozenset()
    for n in calls:
        if n.target in CONTRACTIONS and (m := _match(n, allow_tf32, Scope(n, order, claimed))) is not None:
            matches[n] = m
            claimed |= m.nodes
    sites: dict[fx.Node, Matched] = {}
    for n in calls:
        if n.target == A.mul.Tensor and (g := _gated(n, order, allow_tf32)) is not None:
            pair = tuple(matches.pop(p) for p in (g.node, g.up) if p in matches)
            sites[min(g.node, g.up, key=order.__getitem__)] = replace(g, projections=pair)
    for w in _wide(list(matches.values()), order):
        for p in w.projections:
            del matches[p.node]
        sites[w.node] = w
    sites.update(matches)
    sites.update((m.node, m) for m in attention_match.find(calls))
    return [_normed(sites[n]) for n in sorted(sites, key=order.__getitem__)]


def _normed(site: Matched) -> Matched:
    """The site with the row norm its input is read through taken into its kernel, if it can be."""
    if isinstance(site, WideMatch):
        kernels = tuple(p.node for p in site.projections)
    elif isinstance(site, GatedMatch):
        kernels = (site.node, site.up)
    elif isinstance(site, Match) and site.node.target in (A.mm.default, A.addmm.default):
        kernels = (site.node,)
    else:
        return site
    return with_norm(site, tuple(_operands(n)[0] for n in kernels), kernels)


def _operands(node: fx.Node) -> tuple[fx.Node, fx.Node, tuple, fx.Node | None] | None:
    """A contraction's operands a, b, the steps it applies itself (alpha, an addmm's bias) as a
    chain, and its bias; None where no tritune kernel computes it."""
    if node.target in (A.mm.default, A.bmm.default):
        (a, b), bias, alpha = node.args[:2], None, 1
    else:
        (bias, a, b), alpha = node.args[:3], node.kwargs.get("alpha", 1)
        if node.kwargs.get("beta", 1) != 1:
            return None
    av, bv, out = val(a), val(b), val(node)
    if not static(av, bv, out) or str(av.dtype) not in DTYPE_NAMES or layout_of(av) is None or layout_of(bv) is None:
        return None
    if any(written(n) for n in (a, b, bias) if n is not None):
        return None  # the kernel runs where its epilogue ends: after a write the contraction did not see
    if av.shape[-1] == 1:
        return None  # an outer product: the backend makes it a broadcast multiply (`outer`)
    start = ((Scale(float(alpha)), ()),) if alpha != 1 else ()
    if bias is not None:
        if not _is_bias(val(bias), out):
            return None  # a full [M, N] input of addmm / baddbmm is no bias vector
        start += ((BiasAdd(), ()),)
    return a, b, start, bias


def _is_bias(v: Any, out: Any) -> bool:
    """A vector over the output columns: shape [N] (or 1s then N) and the output's dtype."""
    return (static(v) and v.dtype == out.dtype and v.dim() >= 1 and v.shape[-1] == out.shape[-1]
            and v.numel() == out.shape[-1] and v.dim() <= out.dim())


def _match(node: fx.Node, allow_tf32: bool, scope: Scope) -> Match | None:
    found = _operands(node)
    if found is None:
        return None
    a, b, start, bias = found
    region = follow(scope, start, bias)
    try:
        expr = contraction_expr(val(a), val(b), region.steps, allow_tf32)
    except ExprError:
        return None
    return Match(expr, node, a, b, region.bias, region.last, region.unfused, region.inputs, region.nodes)


def _gated(mul: fx.Node, order: dict[fx.Node, int], allow_tf32: bool) -> GatedMatch | None:
    """The gated pair whose product `mul` is, either side the gate; None if it is none."""
    x, y = mul.args[:2]
    if not isinstance(x, fx.Node) or not isinstance(y, fx.Node) or x is y:
        return None
    for gate_side, up_side in ((x, y), (y, x)):
        found = _gated_as(gate_side, up_side, mul, order, allow_tf32) or _fused_as(gate_side, up_side, mul, order,
                                                                                   allow_tf32)
        if found is not None:
            return found
    return None


def _gated_as(gate_side: fx.Node, up_side: fx.Node, mul: fx.Node, order: dict[fx.Node, int],
              allow_tf32: bool) -> GatedMatch | None:
    """mul = gate_side * up_side as act(x @ w1 [+ b1]) * (x @ w2 [+ b2]), or None."""
    sides = []
    for side in (gate_side, up_side):
        node = _source(side)
        found = None if node is None or node.target not in (A.mm.default, A.addmm.default) else _operands(node)
        if found is None:
            return None
        region = follow(Scope(node, order, frozenset({mul})), found[2], found[3])
        if not is_view_of(side, region.last) or not _only_feeds(region.last, mul) or region.inputs:
            return None
        sides.append((node, found[0], found[1], region))
    (gate, xg, w1, rg), (up, xu, w2, ru) = sides
    bias = (BiasAdd(),) if rg.bias is not None else ()
    if gate is up or ru.steps != bias or rg.steps[:len(bias)] != bias or not _same(xg, xu):
        return None
    act = ACTIVATIONS.get(rg.steps[len(bias):])
    xv, w1v, w2v = val(xg), val(w1), val(w2)
    if act is None or layout_of(xv) or w1v.stride() != w2v.stride() or (ru.bias is None) != (rg.bias is None):
        return None
    if bias and (val(rg.bias).stride() != val(ru.bias).stride() or val(rg.bias).shape != val(ru.bias).shape):
        return None
    expr = _gated_expr(xv, w1v, w1v.shape[1], act, bool(bias), allow_tf32)
    return None if expr is None else GatedMatch(expr, gate, up, xg, w1, w2, rg.bias, ru.bias, mul)


def _fused_as(gate_side: fx.Node, up_side: fx.Node, mul: fx.Node, order: dict[fx.Node, int],
              allow_tf32: bool) -> GatedMatch | None:
    """mul = gate_side * up_side as act(y[..., g:g+N]) * y[..., u:u+N], y = x @ w [+ b] computed by
    one contraction read by nothing else (gate and up projections in one weight, as Phi-3's
    gate_up_proj): a gated pair whose weights are two column ranges of w; or None."""
    up_slice = viewed(up_side)
    up_cols = columns(up_slice)
    node = None if up_cols is None else viewed(up_cols[0])
    found = None if node is None or node.target not in (A.mm.default, A.addmm.default) else _operands(node)
    readers = None if found is None else column_readers(node)
    if readers is None or len(readers) != 2 or up_slice not in readers:
        return None
    x, w, start, bias = found
    (gate_slice, (g, g_end)), = ((r, c) for r, c in readers.items() if r is not up_slice)
    (u, u_end), n = readers[up_slice], g_end - g
    region = follow(Scope(gate_slice, order, frozenset({mul})), (), None)
    act = ACTIVATIONS.get(region.steps)
    if act is None or region.inputs or u_end - u != n or start != (((BiasAdd(), ()),) if bias is not None else ()):
        return None
    if not (is_view_of(gate_side, region.last) and _only_feeds(region.last, mul) and _only_feeds(up_slice, mul)):
        return None
    if layout_of(val(x)) or not val(gate_side).shape == val(up_side).shape == val(mul).shape:
        return None  # the product broadcast: no elementwise pair
    expr = _gated_expr(val(x), val(w), n, act, bias is not None, allow_tf32)
    return None if expr is None else GatedMatch(expr, node, node, x, w, w, bias, bias, mul, columns=(g, u))


def _gated_expr(x: Any, w: Any, n: int, act: str, bias: bool, allow_tf32: bool) -> Gated | None:
    """The Gated of x [M, K] times [K, n] weights laid out as `w`, None where there is none."""
    try:
        return Gated(x.shape[0], n, x.shape[1], DTYPE_NAMES[str(x.dtype)], act, trans_b=bool(layout_of(w)),
                     bias=bias, allow_tf32=allow_tf32)
    except ExprError:
        return None


def _source(node: fx.Node) -> fx.Node | None:
    """The first contraction reached going back from `node` through elementwise ops and views."""
    todo, seen = [node], set()
    while todo and len(seen) < MAX_NODES:
        n = todo.pop(0)
        if n.op != "call_function" or n in seen:
            continue
        if n.target in CONTRACTIONS:
            return n
        seen.add(n)
        if n.target in VIEWS or torch.Tag.pointwise in getattr(n.target, "tags", ()):
            todo.extend(n.all_input_nodes)
    return None


def _only_feeds(node: fx.Node, target: fx.Node) -> bool:
    """Whether `node` reaches `target` through single-user views and is read nowhere else."""
    while node is not target:
        if len(node.users) != 1:
            return False
        node = next(iter(node.users))
    return True


def _same(x: fx.Node, y: fx.Node) -> bool:
    """Whether two nodes hold the same tensor: one node, or equal views of one."""
    return _tensor_of(x) == _tensor_of(y)


def _tensor_of(x: fx.Node) -> tuple:
    """What equal views of one node share: the node viewed, the shape and strides (else the node)."""
    v = val(x)
    return (x.args[0], tuple(v.shape), tuple(v.stride())) if x.target in VIEWS else (x,)


def _wide(matches: list[Match], order: dict[fx.Node, int]) -> list[WideMatch]:
    """Projections of one input (the same K, dtype, weight layout, bias or none, no other epilogue)
    in groups of up to three, in graph order; one left over stays a contraction site."""
    groups: dict[tuple, list[Match]] = {}
    for m in matches:
        if _projection(m):
            e = m.expr
            groups.setdefault((_tensor_of(m.a), e.k, e.dtype, e.trans_b, e.has_bias, e.allow_tf32), []).append(m)
    found = []
    for members in groups.values():
        while len(members) > 1:
            group = _independent(members[:MAX_WEIGHTS], order)
            members = [m for m in members if not any(m is g for g in group)]
            if len(group) > 1:
                e = group[0].expr
                expr = Wide(e.m, tuple(p.expr.n for p in group), e.k, e.dtype, e.trans_b, e.has_bias, e.allow_tf32)
                found.append(WideMatch(expr, group[0].a, tuple(group)))
    return found


def _projection(m: Match) -> bool:
    """Whether a contraction is x @ w [+ b] of a row-major 2-D x, with nothing else fused."""
    plain = m.expr.epilogue in ((), (BiasAdd(),)) and not m.inputs and m.node.target in (A.mm.default, A.addmm.default)
    return plain and m.expr.batch == 1 and layout_of(val(m.a)) is False


def _independent(members: list[Match], order: dict[fx.Node, int]) -> list[Match]:
    """The first member and those after it with weights of their own (one weight twice is one
    product twice: nothing to share) whose weight and bias exist before the first member or are
    views of what does (the wide kernel runs in its place): none reads another's output."""
    first, group, weights = members[0].node, [], set()
    for m in members:
        if _weight(m.b) not in weights and all(_available(n, first, order) for n in (m.b, m.bias) if n is not None):
            group.append(m)
            weights.add(_weight(m.b))
    return group


def _weight(node: fx.Node) -> Any:
    """What a weight operand is a view of: a node, or the name of a parameter (tracing reads one
    parameter by a get_attr node per use)."""
    while node.target in ALIASES and len(node.all_input_nodes) == 1 and node.args[0] in node.all_input_nodes:
        node = node.args[0]
    return node.target if node.op == "get_attr" else node


def _available(node: fx.Node, point: fx.Node, order: dict[fx.Node, int]) -> bool:
    """Whether `node` comes before `point` in the graph, or is views of a node that does or of a
    parameter (a get_attr, which tracing places at its first use)."""
    for _ in range(MAX_NODES):
        if order[node] < order[point] or node.op == "get_attr":
            return True
        if node.target not in ALIASES or len(node.all_input_nodes) != 1 or node.args[0] not in node.all_input_nodes:
            return False
        node = node.args[0]
    return False
