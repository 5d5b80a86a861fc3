"""The row-reduction family: softmax and layernorm over the last dimension, one space for both."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels.expr import DTYPE_BYTES, TOLERANCE, ExprError, check_options, parse_dims, torch_dtype
from tritune.kernels.family import Family, Operands
from tritune.kernels.rows.expr import AWKWARD, LayerNorm, RowOp, Softmax
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space


class RowFamily(Family):
    """y[m, :] = f(x[m, :]) over rows of an [M, N] tensor (any row strides), fp16/bf16/fp32."""

    sources = ("rows/expr.py", "rows/template.py")
    template_version = 1
    launch_module = "tritune.kernels.rows.template"

    def __init__(self, expr_type: type[RowOp], options: tuple[str, ...] = ()) -> None:
        self.expr_type, self.op, self.options = expr_type, expr_type.op, options
        self.baseline = f"torch ({'F.layer_norm' if expr_type is LayerNorm else 'torch.softmax'})"

    def from_dict(self, spec: dict) -> RowOp:
        return self.expr_type.from_dict(spec)

    @property
    def cli_help(self) -> str:
        return "--shape M,N (rows, row length)" + "".join(f"; --{o} X" for o in self.options)

    def examples(self) -> tuple:
        return tuple(e for e in AWKWARD if isinstance(e, self.expr_type))

    def from_cli(self, shape: str, dtype: str, options: dict[str, str]) -> RowOp:
        check_options(options, self.options, self.op)
        m, n = parse_dims(shape, (2,), "M,N")
        extra = {}
        for name in self.options:
            if name in options:
                try:
                    extra[name] = float(options[name])
                except ValueError:
                    raise ExprError(f"bad --{name} {options[name]!r}: expected a number") from None
        return self.expr_type(m, n, dtype, **extra)

    def rate(self, expr: RowOp, ms: float | None) -> tuple[float, str]:
        """Bandwidth: the bytes the op must move (`expr.bytes`) per second, in TB/s."""
        return (expr.bytes / (ms * 1e-3) / 1e12 if ms else 0.0), "TB/s"

    # ----- schedules and cost model
    def space(self, expr: RowOp, limits: Limits) -> Space:
        from tritune.schedules.rows import rows_space

        return rows_space(expr.m, expr.n, DTYPE_BYTES[expr.dtype], limits)

    def features(self, expr: RowOp, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        from tritune.kernels.rows.features import features

        return features(expr, limits, configs)

    def default_config(self, expr: RowOp) -> Config:
        """One row per program in 1024-element chunks: valid for any shape (replay's last resort)."""
        return Config.of(ROWS=1, BLOCK_N=1024, num_warps=4)

    # ----- semantics
    def inputs(self, expr: RowOp, seed: int, device: str) -> Operands:
        """x ~ N(0, 1) shifted by 3 (a mean that a naive variance would lose), weight, bias, NaN y."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        dt = torch_dtype(expr.dtype)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device).to(dt)

        x = (rand(expr.m, expr.n).float() + 3).to(dt)
        y = torch.full((expr.m, expr.n), float("nan"), device=device, dtype=dt)
        return Operands((x, rand(expr.n), rand(expr.n), y) if isinstance(expr, LayerNorm) else (x, y), y)

    def reference(self, expr: RowOp, args: tuple) -> Any:
        import torch
        import torch.nn.functional as F

        x = args[0].double()
        if isinstance(expr, LayerNorm):
            return F.layer_norm(x, (expr.n,), args[1].double(), args[2].double(), expr.eps)
        return torch.softmax(x, -1)

    def eager(self, expr: RowOp, x: Operands) -> Callable[[], Any]:
        """torch.softmax into the output (out=); F.layer_norm, which has no out=, into a fresh tensor
        (a copy into the output would add a read and a write of it to torch's time)."""
        import torch
        import torch.nn.functional as F

        if isinstance(expr, LayerNorm):
            inp, weight, bias, _ = x.args
            return lambda: F.layer_norm(inp, (expr.n,), weight, bias, expr.eps)
        return lambda: torch.softmax(x.args[0], -1, out=x.out)

    def expression(self, expr: RowOp) -> Callable[..., Any]:
        import torch
        import torch.nn.functional as F

        if isinstance(expr, LayerNorm):
            return lambda x, weight, bias, out: F.layer_norm(x, (expr.n,), weight, bias, expr.eps)
        return lambda x, out: torch.softmax(x, -1)

    def tolerance(self, expr: RowOp) -> float:
        # fp32 math: the output rounding of the storage type dominates, as for matmul
        return TOLERANCE[expr.dtype]


SOFTMAX = RowFamily(Softmax)
LAYERNORM = RowFamily(LayerNorm, options=("eps",))
