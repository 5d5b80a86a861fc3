"""A contraction's pointwise epilogue read off a traced ATen graph: the elementwise ops after it,
as the steps of `tritune.kernels.epilogue` (built through `pointwise.unary` / `pointwise.binary`,
so each op takes its one canonical form), with the extra tensors they read as epilogue inputs.

The walk starts at the contraction's value v and moves from one point to the next point where
every path out of the previous one meets again: a single user (v -> silu(v)), or a small DAG whose
ops all compute from v (v * sigmoid(v); GPT-2's 0.5*v*(1+tanh(...)) written as pointwise ops).
Each node reached is a chain of steps on v; a two-operand node whose both sides are chains
becomes, at their last common point, a binary step whose operand is the other side's remaining
chain (rsub / rdiv when the point itself is the left operand; a constant factor on one side of a
product moves after it). Anything else ends the epilogue at the last point reached: an unknown op,
a value read outside the epilogue, a dtype or shape change, a tensor computed from v some other way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from tritune.kernels.epilogue import BiasAdd, Binary, Clamp, Epilogue, Input, Pow, Scale
from tritune.kernels.expr import ExprError
from tritune.kernels.backend.helpers import DTYPE_NAMES
from tritune.kernels.pointwise import binary, unary

A = torch.ops.aten
VIEWS = (A.view.default, A._unsafe_view.default, A.reshape.default)
# ops whose output may share its input's memory (what a write to one changes in the other)
ALIASES = (*VIEWS, A.t.default, A.transpose.int, A.permute.default, A.expand.default, A.slice.Tensor,
           A.select.int, A.unsqueeze.default, A.squeeze.dim, A.alias.default)
MAX_NODES = 64  # nodes explored from one point before giving up on paths meeting again

# a chain: each step with the graph nodes of the extra inputs it reads (in kernel order)
Link = tuple[Epilogue, tuple[fx.Node, ...]]
Chain = tuple[Link, ...]

UNARY = {getattr(A, name).default: name for name in
         ("relu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "erf", "neg")}
BINARY = {A.add.Tensor: "add", A.add.Scalar: "add", A.sub.Tensor: "sub", A.sub.Scalar: "sub",
          A.rsub.Tensor: "rsub", A.rsub.Scalar: "rsub", A.mul.Tensor: "mul", A.mul.Scalar: "mul",
          A.div.Tensor: "div", A.div.Scalar: "div", A.maximum.default: "max", A.minimum.default: "min"}
IDENTITIES = (Scale(1.0), Binary("add", 0.0))  # x * 1, x / 1, x + 0, x - 0 (torch writes 1 / x as reciprocal(x) * 1)
# the op with its operands swapped: what `other (fn) v` is as a step on v
SWAPPED = {"add": "add", "mul": "mul", "max": "max", "min": "min", "sub": "rsub", "rsub": "sub", "div": "rdiv",
           "rdiv": "div"}


def val(node: Any) -> Any:
    """The fake tensor (or constant) a node computes."""
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def static(*tensors: Any) -> bool:
    """Whether every value is a tensor of concrete sizes and strides."""
    return all(isinstance(t, torch.Tensor) and all(type(d) is int for d in (*t.shape, *t.stride()))
               for t in tensors)


@dataclass
class Scope:
    """What one walk needs: the contraction, the graph's node order, and the nodes it must not
    fuse (those of earlier sites, or a boundary)."""

    node: fx.Node
    order: dict[fx.Node, int]
    claimed: frozenset[fx.Node] = frozenset()

    @property
    def out(self) -> Any:
        """The contraction's value."""
        return val(self.node)


@dataclass(frozen=True)
class Region:
    """The fused epilogue: its steps, the node whose value the kernel's output replaces, the bias
    and extra-input nodes, every node the kernel computes, and the op that stopped the walk."""

    steps: tuple[Epilogue, ...]
    last: fx.Node
    bias: fx.Node | None
    inputs: tuple[fx.Node, ...]
    nodes: frozenset[fx.Node]
    unfused: str = ""


def follow(scope: Scope, start: Chain, bias: fx.Node | None) -> Region:
    """The epilogue after `scope.node`, whose first steps (`start`: alpha, an addmm's bias) are known."""
    cur, chain, nodes = scope.node, start, {scope.node}
    last, last_chain, done = cur, chain, frozenset(nodes)
    while not isinstance(step := _advance(scope, cur, chain), str):
        cur, chain, added = step
        nodes |= added
        if cur.target not in VIEWS:  # views after the last op stay in the graph, on the kernel's output
            last, last_chain, done = cur, chain, frozenset(nodes)
    steps, inputs = _split(last_chain)
    if bias is None:
        steps, inputs, bias = _bias_first(steps, inputs, scope.out)
    return Region(steps, last, bias, inputs, done, step)


