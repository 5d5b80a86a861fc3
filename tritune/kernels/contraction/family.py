"""The contraction family (matmul, and bmm for batched shapes): one template, one space."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels.contraction import launch
from tritune.kernels.contraction.expr import AWKWARD, Matmul
from tritune.kernels.epilogue import apply, apply_
from tritune.kernels.expr import DTYPE_BYTES, TOLERANCE, ExprError, check_dtype, check_options, parse_dims, torch_dtype
from tritune.kernels.family import Family, Operands
from tritune.kernels.norm import normed
from tritune.kernels.pointwise import GRAMMAR, parse_epilogue
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space

LAYOUTS = ("nn", "nt", "tn", "tt")


class ContractionFamily(Family):
    """C[b,m,n] = epilogue(A[b,m,k] @ B[b,k,n]) in any layout, fp16/bf16/fp32."""

    baseline = "torch (cuBLAS)"
    sources = ("contraction/expr.py", "contraction/template.py", "contraction/launch.py", "norm.py")
    template_version = 1
    launch_module = "tritune.kernels.contraction.launch"

    def __init__(self, op: str, batched: bool) -> None:
        self.op, self.batched = op, batched

    def from_dict(self, spec: dict) -> Matmul:
        return Matmul.from_dict(spec)

    @property
    def cli_help(self) -> str:
        shape = "B,M,N,K" if self.batched else "S (square), M,N,K or B,M,N,K"
        return f"--shape {shape}; --layout nn|nt|tn|tt; --epilogue: {GRAMMAR}"

    def examples(self) -> tuple:
        return tuple(e for e in AWKWARD if (e.batch > 1) == self.batched)

    def from_cli(self, shape: str, dtype: str, options: dict[str, str]) -> Matmul:
        check_options(options, ("layout", "epilogue"), self.op)
        if self.batched:
            batch, m, n, k = parse_dims(shape, (4,), "B,M,N,K")
        else:
            dims = parse_dims(shape, (1, 3, 4), "S, M,N,K or B,M,N,K")
            dims = dims * 3 if len(dims) == 1 else dims
            batch, m, n, k = [1] * (4 - len(dims)) + dims
        layout = options.get("layout", "nn")
        if layout not in LAYOUTS:
            raise ExprError(f"bad --layout {layout!r}: one of {', '.join(LAYOUTS)} (t = operand stored transposed)")
        check_dtype(dtype)
        return Matmul(m, n, k, batch=batch, dtype=dtype, trans_a=layout[0] == "t", trans_b=layout[1] == "t",
                      epilogue=parse_epilogue(options.get("epilogue", ""), dtype))

    # ----- schedules and cost model
    def space(self, expr: Matmul, limits: Limits) -> Space:
        from tritune.schedules.contraction import contraction_space

        problem = launch.canonical_problem(expr)
        tma = 0 if launch.tma_unfit(expr, problem) else 1 if launch.tma_unfit(expr, problem, store=True) else 2
        return contraction_space(expr.m, expr.n, expr.k, DTYPE_BYTES[expr.dtype], limits, batch=expr.batch, tma=tma,
                                 norm=expr.norm_eps is not None and not expr.layer_norm, k_last=expr.trans_b,
                                 prologue=expr.norm_eps is not None)

    def features(self, expr: Matmul, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        from tritune.kernels.contraction.features import features

        return features(expr, limits, configs)

    def default_config(self, expr: Matmul) -> Config:
        return launch.DEFAULT

    # ----- semantics
    def inputs(self, expr: Matmul, seed: int, device: str) -> Operands:
        """a, b, a NaN output, then the bias (None without one, where extra inputs follow) and the
        epilogue's extra inputs: a [B, M, N] residual, [M] or [N] vectors, each in its dtype; with a
        row norm, its weight [K] (LayerNorm: and its bias [K]) last."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape: int, dtype: str = expr.dtype) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(torch_dtype(dtype))

        bm, m, n, k = expr.batch, expr.m, expr.n, expr.k
        a = rand(bm, k, m).transpose(1, 2) if expr.trans_a else rand(bm, m, k)
        b = rand(bm, n, k).transpose(1, 2) if expr.trans_b else rand(bm, k, n)
        c = torch.full((bm, m, n), float("nan"), device=device, dtype=torch_dtype(expr.dtype))
        extra = tuple(rand(*{"mn": (bm, m, n), "m": (m,), "n": (n,)}[i.shape], dtype=i.dtype) for i in expr.inputs)
        norms = tuple(rand(k) for _ in range(launch.norm_tensors(expr)))
        bias = (rand(n),) if expr.has_bias else (None,) if extra or norms else ()
        return Operands((a, b, c, *bias, *extra, *norms), c)

    def reference(self, expr: Matmul, args: tuple) -> Any:
        import torch

        bias, extra, norms = _epilogue_args(expr, args)
        a = _normed(expr, args[0].double(), tuple(t.double() for t in norms))
        out = torch.matmul(a, args[1].double())
        return apply(expr.epilogue, out, None if bias is None else bias.double(), [t.double() for t in extra])

    def eager(self, expr: Matmul, x: Operands) -> Callable[[], Any]:
        import torch

        a, b, c = x.args[:3]
        bias, extra, norms = _epilogue_args(expr, x.args)
        return lambda: apply(expr.epilogue, torch.matmul(_normed(expr, a, norms), b, out=c), bias, extra)

    def libraries(self, expr: Matmul) -> tuple[str, ...]:
        """cuBLAS through torch: mm / bmm with the epilogue after it; addmm / baddbmm with the bias
        (and a scale before it) fused; cuBLASLt's bias + relu / tanh-GELU epilogue
        (`torch._addmm_activation`, 2-D only)."""
        return tuple(name for name in ("mm", "addmm", "addmm_activation") if _library_steps(expr, name) is not None)

    def library(self, expr: Matmul, name: str) -> Callable[..., Any]:
        import torch

        super().library(expr, name)  # raises for a name the expression has none of
        alpha, rest = _library_steps(expr, name)
        gelu = any(s.name == "gelu" for s in expr.epilogue)

        def run(a: Any, b: Any, c: Any, bias: Any = None, *inputs: Any) -> Any:
            _, inputs, norms = _epilogue_args(expr, (a, b, c, bias, *inputs))
            a = _normed(expr, a, norms)
            if expr.batch == 1 and c.dim() == 3:  # 2-D calls on the single batch entry
                a, b, c = (t[0] if t.dim() == 3 else t for t in (a, b, c))
            elif c.dim() == 3:  # a 2-D operand broadcast over the batch (a stride-0 view)
                a, b = (t if t.dim() == 3 else t.expand(expr.batch, *t.shape) for t in (a, b))
            two_d = c.dim() == 2
            if name == "addmm_activation":
                torch._addmm_activation(bias, a, b, use_gelu=gelu, out=c)
            elif name == "addmm":
                (torch.addmm if two_d else torch.baddbmm)(bias, a, b, alpha=alpha, out=c)
            else:
                (torch.mm if two_d else torch.bmm)(a, b, out=c)
            apply_(rest, c, bias, inputs)
            return c
        return run

    def expression(self, expr: Matmul) -> Callable[..., Any]:
        import torch

        def run(a: Any, b: Any, c: Any, bias: Any = None, *inputs: Any) -> Any:
            _, inputs, norms = _epilogue_args(expr, (a, b, c, bias, *inputs))
            return apply(expr.epilogue, torch.matmul(_normed(expr, a, norms), b), bias, inputs)
        return run

    def tolerance(self, expr: Matmul) -> float:
        return TOLERANCE["tf32" if expr.tf32 else expr.dtype]


