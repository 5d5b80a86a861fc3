"""The conv2d family: NHWC convolution as an implicit GEMM, tuned in the contraction space of its GEMM view."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tritune.kernels.conv.expr import AWKWARD, Conv2d
from tritune.kernels.epilogue import apply
from tritune.kernels.expr import DTYPE_BYTES, TOLERANCE, ExprError, check_dtype, check_options, parse_dims, torch_dtype
from tritune.kernels.family import Family, Operands
from tritune.kernels.pointwise import parse_epilogue
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space


def parse_pair(text: str, name: str) -> tuple[int, int]:
    """'2' or '2,1' (h,w) -> a pair of ints (range checks are the expression's)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (1, 2):
        raise ExprError(f"bad --{name} {text!r}: expected one integer or two (h,w)")
    return (values[0], values[-1])


class Conv2dFamily(Family):
    """y = epilogue(conv2d(x, w)) with x NHWC, w KRSC, y NHWC; fp16/bf16/fp32 (tf32)."""

    op = "conv2d"
    baseline = "torch (cuDNN, channels_last)"
    sources = ("conv/expr.py", "conv/template.py")
    template_version = 1
    launch_module = "tritune.kernels.conv.template"

    def from_dict(self, spec: dict) -> Conv2d:
        return Conv2d.from_dict(spec)

    @property
    def cli_help(self) -> str:
        return ("--shape N,H,W,C,K,R,S (or N,H,W,C,K,R for a square filter); --stride, --padding, "
                "--dilation: h or h,w; --epilogue: matmul's steps without extra inputs (bias over K)")

    def examples(self) -> tuple:
        return AWKWARD

    def from_cli(self, shape: str, dtype: str, options: dict[str, str]) -> Conv2d:
        check_options(options, ("stride", "padding", "dilation", "epilogue"), self.op)
        dims = parse_dims(shape, (6, 7), "N,H,W,C,K,R,S")
        n, h, w, c, k, r = dims[:6]
        check_dtype(dtype)
        geometry = {name: parse_pair(options[name], name) for name in ("stride", "padding", "dilation")
                    if name in options}
        return Conv2d(n, h, w, c, k, r, dims[-1], dtype=dtype, **geometry,
                      epilogue=parse_epilogue(options.get("epilogue", ""), dtype))

    # ----- schedules and cost model
    def space(self, expr: Conv2d, limits: Limits) -> Space:
        from tritune.schedules.conv import conv_space

        view = expr.as_matmul()
        return conv_space(view.m, view.n, view.k, view.batch, expr.c, DTYPE_BYTES[expr.dtype], limits)

    def features(self, expr: Conv2d, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        from tritune.kernels.conv.features import features

        return features(expr, limits, configs)

    def default_config(self, expr: Conv2d) -> Config:
        return Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32 if expr.c % 32 == 0 else 16, GROUP_M=8,
                         num_warps=4, num_stages=3, UNROLL=1)

    # ----- semantics
    def inputs(self, expr: Conv2d, seed: int, device: str) -> Operands:
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device).to(torch_dtype(expr.dtype))

        x, f = rand(expr.n, expr.h, expr.w, expr.c), rand(expr.k, expr.r, expr.s, expr.c)
        y = torch.full((expr.n, expr.p, expr.q, expr.k), float("nan"), device=device,
                       dtype=torch_dtype(expr.dtype))
        return Operands((x, f, y, rand(expr.k)) if expr.has_bias else (x, f, y), y)

    def reference(self, expr: Conv2d, args: tuple) -> Any:
        import torch.nn.functional as F

        x, f = (t.double().permute(0, 3, 1, 2) for t in args[:2])  # NCHW / KCRS views
        out = F.conv2d(x, f, None, expr.stride, expr.padding, expr.dilation).permute(0, 2, 3, 1)
        return apply(expr.epilogue, out, args[3].double() if expr.has_bias else None)

    def eager(self, expr: Conv2d, x: Operands) -> Callable[[], Any]:
        """F.conv2d on channels_last views of the same bytes; a leading bias goes into the conv."""
        import torch
        import torch.nn.functional as F

        inp, weight = (t.permute(0, 3, 1, 2) for t in x.args[:2])  # channels_last NCHW / KCRS views
        bias = x.args[3] if expr.has_bias else None
        steps = list(expr.epilogue)
        fused = bias if steps and steps[0].needs_bias else None
        rest = steps[1:] if fused is not None else steps
        if expr.dtype == "fp32" and x.out.is_cuda:
            torch.backends.cudnn.allow_tf32 = expr.tf32  # this worker's cuDNN must match the workload

        def run() -> Any:
            out = F.conv2d(inp, weight, fused, expr.stride, expr.padding, expr.dilation).permute(0, 2, 3, 1)
            return apply(rest, out, bias)
        return run

    def expression(self, expr: Conv2d) -> Callable[..., Any]:
        """F.conv2d (cuDNN) on channels_last views, the bias in the conv where it comes first, then
        the rest of the epilogue; the result in the output's NHWC layout."""
        import torch.nn.functional as F

        steps = list(expr.epilogue)
        lead = bool(steps) and steps[0].needs_bias

        def run(x: Any, f: Any, out: Any, bias: Any = None) -> Any:
            y = F.conv2d(x.permute(0, 3, 1, 2), f.permute(0, 3, 1, 2), bias if lead else None,
                         expr.stride, expr.padding, expr.dilation).permute(0, 2, 3, 1)
            return apply(steps[1:] if lead else steps, y, bias)
        return run

    def tolerance(self, expr: Conv2d) -> float:
        # relative Frobenius error with fp32 accumulation does not grow with the reduction length;
        # output rounding (fp16, bf16) or input rounding (tf32) sets it, as for matmul
        return TOLERANCE["tf32" if expr.tf32 else expr.dtype]


CONV2D = Conv2dFamily()
