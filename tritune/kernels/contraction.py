"""The contraction family (matmul, and bmm for batched shapes): one template, one space."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels import build
from tritune.kernels.expr import DTYPE_BYTES, DTYPES, ExprError, Matmul, epilogue_from_dict
from tritune.kernels.family import Family, Operands
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space

# Relative Frobenius error allowed per operand type: output rounding of fp16 is ~3e-4 and of
# bf16 ~2e-3; tf32 rounds inputs to 10 mantissa bits, like fp16.
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2, "tf32": 2e-3, "fp32": 1e-5}
LAYOUTS = ("nn", "nt", "tn", "tt")


def parse_dims(text: str, counts: Sequence[int], what: str) -> list[int]:
    """'4096' or '2,64,64' (or 'x'-separated) -> positive ints; `counts` lists the lengths allowed."""
    try:
        dims = [int(p) for p in text.replace("x", ",").split(",")]
    except ValueError:
        dims = []
    if len(dims) not in counts or min(dims) < 1:
        raise ExprError(f"bad --shape {text!r}: expected {what} of positive integers")
    return dims


def parse_epilogue(text: str) -> tuple:
    """'scale=0.5,bias,gelu_tanh' -> epilogue steps."""
    steps = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, arg = item.partition("=")
        spec: dict[str, Any] = {"op": name}
        if name == "scale":
            try:
                spec["alpha"] = float(arg or 1.0)
            except ValueError:
                raise ExprError(f"bad scale {arg!r} in --epilogue: expected a number") from None
        elif name == "gelu_tanh":
            spec = {"op": "gelu", "approximate": "tanh"}
        steps.append(epilogue_from_dict(spec))
    return tuple(steps)


def check_options(options: dict[str, str], allowed: Sequence[str], op: str) -> None:
    """ExprError naming the first option an op does not take (nothing is silently ignored)."""
    for name in options:
        if name not in allowed:
            raise ExprError(f"--{name} does not apply to --op {op}; it takes: "
                            f"{', '.join('--' + a for a in allowed) or 'no extra options'}")


class ContractionFamily(Family):
    """C[b,m,n] = epilogue(A[b,m,k] @ B[b,k,n]) in any layout, fp16/bf16/fp32."""

    baseline = "torch (cuBLAS)"
    sources = ("template.py", "build.py")

    def __init__(self, op: str, batched: bool) -> None:
        self.op, self.batched = op, batched

    def from_dict(self, spec: dict) -> Matmul:
        return Matmul.from_dict(spec)

    @property
    def cli_help(self) -> str:
        shape = "B,M,N,K" if self.batched else "S (square), M,N,K or B,M,N,K"
        return f"--shape {shape}; --layout nn|nt|tn|tt; --epilogue scale=A,bias,relu,gelu,gelu_tanh"

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
        if dtype not in DTYPES:
            raise ExprError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        return Matmul(m, n, k, batch=batch, dtype=dtype, trans_a=layout[0] == "t", trans_b=layout[1] == "t",
                      epilogue=parse_epilogue(options.get("epilogue", "")))

    def space(self, expr: Matmul, limits: Limits) -> Space:
        from tritune.schedules.matmul import matmul_space

        problem = build.canonical_problem(expr)
        tma = 0 if build.tma_unfit(expr, problem) else 1 if build.tma_unfit(expr, problem, store=True) else 2
        return matmul_space(expr.m, expr.n, expr.k, DTYPE_BYTES[expr.dtype], limits, batch=expr.batch, tma=tma)

    def features(self, expr: Matmul, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        from tritune.cost_model.features import features

        return features(expr, limits, configs)

    def default_config(self, expr: Matmul) -> Config:
        return build.DEFAULT

    def canonical_problem(self, expr: Matmul) -> build.Problem:
        return build.canonical_problem(expr)

    def problem_of(self, expr: Matmul, args: tuple) -> build.Problem:
        return build.problem_of(expr, *args)

    def compile(self, expr: Matmul, config: Config, problem: build.Problem, target: Any) -> Any:
        return build.compile_kernel(expr, config, problem, target)

    def kernel(self, expr: Matmul, config: Config, problem: build.Problem) -> build.Kernel:
        return build.Kernel(expr, config, problem)

    def inputs(self, expr: Matmul, seed: int, device: str) -> Operands:
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        dt = torch_dtype(expr.dtype)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

        bm, m, n, k = expr.batch, expr.m, expr.n, expr.k
        a = rand(bm, k, m).transpose(1, 2) if expr.trans_a else rand(bm, m, k)
        b = rand(bm, n, k).transpose(1, 2) if expr.trans_b else rand(bm, k, n)
        c = torch.full((bm, m, n), float("nan"), device=device, dtype=dt)
        args = (a, b, c, rand(n)) if expr.has_bias else (a, b, c)
        return Operands(args, c)

    def reference(self, expr: Matmul, args: tuple) -> Any:
        import torch

        out = torch.matmul(args[0].double(), args[1].double())
        bias = args[3].double() if expr.has_bias else None
        for step in expr.epilogue:
            out = step.reference(out, bias)
        return out

    def eager(self, expr: Matmul, x: Operands) -> Callable[[], Any]:
        import torch

        a, b, c = x.args[:3]
        bias = x.args[3] if expr.has_bias else None

        def run() -> Any:
            out = torch.matmul(a, b, out=c)
            for step in expr.epilogue:
                out = step.reference(out, bias)
            return out
        return run

    def tolerance(self, expr: Matmul) -> float:
        return TOLERANCE["tf32" if expr.tf32 else expr.dtype]


def torch_dtype(name: str) -> Any:
    """The torch dtype of a dtype name."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


MATMUL = ContractionFamily("matmul", batched=False)
BMM = ContractionFamily("bmm", batched=True)
