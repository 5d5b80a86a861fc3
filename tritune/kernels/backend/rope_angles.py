"""Rotary tables computed from positions, recognised so that the attention kernel computes them and no
kernel of their own runs on every call. transformers' rotary embeddings (Llama, Qwen2, Mistral, NeoX)
build them from the positions and the layer's inverse frequencies (a buffer):

    freqs = positions.float() ⊗ inv_freq.float()        [.., rows, lanes/2] (a mul, or a bmm/matmul
                                                          of [B, lanes/2, 1] by [B, 1, rows])
    cos = (cat(freqs, freqs).cos() · scale).to(dtype)     sin alike

`angles(cos, sin)` finds what the two tables are computed from: the trigonometric op under each table
(through casts, views and scalar factors: the scale), the outer product under their shared cat, and
its two operands' sources before views, broadcasts and casts (the positions and the frequencies). It
then evaluates the graph between those sources and the tables on probe values and keeps the match
only where the tables are exactly that function of them: what counts is the values, not the form
one model or torch version writes.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from tritune.kernels.backend.epilogue_match import static, val
from tritune.kernels.backend.rotary_match import shape4

A = torch.ops.aten
# ops that move, broadcast or cast a value without changing which element holds what
PASSING = frozenset({A.view.default, A._unsafe_view.default, A.reshape.default, A.unsqueeze.default,
                     A.squeeze.dim, A.squeeze.dims, A.squeeze.default, A.expand.default, A.transpose.int,
                     A.permute.default, A.t.default, A.clone.default, A._to_copy.default, A.alias.default,
                     A.detach.default, A.lift_fresh_copy.default, A.slice.Tensor})
PRODUCTS = (A.mul.Tensor, A.bmm.default, A.mm.default, A.matmul.default)
POSITION_TYPES = {torch.int64: "i64", torch.int32: "i32"}
FREQ_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
MAX_STEPS = 12  # nodes walked from a table to its trigonometric op, or from a value to its source
MAX_PROBED = 64  # nodes the probe may evaluate


@dataclass(frozen=True)
class Angles:
    """Tables computed from `positions` (viewed to `view`: [batch or 1, 1, rows or 1, 1]) and
    `freqs` (lanes / 2 of them) as cos/sin(position·frequency)·`scale`."""

    positions: fx.Node
    freqs: fx.Node
    scale: float
    view: tuple[int, int, int, int]

    @property
    def pos_type(self) -> str:
        return POSITION_TYPES[val(self.positions).dtype]

    @property
    def freq_type(self) -> str:
        return FREQ_TYPES[val(self.freqs).dtype]


def angles(cos: Any, sin: Any) -> Angles | None:
    """What the rotary tables `cos` and `sin` are computed from, or None where they are not the
    function above of integer positions and floating frequencies (or cannot be evaluated)."""
    tables = (val(cos), val(sin))
    if not (isinstance(cos, fx.Node) and isinstance(sin, fx.Node) and static(*tables)
            and tables[0].shape == tables[1].shape and tables[0].dim() <= 4 and tables[0].dtype in FREQ_TYPES):
        return None
    (c_arg, c_scale), (s_arg, s_scale) = _trig(cos, A.cos.default), _trig(sin, A.sin.default)
    if c_arg is None or c_arg is not s_arg or c_scale != s_scale or not _doubled(c_arg):
        return None
    sources = _sources(c_arg.args[0][0])
    if sources is None:
        return None
    positions, freqs = sources
    batch, _, rows, lanes = shape4(tables[0])
    n = val(positions).numel()
    view = (batch if n == batch * rows and batch > 1 else 1, 1, rows, 1)
    if val(freqs).numel() * 2 != lanes or n not in (rows, batch * rows):
        return None
    found = Angles(positions, freqs, c_scale, view)
    return found if _probe_agrees(found, cos, sin) else None


def _trig(table: fx.Node, op: Any) -> tuple[fx.Node | None, float]:
    """(the argument of the `op` node `table` is computed from, the product of the scalar factors
    on the way), through casts, views and multiplications by numbers; (None, 0) if there is none."""
    scale, node = 1.0, table
    for _ in range(MAX_STEPS):
        if not (isinstance(node, fx.Node) and node.op == "call_function"):
            break
        if node.target == op:
            return node.args[0], scale
        if node.target in (A.mul.Tensor, A.mul.Scalar, A.div.Tensor, A.div.Scalar) and len(node.args) == 2:
            tensor, number = node.args if isinstance(node.args[0], fx.Node) else node.args[::-1]
            if not isinstance(number, (int, float)) or isinstance(number, bool) or not isinstance(tensor, fx.Node) \
                    or (node.target in (A.div.Tensor, A.div.Scalar) and tensor is not node.args[0]) or number == 0:
                break
            scale = scale / number if node.target in (A.div.Tensor, A.div.Scalar) else scale * number
            node = tensor
        elif node.target in PASSING:
            node = node.args[0]
        else:
            break
    return None, 0.0


def _doubled(cat: Any) -> bool:
    """Whether `cat` is cat([f, f]) along the last dimension."""
    if not (isinstance(cat, fx.Node) and cat.target == A.cat.default and len(cat.args[0]) == 2):
        return False
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    first, second = cat.args[0]
    return first is second and dim in (-1, val(cat).dim() - 1)


def _sources(freqs: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(positions, frequencies): the sources of the outer product `freqs` is a view of."""
    node = _source(freqs)
    if node is None or node.target not in PRODUCTS:
        return None
    operands = [a for a in node.args if isinstance(a, fx.Node)]
    if len(operands) != 2:
        return None
    found = [(s, val(s).dtype if s is not None and static(val(s)) else None) for s in map(_source, operands)]
    for (p, p_type), (f, f_type) in (found, found[::-1]):
        if p_type in POSITION_TYPES and f_type in FREQ_TYPES:
            return p, f
    return None


