"""User-facing ops that run tuned kernels: `tritune.ops.matmul(a, b, bias=None, ...)`.

Config choice, in order: the best stored config of this exact workload on this device; else that
of the nearest tuned shape of the same op and dtype (log-distance of B, M, N, K); else DEFAULT.
A fallback warns once per workload. Choices and compiled kernels are cached per call signature.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tritune.kernels.build import Kernel, problem_of
from tritune.kernels.device import device_info, device_key
from tritune.kernels.expr import BiasAdd, Epilogue, ExprError, Matmul
from tritune.records import dispatch
from tritune.schedules.config import Config
from tritune.settings import SETTINGS

DEFAULT = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3, UNROLL=1)
DTYPE_NAMES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


@dataclass(frozen=True)
class Choice:
    """The config an op will run and where it came from: 'tuned', 'nearest' or 'default'."""

    config: Config
    source: str
    expr: Matmul


_kernels: dict[tuple, tuple[Kernel, Choice]] = {}
_warned: set[str] = set()


def _expr_of(a: Any, b: Any, bias: Any, epilogue: Sequence[Epilogue]) -> Matmul:
    if a.dim() not in (2, 3) or b.dim() not in (2, 3) or a.shape[-1] != b.shape[-2]:
        raise ExprError(f"matmul shapes do not match: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or str(a.dtype) not in DTYPE_NAMES:
        raise ExprError(f"matmul needs two fp16, bf16 or fp32 tensors of one dtype, got {a.dtype} and {b.dtype}")
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    steps = tuple(epilogue)
    if bias is not None and not any(e.needs_bias for e in steps):
        steps = (BiasAdd(), *steps)
    return Matmul(a.shape[-2], b.shape[-1], a.shape[-1], batch=batch, dtype=DTYPE_NAMES[str(a.dtype)],
                  trans_a=a.stride(-2) == 1 and a.stride(-1) != 1, trans_b=b.stride(-2) == 1 and b.stride(-1) != 1,
                  epilogue=steps, allow_tf32=True)


def _history(db: Any) -> dispatch.HistoryBest | None:
    if db is not None:
        return db if isinstance(db, dispatch.HistoryBest) else _default_history(Path(db))
    active = dispatch.current()
    if active is not None:
        return active
    return _default_history(SETTINGS.db_path) if SETTINGS.db_path.exists() else None


_histories: dict[Path, dispatch.HistoryBest] = {}


def _default_history(path: Path) -> dispatch.HistoryBest:
    if path not in _histories:
        _histories[path] = dispatch.HistoryBest(path)
    return _histories[path]


def choose(expr: Matmul, history: dispatch.HistoryBest | None, device_index: int = 0) -> Choice:
    """Pick the config to run for `expr` on a device (see the module docstring for the order)."""
    device = device_key(device_info(device_index))
    if history is not None:
        exact = history.best(expr.key, device)
        if exact is not None:
            return Choice(exact, "tuned", expr)
        tuned = [(Matmul.from_dict(spec), cfg) for spec, cfg in history.tuned(expr.op, expr.dtype, device)]
        if tuned:
            near, cfg = min(tuned, key=lambda t: expr.shape_distance(t[0]))
            return _warn(Choice(cfg, "nearest", expr), f"the nearest tuned shape ({near.describe()})")
    return _warn(Choice(DEFAULT, "default", expr), "a safe default config")


def _warn(choice: Choice, what: str) -> Choice:
    if choice.expr.key not in _warned:
        _warned.add(choice.expr.key)
        warnings.warn(f"tritune: no tuned config for {choice.expr.describe()} on this device; using {what}",
                      stacklevel=4)
    return choice


def matmul(a: Any, b: Any, bias: Any = None, *, epilogue: Sequence[Epilogue] = (), db: Any = None) -> Any:
    """epilogue(a @ b [+ bias]) with the best tuned config; a, b 2-D or 3-D (batched) tensors."""
    # contiguous unless one of the last two dims already is: any other stride pattern is copied
    a = a if 1 in a.stride()[-2:] else a.contiguous()
    b = b if 1 in b.stride()[-2:] else b.contiguous()
    history = _history(db)
    sig = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device, tuple(epilogue),
           None if bias is None else (bias.shape, bias.stride()), id(history),
           a.data_ptr() % 16, b.data_ptr() % 16, None if bias is None else bias.data_ptr() % 16)
    entry = _kernels.get(sig)
    if entry is None:
        entry = _kernels[sig] = _prepare(a, b, bias, epilogue, history)
    kernel, choice = entry
    out = a.new_empty((choice.expr.batch, choice.expr.m, choice.expr.n) if max(a.dim(), b.dim()) == 3
                      else (choice.expr.m, choice.expr.n))
    kernel(a, b, out, bias)
    return out


def _prepare(a: Any, b: Any, bias: Any, epilogue: Sequence[Epilogue], history: Any) -> tuple[Kernel, Choice]:
    expr = _expr_of(a, b, bias, epilogue)
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ExprError(f"batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    index = (a.device.index or 0) if a.is_cuda else 0
    choice = choose(expr, history, index)
    shape = (expr.batch, expr.m, expr.n)
    probe = a.new_empty(shape)  # the output is always a fresh contiguous tensor like this one
    return Kernel(expr, choice.config, problem_of(expr, a, b, probe, bias)), choice


def explain(a: Any, b: Any, bias: Any = None, *, epilogue: Sequence[Epilogue] = (), db: Any = None) -> Choice:
    """Which config `matmul` would run for these arguments, and why."""
    return choose(_expr_of(a, b, bias, epilogue), _history(db))
