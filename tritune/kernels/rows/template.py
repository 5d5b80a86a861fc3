"""Triton kernels, specialisation and launch of the row-reduction family (softmax, layernorm).

Each program owns ROWS rows. When BLOCK_N >= N (SINGLE) a row block is loaded once, reduced in
registers and written; otherwise the program walks the row in BLOCK_N chunks twice: a first pass
keeps running statistics (online max and rescaled sum for softmax; chunk-wise Welford/Chan mean
and M2 for layernorm), the second recomputes and writes each chunk. Rows past M re-read row M-1
(the stores are masked), so no load needs a row mask and no NaN is computed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from tritune.kernels.codegen import Binary, Launcher, divisibility
from tritune.kernels.rows.expr import LayerNorm, RowOp
from tritune.schedules.config import Config


@triton.jit
def _row_ptrs(X, Y, M, stride_xm, stride_ym, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    # 64-bit row offsets: M rows of a padded stride may pass 2**31 elements
    x_rows = X + tl.minimum(rows, M - 1).to(tl.int64)[:, None] * stride_xm
    y_rows = Y + rows.to(tl.int64)[:, None] * stride_ym
    return x_rows, y_rows, (rows < M)[:, None]


@triton.jit
def _load(ptrs, cols, N, OTHER: tl.constexpr, EVEN_N: tl.constexpr, POLICY: tl.constexpr):
    if EVEN_N:
        x = tl.load(ptrs, eviction_policy=POLICY)
    else:
        x = tl.load(ptrs, mask=cols < N, other=OTHER, eviction_policy=POLICY)
    return x.to(tl.float32)


@triton.jit
def _store(ptrs, y, live, cols, N, EVEN_N: tl.constexpr):
    if EVEN_N:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=live)
    else:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=live & (cols < N))


@triton.jit
def tritune_softmax(X, Y, M, N, stride_xm, stride_xn, stride_ym, stride_yn,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE: tl.constexpr, EVEN_N: tl.constexpr):
    x_rows, y_rows, live = _row_ptrs(X, Y, M, stride_xm, stride_ym, ROWS)
    cols = tl.arange(0, BLOCK_N)[None, :]
    if SINGLE:
        x = _load(x_rows + cols * stride_xn, cols, N, float("-inf"), EVEN_N, "")
        e = tl.exp(x - tl.max(x, 1)[:, None])
        _store(y_rows + cols * stride_yn, e * (1.0 / tl.sum(e, 1))[:, None], live, cols, N, EVEN_N)
    else:
        big = tl.full([ROWS], float("-inf"), tl.float32)
        total = tl.zeros([ROWS], tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            # keep x in L2 for the second pass
            x = _load(x_rows + c * stride_xn, c, N, float("-inf"), EVEN_N, "evict_last")
            new = tl.maximum(big, tl.max(x, 1))
            total = total * tl.exp(big - new) + tl.sum(tl.exp(x - new[:, None]), 1)
            big = new
        scale = 1.0 / total
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x = _load(x_rows + c * stride_xn, c, N, float("-inf"), EVEN_N, "evict_first")
            _store(y_rows + c * stride_yn, tl.exp(x - big[:, None]) * scale[:, None], live, c, N, EVEN_N)


@triton.jit
def _normalize(x, mean, rstd, W, B, cols, N, stride_w, stride_b, EVEN_N: tl.constexpr):
    w = _load(W + cols * stride_w, cols, N, 0.0, EVEN_N, "evict_last")
    b = _load(B + cols * stride_b, cols, N, 0.0, EVEN_N, "evict_last")
    return (x - mean[:, None]) * rstd[:, None] * w + b


@triton.jit
def tritune_layernorm(X, W, B, Y, M, N, stride_xm, stride_xn, stride_ym, stride_yn, stride_w, stride_b,
                      EPS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE: tl.constexpr,
                      EVEN_N: tl.constexpr):
    x_rows, y_rows, live = _row_ptrs(X, Y, M, stride_xm, stride_ym, ROWS)
    cols = tl.arange(0, BLOCK_N)[None, :]
    if SINGLE:
        x = _load(x_rows + cols * stride_xn, cols, N, 0.0, EVEN_N, "")
        mean = tl.sum(x, 1) / N
        centred = tl.where(cols < N, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, 1) / N + EPS)
        y = _normalize(x, mean, rstd, W, B, cols, N, stride_w, stride_b, EVEN_N)
        _store(y_rows + cols * stride_yn, y, live, cols, N, EVEN_N)
    else:
        mean = tl.zeros([ROWS], tl.float32)
        m2 = tl.zeros([ROWS], tl.float32)  # sum of squared deviations from the mean so far
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x = _load(x_rows + c * stride_xn, c, N, 0.0, EVEN_N, "evict_last")
            # Chan's combination of the rows so far (seen) with this chunk's mean and M2: sums of
            # squares would cancel catastrophically for rows with a large mean
            seen = start * 1.0
            count = tl.minimum(N - start, BLOCK_N) * 1.0
            chunk_mean = tl.sum(x, 1) / count
            dev = tl.where(c < N, x - chunk_mean[:, None], 0.0)
            delta = chunk_mean - mean
            mean += delta * (count / (seen + count))
            m2 += tl.sum(dev * dev, 1) + delta * delta * (seen * count / (seen + count))
        rstd = tl.rsqrt(m2 / N + EPS)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x = _load(x_rows + c * stride_xn, c, N, 0.0, EVEN_N, "evict_first")
            y = _normalize(x, mean, rstd, W, B, c, N, stride_w, stride_b, EVEN_N)
            _store(y_rows + c * stride_yn, y, live, c, N, EVEN_N)


KERNELS = {"softmax": tritune_softmax, "layernorm": tritune_layernorm}
INTS = ("M", "N", "stride_xm", "stride_xn", "stride_ym", "stride_yn")


def pointer_names(expr: RowOp) -> tuple[str, ...]:
    """Kernel pointer arguments, in order: what `Operands.args` holds."""
    return ("X", "W", "B", "Y") if isinstance(expr, LayerNorm) else ("X", "Y")


@dataclass(frozen=True)
class Problem:
    """The integer arguments of one launch (M, N, x and y strides, [w and b strides]) and the
    16-byte alignment of its pointers (in `pointer_names` order)."""

    ints: tuple[int, ...]
    aligned: tuple[bool, ...]


def canonical_problem(expr: RowOp) -> Problem:
    """The problem of freshly allocated, contiguous operands."""
    vectors = (1, 1) if isinstance(expr, LayerNorm) else ()
    return Problem((expr.m, expr.n, expr.n, 1, expr.n, 1, *vectors), (True,) * len(pointer_names(expr)))


def problem_of(expr: RowOp, *args: Any) -> Problem:
    """The problem of concrete tensors in kernel order: 2-D x and y, 1-D weight and bias (any strides)."""
    x, y = args[0], args[-1]
    vectors = tuple(v.stride(0) for v in args[1:-1])
    return Problem((expr.m, expr.n, *x.stride(), *y.stride(), *vectors), tuple(t.data_ptr() % 16 == 0 for t in args))


def single_pass(expr: RowOp, config: Config) -> bool:
    """Whether one block holds a whole row (else the kernel loops over chunks twice)."""
    return config["BLOCK_N"] >= expr.n


def constexprs(expr: RowOp, config: Config) -> dict[str, Any]:
    """Compile-time parameters: [eps,] then the schedule."""
    eps = {"EPS": expr.eps} if isinstance(expr, LayerNorm) else {}
    return {**eps, "ROWS": config["ROWS"], "BLOCK_N": config["BLOCK_N"], "SINGLE": single_pass(expr, config),
            "EVEN_N": expr.n % config["BLOCK_N"] == 0}


def binary(expr: RowOp, config: Config, problem: Problem) -> Binary:
    """What the candidate's binary is built from, ints specialised as the other families do."""
    names = pointer_names(expr)
    pointers = tuple((name, expr.dtype, aligned) for name, aligned in zip(names, problem.aligned))
    int_names = INTS + (("stride_w", "stride_b") if len(names) == 4 else ())
    ints = tuple((name, v, divisibility(v)) for name, v in zip(int_names, problem.ints))
    options = (("num_warps", config["num_warps"]),)  # num_stages: no loop holds a tl.dot, nothing to pipeline
    return Binary(KERNELS[expr.op], pointers, ints, tuple(constexprs(expr, config).items()), options)


def launcher(expr: RowOp, config: Config, problem: Problem, target: Any = None) -> Launcher:
    """The candidate bound to one problem: call it with (x, y) or (x, weight, bias, y) to launch once."""
    return Launcher(binary(expr, config, problem), (-(-expr.m // config["ROWS"]), 1, 1), target)
