"""`torch.ops.tritune.matmul(a, b, bias, spec)`: the op a compiled graph calls for a tuned contraction.

A `torch.library.triton_op`: when torch.compile traces it, its body becomes a launch of the tuned
Triton kernel in Inductor's own generated code (Inductor compiles it with its other kernels, plans
its buffers, and launches it without Python per call, under CUDA graphs too); called eagerly it
launches the kernel through Triton's JIT. `spec` (a string, so that Inductor's caches carry it)
names the expression and the config of one call site.

Operands whose layout is not the one tuned (a row-major operand where a transposed one was tuned)
run the expression as torch ops instead: correct, and visible to Inductor like any other op.
"""
from __future__ import annotations

import json
import logging
from functools import lru_cache
from typing import Any, Optional

import torch
from torch.library import triton_op, wrap_triton

from tritune.kernels.contraction import launch
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.contraction.family import MATMUL
from tritune.kernels.device import current_sms, interpreted
from tritune.kernels.frontend.ops import layout_of
from tritune.schedules.config import Config


log = logging.getLogger("tritune.compiler")
_misfits: set["Site"] = set()


def spec_of(expr: Matmul, config: Config) -> str:
    """The op's spec for one call site: the expression and the config to run."""
    return json.dumps({"expr": expr.to_dict(), "config": json.loads(config.to_json())}, sort_keys=True,
                      separators=(",", ":"))


class Site:
    """One call site: its kernel function, grid and compile-time parameters."""

    def __init__(self, spec: str) -> None:
        data = json.loads(spec)
        self.expr, self.config = Matmul.from_dict(data["expr"]), Config.of(data["config"])
        expr, config = self.expr, self.config
        # sizes and strides as constexprs: a compiled model launches it with pointers alone, as
        # Inductor launches its own templates (each int argument is host time on every call)
        self.fn = launch.template.load(expr, specialize=True)
        self.int_names = (*launch.INT_NAMES, *launch.template.input_int_names(expr))
        self.grid = launch.grid(expr, config, current_sms() if config.get("PERSISTENT", 0) else 0)
        self.consts = {**launch.constexprs(expr, config), "num_warps": config["num_warps"],
                       "num_stages": config["num_stages"]}
        # split-K's fp32 partial tiles and arrival counters
        self.slots = launch.tiles(expr, config) * expr.batch
        self.ws = self.slots * config.get("SPLIT_K", 1) * config["BLOCK_M"] * config["BLOCK_N"]

    def fits(self, a: Any, b: Any, out: Any, bias: Any) -> bool:
        """Whether the operands have the layout the kernel was tuned for (and, for tensor-descriptor
        loads, the strides those need; base pointers are assumed 16-byte aligned, as Inductor's are)."""
        expr, tma = self.expr, self.config.get("TMA", 0)
        if layout_of(a) is not expr.trans_a or layout_of(b) is not expr.trans_b:
            return False
        problem = launch.Problem(expr.batch, launch.ints_of(expr, a, b, out, bias), (True,) * 4)
        return not tma or launch.tma_unfit(expr, problem, store=tma == 2) is None

    def empty_out(self, a: Any, b: Any) -> Any:
        """A fresh contiguous output for the operands (2-D, or 3-D if either is)."""
        expr = self.expr
        return a.new_empty((expr.batch, expr.m, expr.n) if 3 in (a.dim(), b.dim()) else (expr.m, expr.n))

    def __call__(self, a: Any, b: Any, bias: Any) -> Any:
        expr, out = self.expr, self.empty_out(a, b)
        if not self.fits(a, b, out, bias):
            if self not in _misfits:  # at trace time: once per site, not per call
                _misfits.add(self)
                log.warning("tritune: %s was tuned for other operand layouts than this call's: it runs as "
                            "torch ops", expr.describe())
            return MATMUL.expression(expr)(a, b, out, bias)
        # split-K's scratch; without split-K the kernel never touches either, so `a` stands in (no
        # allocation, no zeroing launch: each is host time on every call of a compiled model)
        ws = locks = a
        if self.config.get("SPLIT_K", 1) > 1:
            ws, locks = a.new_empty(self.ws, dtype=torch.float32), a.new_zeros(self.slots, dtype=torch.int32)
        if self.config.get("TMA", 0):
            launch.use_torch_scratch()
        ints = dict(zip(self.int_names, launch.ints_of(expr, a, b, out, bias)))
        wrap_triton(self.fn)[self.grid](a, b, out, bias if expr.has_bias else out, ws, locks, **ints, **self.consts)
        return out


@lru_cache(maxsize=None)
def site(spec: str) -> Site:
    """The call site of a spec (its kernel source generated and loaded once)."""
    return Site(spec)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], spec: str) -> torch.Tensor:
    """epilogue(a @ b [+ bias]) by the tuned kernel of `spec` (a fresh contiguous output)."""
    return site(spec)(a, b, bias)


if interpreted():
    # The interpreter's kernels cannot be traced into Inductor's code (they are not JIT functions):
    # on a CPU the op stays opaque and runs them eagerly, so the rest of the route is testable there.
    torch.library.custom_op("tritune::matmul", matmul, mutates_args=())
    torch.library.register_fake("tritune::matmul", lambda a, b, bias, spec: site(spec).empty_out(a, b))
else:
    triton_op("tritune::matmul", matmul, mutates_args=())
OP = torch.ops.tritune.matmul.default