MATMUL = ContractionFamily("matmul", batched=False)
BMM = ContractionFamily("bmm", batched=True)


def _library_steps(expr: Matmul, name: str) -> tuple[float, tuple] | None:
    """(alpha, epilogue steps left to run in place after the call) of library call `name` for the
    expression, or None where the call does not apply."""
    steps = expr.epilogue
    names = [s.name for s in steps]
    if name == "mm":
        return 1.0, steps
    lead = 1 if names[:1] == ["scale"] else 0
    if name == "addmm" and names[lead:lead + 1] == ["bias"]:
        return (steps[0].alpha if lead else 1.0), steps[lead + 1:]
    # cuBLASLt's GELU epilogue is the tanh approximation (torch's CPU path computes erf instead)
    if name == "addmm_activation" and expr.batch == 1 and (
            names == ["bias", "relu"] or (names == ["bias", "gelu"] and steps[1].approximate == "tanh")):
        return 1.0, ()
    return None


def _epilogue_args(expr: Matmul, args: tuple) -> tuple[Any, tuple, tuple]:
    """(bias or None, extra inputs, the row norm's tensors: none, its weight, or LayerNorm's weight
    and bias) of a contraction's kernel args (a, b, out[, bias, *inputs][, g[, gb]])."""
    rest, norms = tuple(args[4:]), launch.norm_tensors(expr)
    if not norms:
        return (args[3] if len(args) > 3 else None), rest, ()
    return args[3], rest[:-norms], rest[-norms:]


def _normed(expr: Matmul, a: Any, norms: tuple) -> Any:
    """A as the contraction reads it: through the row norm, if any."""
    return normed(a, norms, expr.norm_eps, expr.layer_norm)
