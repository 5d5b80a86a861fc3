"""Contractions in a traced model: each mm / addmm / bmm / baddbmm with the pointwise steps after it
that the contraction template fuses as its epilogue (bias, scale, relu, gelu). Outer products
(K = 1, e.g. rotary embeddings' position x frequency) are no contraction worth a kernel.

Task extraction and the torch.compile backend match on one normal form (`aten_graph`): the model
traced to ATen ops on fake tensors, where linear and matmul have decomposed into t / view +
mm / addmm / bmm and pointwise ops stay whole (aten.gelu stays gelu, unlike in Inductor's own
decompositions). Both therefore see the same workloads, and the backend finds what was tuned.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Epilogue, Gelu, Relu, Scale
from tritune.kernels.expr import ExprError
from tritune.kernels.frontend.ops import DTYPE_NAMES, contraction_expr, layout_of

A = torch.ops.aten
CONTRACTIONS = (A.mm.default, A.addmm.default, A.bmm.default, A.baddbmm.default)
RESHAPES = (A.view.default, A._unsafe_view.default, A.reshape.default)


@dataclass(frozen=True)
class Match:
    """One contraction and the epilogue fused after it.

    The kernel reads `a`, `b` (and `bias`) and its output replaces the value of `last` (the
    contraction itself, or the last fused pointwise op). `unfused` names the op after `last` that
    reads the result but cannot fuse (e.g. 'residual add'), or is empty.
    """

    expr: Matmul
    node: fx.Node
    a: fx.Node
    b: fx.Node
    bias: fx.Node | None
    last: fx.Node
    unfused: str = ""


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


def find(gm: fx.GraphModule, allow_tf32: bool = True) -> list[Match]:
    """Every contraction of the graph that a tritune kernel can compute, in graph order."""
    found = (_match(n, allow_tf32) for n in gm.graph.nodes if n.op == "call_function" and n.target in CONTRACTIONS)
    return [m for m in found if m is not None]


def val(node: Any) -> Any:
    """The fake tensor (or constant) a node computes."""
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def _static(*tensors: Any) -> bool:
    return all(isinstance(t, torch.Tensor) and all(type(d) is int for d in (*t.shape, *t.stride()))
               for t in tensors)


def _match(node: fx.Node, allow_tf32: bool) -> Match | None:
    if node.target in (A.mm.default, A.bmm.default):
        (a, b), bias, alpha = node.args[:2], None, 1
    else:
        (bias, a, b), alpha = node.args[:3], node.kwargs.get("alpha", 1)
        if node.kwargs.get("beta", 1) != 1:
            return None
    av, bv, out = val(a), val(b), val(node)
    if not _static(av, bv, out) or str(av.dtype) not in DTYPE_NAMES or layout_of(av) is None or layout_of(bv) is None:
        return None
    if av.shape[-1] == 1:
        return None  # an outer product: Inductor makes it a broadcast multiply, fused with its neighbours
    steps: list[Epilogue] = [Scale(float(alpha))] if alpha != 1 else []
    if bias is not None:
        if not _is_bias(val(bias), out):
            return None  # a full [M, N] input of addmm / baddbmm is no bias vector
        steps.append(BiasAdd())
    last, bias, unfused = _follow(node, steps, bias)
    try:
        expr = contraction_expr(av, bv, steps, allow_tf32)
    except ExprError:
        return None
    return Match(expr, node, a, b, bias, last, unfused)


def _is_bias(v: Any, out: Any) -> bool:
    """A vector over the output columns: shape [N] (or 1s then N) and the output's dtype."""
    return (_static(v) and v.dtype == out.dtype and v.dim() >= 1 and v.shape[-1] == out.shape[-1]
            and v.numel() == out.shape[-1] and v.dim() <= out.dim())


def _follow(node: fx.Node, steps: list[Epilogue], bias: fx.Node | None) -> tuple[fx.Node, fx.Node | None, str]:
    """Walk the single-user chain after a contraction, appending fusable steps; stop at anything else."""
    out = val(node)
    cur = last = node
    while len(cur.users) == 1:
        user = next(iter(cur.users))
        uv = val(user)
        if user.op != "call_function" or not _static(uv) or uv.dtype != out.dtype:
            break
        if user.target in RESHAPES:
            if uv.shape[-1] != out.shape[-1]:
                break  # a reshape that regroups columns would change what a bias index means
            cur = user
            continue
        step, extra = _step(user, cur, out, bias is not None)
        if step is None:
            return last, bias, extra if isinstance(extra, str) else ""
        steps.append(step)
        bias = extra if isinstance(extra, fx.Node) else bias
        cur = last = user
    return last, bias, ""


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _step(user: fx.Node, cur: fx.Node, out: Any, has_bias: bool) -> tuple[Epilogue | None, Any]:
    """The epilogue step `user` applies to `cur` (and a new bias node), or None and why not."""
    t, args, kwargs = user.target, user.args, user.kwargs
    if t == A.gelu.default:
        return Gelu(kwargs.get("approximate", "none")), None
    if t == A.relu.default:
        return Relu(), None
    if t in (A.mul.Tensor, A.mul.Scalar):
        other = args[1] if args[0] is cur else args[0]
        return (Scale(float(other)), None) if _number(other) else (None, None)
    if t in (A.div.Tensor, A.div.Scalar) and args[0] is cur and "rounding_mode" not in kwargs:
        return (Scale(1.0 / args[1]), None) if _number(args[1]) and args[1] != 0 else (None, None)
    if t == A.add.Tensor and kwargs.get("alpha", 1) == 1:
        other = args[1] if args[0] is cur else args[0]
        if not isinstance(other, fx.Node) or other is cur:
            return None, None
        if not has_bias and _is_bias(val(other), out):
            return BiasAdd(), other
        # a second [M, N] tensor needs an epilogue input the contraction template does not have yet
        return None, "residual add" if _static(val(other)) and val(other).numel() == val(user).numel() else None
    return None, None