def _advance(scope: Scope, cur: fx.Node, chain: Chain) -> tuple[fx.Node, Chain, set] | str:
    """The next point after `cur` where all its paths meet, its chain and the nodes on the way; or
    why there is none (the name of a pointwise op that could not fuse, or '')."""
    chains: dict[fx.Node, Chain] = {cur: chain}
    pending = {cur}  # points whose users are not all reached yet
    while len(chains) <= MAX_NODES:
        users = [u for p in pending for u in p.users if u not in chains]
        if not users:
            return ""
        # in graph order: an operand from the region is reached before its user, and a tensor
        # computed from the contraction some other way (a row sum ...) stops the walk before
        # anything could read it as an extra input
        user = min(users, key=scope.order.__getitem__)
        got = _chain(scope, user, chains)
        if got is None:
            return _name(user) if pending == {cur} and len(cur.users) == 1 else ""
        chains[user] = got
        pending = {p for p in (*pending, user) if any(u not in chains for u in p.users)}
        if pending == {user}:
            return user, got, set(chains) - {cur}
    return ""


def _name(node: fx.Node) -> str:
    """An elementwise ATen op's name ('' for anything else), to say what did not fuse."""
    target = node.target
    if node.op == "call_function" and torch.Tag.pointwise in getattr(target, "tags", ()):
        return target.__name__.split(".")[0]
    return ""


def _chain(scope: Scope, node: fx.Node, chains: dict[fx.Node, Chain]) -> Chain | None:
    """The chain computing `node` from the contraction's value, or None where it cannot fuse."""
    v = val(node)
    if node.op != "call_function" or node in scope.claimed or not static(v) or v.dtype != scope.out.dtype:
        return None
    if v.shape[-1:] != scope.out.shape[-1:]:
        return None  # a reshape that regroups columns would change what a column vector means
    if node.target in VIEWS:
        return chains.get(node.args[0])
    if any(val(a).shape != v.shape for a in node.all_input_nodes if a in chains):
        return None  # the value broadcast to a larger shape
    try:
        if node.target in BINARY:
            return _binary(scope, node, BINARY[node.target], chains)
        step = _unary(node)
        return None if step is None or node.args[0] not in chains else chains[node.args[0]] + step
    except ExprError:  # a step whose constants the epilogue does not take (pow 9, clamp 0 alone ...)
        return None


