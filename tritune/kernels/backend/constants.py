"""Constant folding of what a graph computes from no input: a decoder's causal mask built from
`arange`s, comparisons and index ops (transformers builds it on every call, one token or many)
is the same tensor on every call, yet Inductor (without freezing) launches its kernels in every
step: four small kernels of a two-layer decode step. `fold_constants` computes such a value once,
when the graph is compiled, and the graph reads it as a constant.

Only values computed from no placeholder and no parameter or buffer are folded (weights and
buffers may change between calls), by deterministic ops, and only where nothing in the graph
writes to them or to a view of them; values the graph returns stay computed (the caller may write
to its output).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx

MAX_BYTES = 64 << 20  # a folded value's storage stays under this (a constant lives as long as the graph)
PREFIX = "_tritune_constant"


def fold_constants(gm: fx.GraphModule) -> int:
    """Replace each value of `gm`'s graph computed from no input (and read by a node that is) by a
    constant of the graph module computed now; how many were folded (the caller removes the dead
    nodes and recompiles)."""
    foldable = _foldable(gm)
    if not foldable:
        return 0
    values = _evaluate(gm, foldable)
    count = 0
    for node in foldable:
        if not _worth_keeping(node, values.get(node), foldable):
            continue
        name = f"{PREFIX}{count}"
        while hasattr(gm, name):
            name += "_"
        setattr(gm, name, values[node])  # a plain attribute: not a buffer, so not an input of the compiled graph
        with gm.graph.inserting_before(node):
            const = gm.graph.create_node("get_attr", name)  # (Graph.get_attr warns of a plain attribute)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const, delete_user_cb=lambda user: user not in foldable)
        count += 1
    return count


@contextlib.contextmanager
def constants_traceable(example_inputs: Sequence[Any]) -> Iterator[None]:
    """While a graph with folded constants is compiled: its fake mode (the one of `example_inputs`,
    if any) takes the constants' real tensors, as it would a graph's own tensor literals."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(example_inputs)
    if mode is None:
        yield
        return
    before = mode.allow_non_fake_inputs
    mode.allow_non_fake_inputs = True
    try:
        yield
    finally:
        mode.allow_non_fake_inputs = before


def _foldable(gm: fx.GraphModule) -> dict[fx.Node, None]:
    """The graph's op nodes whose tensor value depends on no placeholder, in graph order (none at
    all where the graph writes to a value that depends on no placeholder)."""
    from_input: set[fx.Node] = set()
    found: dict[fx.Node, None] = {}
    buffers = {id(b) for b in gm.buffers()}
    constants = {n for n in gm.graph.nodes if n.op == "get_attr" and _real_tensor(value := _attr(gm, n.target))
                 and not isinstance(value, torch.nn.Parameter) and id(value) not in buffers}
    for node in gm.graph.nodes:
        if node.op == "placeholder" or any(a in from_input for a in node.all_input_nodes):
            from_input.add(node)
        elif node.op == "call_function" and _pure(node.target) and _tensor_out(node) \
                and all(a in found or a in constants for a in node.all_input_nodes):
            found[node] = None
    if any(w not in from_input for node in gm.graph.nodes for w in _written(node)):
        return {}  # a write to a constant or a view of one: every call must compute it afresh
    return found


def _attr(gm: fx.GraphModule, target: Any) -> Any:
    value: Any = gm
    for part in str(target).split("."):
        value = getattr(value, part, None)
    return value


def _pure(target: Any) -> bool:
    """Whether an op gives the same output for the same inputs and writes to none of them."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target.__name__.startswith("empty"):
        return False
    return not any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)


def _written(node: fx.Node) -> list[fx.Node]:
    """The nodes an op node writes to (its mutable arguments); every argument of an op it cannot
    tell (not an ATen op overload)."""
    if node.op != "call_function":
        return []
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return [] if _is_plain_function(target) else list(node.all_input_nodes)
    written: list[fx.Node] = []
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            given = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            fx.node.map_arg(given, written.append)
    return written


def _is_plain_function(target: Any) -> bool:
    # operator.getitem and the like: they read, never write
    return getattr(target, "__module__", "") in ("_operator", "math")


def _tensor_out(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def _real_tensor(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)


def _evaluate(gm: fx.GraphModule, nodes: dict[fx.Node, None]) -> dict[fx.Node, Any]:
    """The real values of `nodes` (in graph order), computed outside any fake mode; a node whose op
    fails on real tensors is left out, as is every node computed from it."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    values: dict[fx.Node, Any] = {n: _attr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    with unset_fake_temporarily(), torch.no_grad():
        for node in nodes:
            if not all(a in values for a in node.all_input_nodes):
                continue
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
            try:
                values[node] = node.target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - an op that fails on real tensors stays in the graph
                continue
    return values


def _worth_keeping(node: fx.Node, value: Any, foldable: dict[fx.Node, None]) -> bool:
    """Whether `node` becomes a constant: read by a node that is not folded (not the graph's
    output), computed from another tensor (a lone factory such as `arange` or `full` is fused into
    its reader by Inductor anyway), and of a storage under MAX_BYTES."""
    readers = list(node.users)
    if not _real_tensor(value) or all(r in foldable for r in readers) or any(r.op == "output" for r in readers):
        return False
    if not any(isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes):
        return False
    return value.untyped_storage().nbytes() <= MAX_BYTES
