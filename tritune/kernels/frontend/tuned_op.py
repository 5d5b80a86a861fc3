"""`torch.ops.tritune.matmul(a, b, bias, spec)`: the op a compiled graph calls for a tuned contraction.

`spec` (a string, so that Inductor's generated code and its caches carry it) names the expression,
the config and the operand layouts of one call site. Its kernel is built once, at compile time (or
on first use, when Inductor loads the graph from its cache in another process); a call checks that
the operands still have the layout and 16-byte alignment the binary assumes, which Inductor keeps
(the op asks for exact strides), and otherwise runs the same config through `tritune.ops`.
"""
from __future__ import annotations

import json
from typing import Any

import torch

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.contraction.launch import Kernel, problem_of
from tritune.kernels.expr import torch_dtype
from tritune.kernels.frontend import ops
from tritune.schedules.config import Config

_LIB = torch.library.Library("tritune", "DEF")
# Inductor then hands the op its operands with the strides seen at trace time (newer torch only)
_TAGS = tuple(t for t in (getattr(torch.Tag, "needs_exact_strides", None),) if t is not None)
_LIB.define("matmul(Tensor a, Tensor b, Tensor? bias, str spec) -> Tensor", tags=_TAGS)
OP = torch.ops.tritune.matmul.default


def _layout(t: Any) -> list | None:
    return None if t is None else [list(t.shape), list(t.stride()), t.storage_offset() * t.element_size() % 16]


def spec_of(expr: Matmul, config: Config, a: Any, b: Any, bias: Any) -> str:
    """The op's spec for one call site: expression, config, and the operands' shapes, strides and
    alignment (tensors, real or fake)."""
    return json.dumps({"expr": expr.to_dict(), "config": json.loads(config.to_json()),
                       "layout": [_layout(a), _layout(b), _layout(bias)]}, sort_keys=True, separators=(",", ":"))


class Bound:
    """One call site's kernel, prebuilt for the operand layout in its spec."""

    def __init__(self, spec: str) -> None:
        data = json.loads(spec)
        self.expr, self.config = Matmul.from_dict(data["expr"]), Config.of(data["config"])
        metas = [None if x is None else _meta(x, self.expr) for x in data["layout"]]
        a, b, bias = metas
        batched = 3 in (a.dim(), b.dim())
        self.out_shape = (self.expr.batch, self.expr.m, self.expr.n) if batched else (self.expr.m, self.expr.n)
        out = torch.empty(self.out_shape, dtype=a.dtype, device="meta")
        self.out_strides = out.stride()
        self.expect = tuple(None if t is None else (t.shape, t.stride()) for t in metas)
        # a pointer the binary assumes 16-byte aligned must be; one it does not assume may be anything
        self.masks = tuple(0 if x is None or x[2] else 15 for x in data["layout"])
        self.kernel = Kernel(self.expr, self.config, problem_of(self.expr, a, b, out, bias))

    def __call__(self, a: Any, b: Any, bias: Any) -> Any:
        """Launch on the operands (the prebuilt binary when their layout matches, else through ops)."""
        (ea, eb, ebias), (ma, mb, mbias) = self.expect, self.masks
        if (a.stride() == ea[1] and b.stride() == eb[1] and a.shape == ea[0] and b.shape == eb[0]
                and not (a.data_ptr() & ma or b.data_ptr() & mb)
                and (bias is None if ebias is None else bias.stride() == ebias[1] and not bias.data_ptr() & mbias)):
            out = torch.empty_strided(self.out_shape, self.out_strides, dtype=a.dtype, device=a.device)
            self.kernel(a, b, out, bias)
            return out
        return ops.matmul(a, b, bias, epilogue=self.expr.epilogue, config=self.config, allow_tf32=self.expr.allow_tf32)


def _meta(layout: list, expr: Matmul) -> Any:
    shape, strides, misalign = layout
    base = torch.empty_strided(shape, strides, dtype=torch_dtype(expr.dtype), device="meta")
    # an offset that keeps the layout but gives the data pointer the same alignment as the real operand
    return base.as_strided(shape, strides, misalign // base.element_size()) if misalign else base


_bound: dict[str, Bound] = {}


def bind(spec: str) -> Bound:
    """The call site of a spec, building its kernel (on the current device) on first use."""
    site = _bound.get(spec)
    if site is None:
        site = _bound[spec] = Bound(spec)
    return site


def _impl(a: Any, b: Any, bias: Any, spec: str) -> Any:
    return (_bound.get(spec) or bind(spec))(a, b, bias)


def _fake(a: Any, b: Any, bias: Any, spec: str) -> Any:
    shape = (max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1), a.shape[-2], b.shape[-1])
    return a.new_empty(shape if 3 in (a.dim(), b.dim()) else shape[1:])


_LIB.impl("matmul", _impl, "CompositeExplicitAutograd")
torch.library.register_fake("tritune::matmul", _fake, lib=_LIB)
