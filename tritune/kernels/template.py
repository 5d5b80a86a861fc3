"""Triton source for the contraction family, generated from a Matmul expression.

One template serves every contraction: batch, strides and epilogue are parameters of the
generated source; tile sizes, warps, stages and unrolling are compile-time parameters of it.
"""
from __future__ import annotations

from typing import Any

from tritune.kernels.codegen import load_source
from tritune.kernels.expr import Matmul

KERNEL_NAME = "tritune_matmul"
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "UNROLL", "EVEN_K", "DOT_PRECISION")
FAULTS = ("oob", "hang")

_TEMPLATE = '''\
import triton
import triton.language as tl


@triton.jit
def {name}(
    A, B, C,{bias_ptr}
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,{bias_stride}
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UNROLL: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # {description}
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    # grouped launch order: programs running together share rows of A in L2
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_m
    pid_n = (pid % width) // group_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows/columns past the edge wrap onto valid ones, so the K loop needs no M/N masks;
    # the store below is masked, so the duplicates are never written
    rm = offs_m % M
    rn = offs_n % N
    a_ptrs = A + batch * stride_ab + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + batch * stride_bb + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{fault_hang}    for k in tl.range(0, tl.cdiv(K, BLOCK_K), loop_unroll_factor=UNROLL):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
{bias_load}{epilogue}
    c_ptrs = C + batch * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn{fault_oob}
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)
'''

_BIAS_LOAD = "    bias = tl.load(BIAS + offs_n * stride_bias, mask=offs_n < N, other=0.0).to(tl.float32)\n"
# Test hooks for crash isolation: a store far outside any allocation, and a loop that never ends.
_FAULT_OOB = " + (1 << 40)"
_FAULT_HANG = (
    "    spin = tl.load(A, volatile=True).to(tl.float32)\n"
    "    while spin == spin:  # inputs are finite random numbers, so this never ends\n"
    "        spin = tl.load(A, volatile=True).to(tl.float32)\n"
)


def source(expr: Matmul, fault: str | None = None) -> str:
    """The Triton source of the kernel computing `expr` (fault is a test hook: 'oob' or 'hang')."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
    epilogue = "".join(f"    {e.triton()}\n" for e in expr.epilogue)
    return _TEMPLATE.format(
        name=KERNEL_NAME,
        description=expr.describe().replace(f" {expr.dtype}", "") + (f" [fault: {fault}]" if fault else ""),
        bias_ptr=" BIAS," if expr.has_bias else "",
        bias_stride=" stride_bias," if expr.has_bias else "",
        bias_load=_BIAS_LOAD if expr.has_bias else "",
        epilogue=epilogue,
        fault_oob=_FAULT_OOB if fault == "oob" else "",
        fault_hang=_FAULT_HANG if fault == "hang" else "",
    )


def load(expr: Matmul, fault: str | None = None) -> Any:
    """The @triton.jit function of the generated source for `expr`."""
    return load_source(source(expr, fault), KERNEL_NAME)
