"""Triton source, specialisation and launch of the conv2d implicit-GEMM kernel.

GEMM view: M = N*P*Q output pixels, N = K output channels, K = R*S*C. Each program owns one
BLOCK_M x BLOCK_N output tile and walks the reduction in one flat loop (so Triton pipelines it):
- RS_OUTER (C a multiple of BLOCK_K): step t covers filter tap (r, s) = divmod(t // (C/BLOCK_K), S)
  and one C chunk; addresses are a row base plus contiguous channels, so loads vectorise.
- otherwise (C = 3, C = 20, ...): step t covers BLOCK_K consecutive (r, s, c) indices, each
  decomposed on its own: a gather, but no K work is wasted on channel padding.
The input tile is masked where the tap falls into the zero padding; rows and channels past the
edge wrap onto valid ones (as in the matmul template) and the store is masked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritune.kernels.codegen import Binary, Launcher, divisibility, epilogue_source, load_source
from tritune.kernels.conv.expr import Conv2d
from tritune.schedules.config import Config

KERNEL_NAME = "tritune_conv2d"

_TEMPLATE = '''\
import triton
import triton.language as tl


@triton.jit
def {name}(
    X, F, Y,{bias_ptr}
    M, H, W, K, P, Q,
    stride_xn, stride_xh, stride_xw, stride_xc,
    stride_fk, stride_fr, stride_fs, stride_fc,
    stride_yn, stride_yp, stride_yq, stride_yk,{bias_stride}
    C: tl.constexpr, R: tl.constexpr, S: tl.constexpr,
    STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr, PAD_H: tl.constexpr, PAD_W: tl.constexpr,
    DIL_H: tl.constexpr, DIL_W: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UNROLL: tl.constexpr, RS_OUTER: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # {description}
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(K, BLOCK_N)
    # grouped launch order: programs running together share input rows and filters in L2
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_m
    pid_n = (pid % width) // group_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M
    rn = offs_n % K
    img = rm // (P * Q)
    p = (rm // Q) % P
    q = rm % Q
    h0 = p * STRIDE_H - PAD_H  # top-left input pixel of each output pixel's window
    w0 = q * STRIDE_W - PAD_W
    x_rows = X + img * stride_xn + h0 * stride_xh + w0 * stride_xw
    f_cols = F + rn * stride_fk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if RS_OUTER:
        for t in tl.range(0, R * S * (C // BLOCK_K), loop_unroll_factor=UNROLL):
            rs = t // (C // BLOCK_K)
            c = (t % (C // BLOCK_K)) * BLOCK_K + offs_k
            r = rs // S
            s = rs % S
            h = h0 + r * DIL_H
            w = w0 + s * DIL_W
            inside = (h >= 0) & (h < H) & (w >= 0) & (w < W)
            a_ptrs = x_rows[:, None] + (r * DIL_H * stride_xh + s * DIL_W * stride_xw) + c[None, :] * stride_xc
            a = tl.load(a_ptrs, mask=inside[:, None], other=0.0)
            b = tl.load(f_cols[None, :] + r * stride_fr + s * stride_fs + c[:, None] * stride_fc)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    else:
        for t in tl.range(0, tl.cdiv(R * S * C, BLOCK_K), loop_unroll_factor=UNROLL):
            kk = t * BLOCK_K + offs_k
            live = kk < R * S * C
            c = kk % C
            s = (kk // C) % S
            r = kk // (C * S)
            h = h0[:, None] + r[None, :] * DIL_H
            w = w0[:, None] + s[None, :] * DIL_W
            inside = live[None, :] & (h >= 0) & (h < H) & (w >= 0) & (w < W)
            a_offs = r * DIL_H * stride_xh + s * DIL_W * stride_xw + c * stride_xc
            a = tl.load(x_rows[:, None] + a_offs[None, :], mask=inside, other=0.0)
            b_offs = r * stride_fr + s * stride_fs + c * stride_fc
            b = tl.load(f_cols[None, :] + b_offs[:, None], mask=live[:, None], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
{bias_load}{epilogue}
    y_rows = Y + img * stride_yn + p * stride_yp + q * stride_yq
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < K)
    tl.store(y_rows[:, None] + offs_n[None, :] * stride_yk, acc.to(Y.dtype.element_ty), mask=mask)
'''

_BIAS_LOAD = "    bias = tl.load(BIAS + offs_n * stride_bias, mask=offs_n < K, other=0.0).to(tl.float32)\n"


def source(expr: Conv2d) -> str:
    """The Triton source of the kernel computing `expr` (geometry and tiles are constexprs)."""
    return _TEMPLATE.format(
        name=KERNEL_NAME, description=expr.describe(),
        bias_ptr=" BIAS," if expr.has_bias else "", bias_stride=" stride_bias," if expr.has_bias else "",
        bias_load=_BIAS_LOAD if expr.has_bias else "",
        epilogue=epilogue_source(expr.epilogue, "    "),
    )


@dataclass(frozen=True)
class Problem:
    """The integer arguments of one launch (M, H, W, K, P, Q, 12 strides, [bias stride]) and the
    16-byte alignment of its pointers (X, F, Y, [BIAS])."""

    ints: tuple[int, ...]
    aligned: tuple[bool, ...]


POINTERS = ("X", "F", "Y")
INTS = ("M", "H", "W", "K", "P", "Q", *(f"stride_{t}{d}" for t, dims in (("x", "nhwc"), ("f", "krsc"),
                                                                      ("y", "npqk")) for d in dims))


def canonical_problem(expr: Conv2d) -> Problem:
    """The problem of freshly allocated, contiguous NHWC / KRSC / NPQK operands."""
    h, w, c, k, r, s, p, q = expr.h, expr.w, expr.c, expr.k, expr.r, expr.s, expr.p, expr.q
    strides = (h * w * c, w * c, c, 1, r * s * c, s * c, c, 1, p * q * k, q * k, k, 1)
    bias = (1,) if expr.has_bias else ()
    return Problem((expr.gemm[0], h, w, k, p, q, *strides, *bias), (True,) * (3 + expr.has_bias))


def problem_of(expr: Conv2d, x: Any, f: Any, y: Any, bias: Any = None) -> Problem:
    """The problem of concrete 4-D torch tensors in NHWC / KRSC / NPQK index order (any strides)."""
    tensors = (x, f, y) + ((bias,) if expr.has_bias else ())
    bias_stride = (bias.stride(0),) if expr.has_bias else ()
    ints = (expr.gemm[0], expr.h, expr.w, expr.k, expr.p, expr.q, *x.stride(), *f.stride(), *y.stride(),
            *bias_stride)
    return Problem(ints, tuple(t.data_ptr() % 16 == 0 for t in tensors))


def rs_outer(expr: Conv2d, config: Config) -> bool:
    """Whether the kernel walks filter taps x C chunks (C a multiple of BLOCK_K) or gathers (r, s, c)."""
    return expr.c % config["BLOCK_K"] == 0


def constexprs(expr: Conv2d, config: Config) -> dict[str, Any]:
    """Compile-time parameters: the filter geometry and channel count, then the schedule."""
    (sh, sw), (ph, pw), (dh, dw) = expr.stride, expr.padding, expr.dilation
    return {
        "C": expr.c, "R": expr.r, "S": expr.s, "STRIDE_H": sh, "STRIDE_W": sw, "PAD_H": ph, "PAD_W": pw,
        "DIL_H": dh, "DIL_W": dw,
        **{knob: config[knob] for knob in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "UNROLL")},
        "RS_OUTER": rs_outer(expr, config),
        "DOT_PRECISION": "ieee" if expr.dtype == "fp32" and not expr.tf32 else "tf32",
    }


def binary(expr: Conv2d, config: Config, problem: Problem) -> Binary:
    """What the candidate's binary is built from, with ints specialised as the matmul family does."""
    fn = load_source(source(expr), KERNEL_NAME)
    names = POINTERS + (("BIAS",) if expr.has_bias else ())
    pointers = tuple((name, expr.dtype, aligned) for name, aligned in zip(names, problem.aligned))
    int_names = INTS + (("stride_bias",) if expr.has_bias else ())
    ints = tuple((name, v, divisibility(v)) for name, v in zip(int_names, problem.ints))
    options = (("num_warps", config["num_warps"]), ("num_stages", config["num_stages"]))
    return Binary(fn, pointers, ints, tuple(constexprs(expr, config).items()), options)


def grid(expr: Conv2d, config: Config) -> tuple[int, int, int]:
    """Launch grid: one program per output tile of the GEMM view."""
    m, n, _ = expr.gemm
    return (-(-m // config["BLOCK_M"]) * -(-n // config["BLOCK_N"]), 1, 1)


def launcher(expr: Conv2d, config: Config, problem: Problem, target: Any = None) -> Launcher:
    """The candidate bound to one problem: call it with (x, weight, y[, bias]) to launch once."""
    return Launcher(binary(expr, config, problem), grid(expr, config), target)
