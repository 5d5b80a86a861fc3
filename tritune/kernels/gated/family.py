"""The gated dual-GEMM family (`--op gated`): act(x @ W1ᵀ [+ b1]) * (x @ W2ᵀ [+ b2]) in one kernel."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels.expr import DTYPE_BYTES, TOLERANCE, ExprError, check_dtype, check_options, parse_dims, torch_dtype
from tritune.kernels.family import Family, Operands
from tritune.kernels.norm import rms_norm
from tritune.kernels.gated import launch
from tritune.kernels.gated.expr import ACTIVATIONS, AWKWARD, Gated
from tritune.kernels.weights import Concatenated, as_kn, weight_options
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space


class GatedFamily(Family):
    """out = act(x @ W1ᵀ) * (x @ W2ᵀ), act silu / gelu / gelu_tanh, optional biases; fp16/bf16/fp32."""

    op = "gated"
    baseline = "torch (two cuBLAS GEMMs + pointwise)"
    sources = ("gated/expr.py", "gated/template.py", "gated/launch.py", "contraction/template.py",
               "contraction/launch.py", "weights.py", "norm.py")
    template_version = 1
    launch_module = "tritune.kernels.gated.launch"

    def from_dict(self, spec: dict) -> Gated:
        return Gated.from_dict(spec)

    @property
    def cli_help(self) -> str:
        return ("--shape M,N,K (tokens, output width of each projection, input width); --activation "
                f"{'|'.join(ACTIVATIONS)} (default silu); --layout nt (weights [N,K], default) | nn ([K,N]); "
                "--epilogue bias (a bias on each projection)")

    def examples(self) -> tuple:
        return AWKWARD

    def from_cli(self, shape: str, dtype: str, options: dict[str, str]) -> Gated:
        check_options(options, ("activation", "layout", "epilogue"), self.op)
        m, n, k = parse_dims(shape, (3,), "M,N,K")
        check_dtype(dtype)
        activation = options.get("activation", "silu")
        if activation not in ACTIVATIONS:
            raise ExprError(f"bad --activation {activation!r}: one of {', '.join(ACTIVATIONS)}")
        trans_b, bias = weight_options(options, self.op)
        return Gated(m, n, k, dtype, activation, trans_b=trans_b, bias=bias)

    # ----- schedules and cost model
    def space(self, expr: Gated, limits: Limits) -> Space:
        from tritune.schedules.gated import gated_space

        tma = launch.tma_unfit(expr, launch.canonical_problem(expr)) is None
        rows = expr.k if expr.trans_b else expr.n  # elements per stored weight row
        return gated_space(expr.m, expr.n, expr.k, DTYPE_BYTES[expr.dtype], limits, tma=tma,
                           rows_aligned=rows * DTYPE_BYTES[expr.dtype] % 16 == 0, k_last=expr.trans_b)

    def features(self, expr: Gated, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        from tritune.kernels.gated.features import features

        return features(expr, limits, configs)

    # a cold gated search learns from plain GEMMs: on the H100's recorded gated decode space, cold
    # sa at 57 trials found 0.906-0.998 of the best, warm-started by the plain recordings 0.972-1.0
    prior_from = ("matmul",)

    def lift_prior(self, expr: Gated, rows: np.ndarray) -> np.ndarray:
        from tritune.kernels.gated.features import lift

        return lift(expr, rows)

    def default_config(self, expr: Gated) -> Config:
        return launch.DEFAULT

    # ----- semantics
    def inputs(self, expr: Gated, seed: int, device: str) -> Operands:
        """x [M, K], W1 and W2 ([N, K], or [K, N]), a NaN output [M, N], then b1, b2 [N] with biases
        (None without, where a row norm's weight [K] follows)."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device).to(torch_dtype(expr.dtype))

        m, n, k = expr.m, expr.n, expr.k
        weight = (n, k) if expr.trans_b else (k, n)
        x, w1, w2 = rand(m, k), rand(*weight), rand(*weight)
        c = torch.full((m, n), float("nan"), device=device, dtype=torch_dtype(expr.dtype))
        biases = (rand(n), rand(n)) if expr.bias else (None, None) if expr.norm_eps is not None else ()
        return Operands((x, w1, w2, c, *biases, *(() if expr.norm_eps is None else (rand(k),))), c)

    def reference(self, expr: Gated, args: tuple) -> Any:
        return self._compute(expr, *(None if t is None else t.double() for t in args))

    def eager(self, expr: Gated, x: Operands) -> Callable[[], Any]:
        return lambda: self.library(expr, "mm")(*x.args)

    def expression(self, expr: Gated) -> Callable[..., Any]:
        return lambda *args: self._compute(expr, *args)

    def _compute(self, expr: Gated, x: Any, w1: Any, w2: Any, c: Any = None, b1: Any = None, b2: Any = None,
                 norm: Any = None) -> Any:
        """act(x @ W1ᵀ + b1) * (x @ W2ᵀ + b2) as functional torch ops, in the operands' dtype."""
        x = x if norm is None else rms_norm(x, norm, expr.norm_eps)
        g, u = x @ as_kn(expr.trans_b, w1), x @ as_kn(expr.trans_b, w2)
        if expr.bias:
            g, u = g + b1, u + b2
        return expr.act.reference(g) * u

    def libraries(self, expr: Gated) -> tuple[str, ...]:
        """What a user has without tritune (cuBLAS through torch): two GEMMs ('mm', addmm with
        biases), or one GEMM over the weights concatenated once ('mm_cat'), each followed by the
        activation and the product in place."""
        return ("mm", "mm_cat")

    def library(self, expr: Gated, name: str) -> Callable[..., Any]:
        import torch

        super().library(expr, name)  # raises for a name the expression has none of
        cat = Concatenated(expr.trans_b)

        def run(x: Any, w1: Any, w2: Any, c: Any, b1: Any = None, b2: Any = None, norm: Any = None) -> Any:
            x = x if norm is None else rms_norm(x, norm, expr.norm_eps)
            if name == "mm_cat":
                w, b = cat((w1, w2), (b1, b2))
                y = torch.addmm(b, x, w) if expr.bias else torch.mm(x, w)
                g, u = y[:, :expr.n], y[:, expr.n:]
            else:
                g, u = ((torch.addmm(b, x, as_kn(expr.trans_b, w)) if expr.bias
                         else torch.mm(x, as_kn(expr.trans_b, w)))
                        for w, b in ((w1, b1), (w2, b2)))
            expr.act.inplace(g)
            return torch.mul(g, u, out=c)
        return run

    def tolerance(self, expr: Gated) -> float:
        return TOLERANCE["tf32" if expr.tf32 else expr.dtype]


GATED = GatedFamily()