def _source(node: Any) -> fx.Node | None:
    """The value `node` is computed from by moving, broadcasting and casting alone."""
    for _ in range(MAX_STEPS):
        if not isinstance(node, fx.Node):
            return None
        if node.op != "call_function" or node.target not in PASSING:
            return node
        node = node.args[0]
    return None


def _probe_agrees(found: Angles, cos: fx.Node, sin: fx.Node) -> bool:
    """Whether the graph computes `cos` and `sin` from probe positions (0..4095) and frequencies
    (1e-4..1) as `found` says, to the tables' last bit (one unit in the last place of slack)."""
    gen = torch.Generator().manual_seed(0)
    pos_val, freq_val = val(found.positions), val(found.freqs)
    positions = torch.randint(0, 4096, tuple(pos_val.shape), generator=gen, dtype=pos_val.dtype)
    freqs = (1e4 ** -torch.rand(tuple(freq_val.shape), generator=gen, dtype=torch.float64)).to(freq_val.dtype)
    try:
        got = _evaluate((cos, sin), {found.positions: positions, found.freqs: freqs})
    except Exception:  # noqa: BLE001 - an op that cannot run on probe values: not recognised
        return False
    f = freqs.reshape(-1).float()
    angle = positions.reshape(found.view).float() * torch.cat([f, f])
    ulp = torch.finfo(val(cos).dtype).eps * max(abs(found.scale), 1.0)
    for table, want in zip(got, (angle.cos(), angle.sin())):
        want = (want * found.scale).to(table.dtype).float()
        table = table.float().reshape(shape4(table))
        if torch.broadcast_shapes(table.shape, want.shape) != table.shape \
                or not torch.allclose(table, want.expand(table.shape), rtol=0, atol=ulp):
            return False
    return True


class _NotProbed(Exception):
    """A value the probe cannot compute (a graph input, a fake tensor, too many nodes)."""


def _evaluate(targets: tuple[fx.Node, ...], given: dict[fx.Node, Any]) -> list[Any]:
    """The real values of `targets` on the CPU, with the `given` nodes' values in place of theirs."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    values: dict[fx.Node, Any] = dict(given)

    def value(node: fx.Node) -> Any:
        if node in values:
            return values[node]
        if len(values) > MAX_PROBED:
            raise _NotProbed(node.name)
        if node.op == "get_attr":
            found: Any = node.graph.owning_module
            for part in str(node.target).split("."):
                found = getattr(found, part)
            if isinstance(found, FakeTensor) or not isinstance(found, torch.Tensor):
                raise _NotProbed(node.name)
            values[node] = found.detach().cpu()
        elif node.op == "call_function" and (isinstance(node.target, torch._ops.OpOverload)
                                             or node.target is operator.getitem):
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
            kwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in kwargs.items()}
            values[node] = node.target(*args, **kwargs)
        else:
            raise _NotProbed(node.name)
        return values[node]

    with unset_fake_temporarily(), torch.no_grad():
        return [value(t) for t in targets]

