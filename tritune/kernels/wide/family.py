"""The wide GEMM family (`--op wide`): x @ W_iᵀ [+ b_i] for 2 or 3 weights sharing x, one launch."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels.expr import DTYPE_BYTES, TOLERANCE, check_dtype, check_options, parse_dims, torch_dtype
from tritune.kernels.family import Family, Operands
from tritune.kernels.norm import rms_norm
from tritune.kernels.wide import launch
from tritune.kernels.weights import Concatenated, as_kn, weight_options
from tritune.kernels.wide.expr import AWKWARD, Wide
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space


class WideFamily(Family):
    """outs_i = x @ W_iᵀ [+ b_i], i = 1..2 or 3 (q, k, v); fp16/bf16/fp32, both weight layouts."""

    op = "wide"
    baseline = "torch (one cuBLAS GEMM per weight)"
    sources = ("wide/expr.py", "wide/template.py", "wide/launch.py", "contraction/template.py", "contraction/launch.py",
               "weights.py", "norm.py")
    template_version = 1
    launch_module = "tritune.kernels.wide.launch"

    def from_dict(self, spec: dict) -> Wide:
        return Wide.from_dict(spec)

    @property
    def cli_help(self) -> str:
        return ("--shape M,N1,N2[,N3],K (tokens, each projection's output width, input width); --layout nt "
                "(weights [N,K], default) | nn ([K,N]); --epilogue bias (a bias on each projection)")

    def examples(self) -> tuple:
        return AWKWARD

    def from_cli(self, shape: str, dtype: str, options: dict[str, str]) -> Wide:
        check_options(options, ("layout", "epilogue"), self.op)
        m, *ns, k = parse_dims(shape, (4, 5), "M,N1,N2[,N3],K (2 or 3 output widths)")
        check_dtype(dtype)
        trans_b, bias = weight_options(options, self.op)
        return Wide(m, tuple(ns), k, dtype, trans_b=trans_b, bias=bias)

    # ----- schedules and cost model
    def space(self, expr: Wide, limits: Limits) -> Space:
        from tritune.schedules.wide import wide_space

        tma = launch.tma_unfit(expr, launch.canonical_problem(expr)) is None
        return wide_space(expr.m, expr.ns, expr.k, DTYPE_BYTES[expr.dtype], limits, tma=tma, k_last=expr.trans_b)

    def features(self, expr: Wide, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        from tritune.kernels.wide.features import features

        return features(expr, limits, configs)

    def default_config(self, expr: Wide) -> Config:
        return launch.DEFAULT

    # ----- semantics
    def inputs(self, expr: Wide, seed: int, device: str) -> Operands:
        """x [M, K], the weights ([N_i, K], or [K, N_i]), the outputs, then the biases [N_i]. The
        outputs are the column blocks of one NaN [M, sum N_i] buffer (the `out` checked): every
        candidate writes its outputs in place, the concatenated-weight library its one product.
        With a row norm, its weight [K] last."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device).to(torch_dtype(expr.dtype))

        m, k = expr.m, expr.k
        x, ws = rand(m, k), [rand(n, k) if expr.trans_b else rand(k, n) for n in expr.ns]
        out = torch.full((m, sum(expr.ns)), float("nan"), device=device, dtype=torch_dtype(expr.dtype))
        cs = list(out.split(list(expr.ns), dim=1))
        bs = [rand(n) for n in expr.ns] if expr.bias else []
        return Operands((x, *ws, *cs, *bs, *([rand(k)] if expr.norm_eps is not None else [])), out)

    def reference(self, expr: Wide, args: tuple) -> Any:
        import torch

        return torch.cat(products(expr, *args, dtype=torch.float64), dim=1)

    def eager(self, expr: Wide, x: Operands) -> Callable[[], Any]:
        return lambda: self.library(expr, "mm")(*x.args)

    def expression(self, expr: Wide) -> Callable[..., Any]:
        """The products as a model computes them: a tuple of fresh outputs."""
        return lambda *args: tuple(products(expr, *args))

    def libraries(self, expr: Wide) -> tuple[str, ...]:
        """What a user has without tritune (cuBLAS through torch): one GEMM per weight ('mm', addmm
        with biases), or one GEMM over the weights concatenated once ('mm_cat'); both write the
        outputs in place."""
        return ("mm", "mm_cat")

    def library(self, expr: Wide, name: str) -> Callable[..., Any]:
        import torch

        super().library(expr, name)  # raises for a name the expression has none of
        cat = Concatenated(expr.trans_b)

        def run(*args: Any) -> Any:
            x, ws, cs, bs = launch.split(expr, args)
            x, whole = _normed(expr, x, launch.norm_weight(expr, args)), _whole(cs)
            if name == "mm_cat":
                w, b = cat(ws, bs)
                return torch.addmm(b, x, w, out=whole) if expr.bias else torch.mm(x, w, out=whole)
            for w, c, b in zip(ws, cs, bs):
                w = as_kn(expr.trans_b, w)
                torch.addmm(b, x, w, out=c) if expr.bias else torch.mm(x, w, out=c)
            return whole
        return run

    def tolerance(self, expr: Wide) -> float:
        return TOLERANCE["tf32" if expr.tf32 else expr.dtype]


def products(expr: Wide, *args: Any, dtype: Any = None) -> list:
    """Each x @ W_iᵀ [+ b_i] as functional torch ops, in `dtype` (default: the operands')."""
    x, ws, _, bs = launch.split(expr, args)
    g = launch.norm_weight(expr, args)
    if dtype is not None:
        x, g = x.to(dtype), None if g is None else g.to(dtype)
    x = _normed(expr, x, g)
    outs = []
    for w, b in zip(ws, bs):
        y = x @ as_kn(expr.trans_b, w if dtype is None else w.to(dtype))
        outs.append(y if b is None else y + (b if dtype is None else b.to(dtype)))
    return outs


def _normed(expr: Wide, x: Any, g: Any) -> Any:
    """x as the products read it: through the row norm, if any."""
    return x if g is None else rms_norm(x, g, expr.norm_eps)


def _whole(cs: Sequence[Any]) -> Any:
    """The [M, sum N_i] buffer whose column blocks the outputs are (WideFamily.inputs), else the
    outputs concatenated."""
    import torch

    base = cs[0]._base
    if base is not None and all(c._base is base for c in cs) and base.shape[1] == sum(c.shape[1] for c in cs):
        return base
    return torch.cat(list(cs), dim=1)


WIDE = WideFamily()