def _arguments(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by their schema names, defaults filled in."""
    schema = node.target._schema
    return {a.name: node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value)
            for i, a in enumerate(schema.arguments)}


def _unary(node: fx.Node) -> Chain | None:
    """The steps of a one-tensor elementwise op on its first argument (() for an identity)."""
    t, args = node.target, _arguments(node)
    if t in UNARY:
        return _link(unary(UNARY[t]))
    if t == A.gelu.default:
        return _link(unary("gelu_tanh" if args["approximate"] == "tanh" else "gelu"))
    if t in (A.clamp.default, A.clamp_min.default, A.clamp_max.default, A.hardtanh.default):
        lo, hi = args.get("min", args.get("min_val")), args.get("max", args.get("max_val"))
        if lo is not None and hi is not None:
            return _link(Clamp(lo, hi))
        return _link(binary("max", lo)) if lo is not None else _link(binary("min", hi)) if hi is not None else ()
    if t == A.reciprocal.default:
        return _link(binary("rdiv", 1.0))
    if t == A.pow.Tensor_Scalar:
        return _power(args["exponent"])
    return None


def _power(e: Any) -> Chain | None:
    """x ** e for the exponents the epilogue has a step for."""
    named = {1: (), 0.5: _link(unary("sqrt")), -0.5: _link(unary("rsqrt")), -1: _link(binary("rdiv", 1.0))}
    if not isinstance(e, (int, float)) or isinstance(e, bool):
        return None
    if e in named:
        return named[e]
    return _link(Pow(int(e))) if float(e).is_integer() else None


def _link(step: Epilogue, nodes: tuple[fx.Node, ...] = ()) -> Chain:
    return ((step, nodes),)


def _binary(scope: Scope, node: fx.Node, fn: str, chains: dict[fx.Node, Chain]) -> Chain | None:
    """A two-operand op: on one side a chain, on the other a constant, an extra input or a chain."""
    args = _arguments(node)
    x, y = args["self"], args["other"]
    if args.get("alpha", 1) != 1 or args.get("rounding_mode") is not None:
        return None
    if x in chains and y in chains:
        return _merge(fn, chains[x], chains[y])
    ours, other = (x, y) if x in chains else (y, x)
    fn = fn if ours is x else SWAPPED[fn]
    if isinstance(other, (int, float)) and not isinstance(other, bool):
        step = binary(fn, float(other))
        return chains[ours] + (() if step in IDENTITIES else _link(step))
    kind = _input(scope, other) if isinstance(other, fx.Node) else None
    return None if kind is None else chains[ours] + _link(binary(fn, kind), (other,))


def _input(scope: Scope, node: fx.Node) -> Input | None:
    """What an outside tensor is to the contraction's [B,]M,N output: a full residual ('mn'), a
    vector over its rows ('m') or its columns ('n'); None for anything else."""
    v, out = val(node), scope.out
    if not static(v) or v.dim() == 0 or str(v.dtype) not in DTYPE_NAMES:
        return None
    if written(node):
        return None  # the kernel, where the epilogue ends, could read it after a write the op saw before
    batch, (m, n) = (out.shape[0] if out.dim() == 3 else 1), out.shape[-2:]
    if v.numel() == n and v.shape[-1] == n:
        kind = "n"
    elif v.numel() == m and v.shape[-1] == 1 and (batch == 1 or v.dim() >= 2 and v.shape[-2] == m):
        kind = "m"  # with a batch, the rows must stay apart from it: [B, M, N] against [M, 1]
    elif v.numel() == out.numel():
        kind = "mn"
    else:
        return None
    return Input(kind, DTYPE_NAMES[str(v.dtype)])


def _merge(fn: str, left: Chain, right: Chain) -> Chain | None:
    """`left (fn) right` for two chains on the same value: at their last common point, the side
    that is that point takes the other side's rest as a nested chain."""
    k = 0
    while k < min(len(left), len(right)) and left[k] == right[k]:
        k += 1
    head, lrest, rrest = left[:k], left[k:], right[k:]
    if not lrest and not rrest:  # x (fn) x
        same = {"mul": _link(Pow(2)), "add": _link(Scale(2.0)), "max": (), "min": ()}
        return head + same[fn] if fn in same else None
    if not lrest or not rrest:
        rest, fn = (rrest, fn) if not lrest else (lrest, SWAPPED[fn])
        return head + _nested(fn, rest)
    if fn == "mul":  # (c * x) * g(x) == (x * g(x)) * c
        for scaled, rest in ((lrest, rrest), (rrest, lrest)):
            if all(isinstance(s, Scale) for s, _ in scaled):
                factor = math.prod(s.alpha for s, _ in scaled)
                return head + _nested("mul", rest) + (_link(Scale(factor)) if factor != 1 else ())
    return None


def _nested(fn: str, rest: Chain) -> Chain:
    steps, nodes = _split(rest)
    return _link(Binary(fn, steps), nodes)


def _split(chain: Chain) -> tuple[tuple[Epilogue, ...], tuple[fx.Node, ...]]:
    """The steps of a chain, and its input nodes in kernel order."""
    return tuple(s for s, _ in chain), tuple(n for _, nodes in chain for n in nodes)


def _bias_first(steps: tuple[Epilogue, ...], inputs: tuple[fx.Node, ...], out: Any
                ) -> tuple[tuple[Epilogue, ...], tuple[fx.Node, ...], fx.Node | None]:
    """The first top-level add of a column vector in the output dtype is the bias (the form
    `x @ w + b` has always been stored in); the rest stay extra inputs."""
    seen = 0
    for i, s in enumerate(steps):
        if (isinstance(s, Binary) and s.fn == "add" and s.other == Input("n", _dtype(out))):
            bias = inputs[seen]
            return (*steps[:i], BiasAdd(), *steps[i + 1:]), inputs[:seen] + inputs[seen + 1:], bias
        seen += len(s.inputs())
    return steps, inputs, None


def _dtype(t: Any) -> str:
    return DTYPE_NAMES.get(str(t.dtype), "")


def written(node: fx.Node, exact: bool = False) -> bool:
    """Whether an op of the graph writes the tensor of `node` in place, directly or through a view
    (of it, or of what it views): any mutating op it is passed to, or, `exact`, only as an
    argument that op's schema writes."""
    while node.target in ALIASES and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        seen.add(n)
        for u in n.users:
            if _writes(u, n) if exact else getattr(getattr(u.target, "_schema", None), "is_mutable", False):
                return True
            if u.target in ALIASES and u not in seen:
                todo.append(u)
    return False


def _writes(op: fx.Node, n: fx.Node) -> bool:
    """Whether `op` takes `n` as an argument its schema writes (positional or by name)."""
    schema = getattr(op.target, "_schema", None)
    if schema is None:
        return False
    given = [*zip(schema.arguments, op.args), *((a, op.kwargs.get(a.name)) for a in schema.arguments)]
    return any(v is n and getattr(a.alias_info, "is_write", False) for a, v in given)


def is_view_of(node: Any, source: fx.Node) -> bool:
    """Whether `node` is `source` or reshapes of it."""
    while isinstance(node, fx.Node) and node is not source and node.target in VIEWS:
        node = node.args[0]
    return node is source

