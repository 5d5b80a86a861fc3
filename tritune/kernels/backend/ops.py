"""User-facing ops that run tuned kernels: `tritune.ops.matmul(a, b, bias=None, ...)`, with any
epilogue (`epilogue=` steps) and the extra tensors it reads (`inputs=`).

Config choice, in order: the best stored config of this exact workload on this device (which may
be a library call, when that measured fastest); else that of the nearest tuned shape of the same op
and dtype (log-distance of B, M, N, K); else DEFAULT.
A fallback warns once per workload. Choices and compiled kernels are cached per call signature.
Tensors that are not on a CUDA device (or no CUDA device at all) raise `NoCudaDevice`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import torch

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.contraction.launch import DEFAULT, problem_of
from tritune.kernels.device import NoCudaDevice, check_cuda, device_info  # noqa: F401 - NoCudaDevice: the API's error
from tritune.kernels.family import device_key, family
from tritune.kernels.epilogue import BiasAdd, Epilogue
from tritune.kernels.expr import ExprError
# the shared helpers and history_of (homes: helpers.py, records/dispatch.py) are kept importable
# from here for one release: scripts and users import ops.DTYPE_NAMES and ops.contraction_expr
from tritune.kernels.backend.helpers import DTYPE_NAMES, contraction_expr, input_problem, layout_of  # noqa: F401
from tritune.records import dispatch
from tritune.records.dispatch import history_of
from tritune.schedules.config import Config


@dataclass(frozen=True)
class Choice:
    """The config an op will run and where it came from: 'tuned', 'nearest', 'default' or 'given'."""

    config: Config
    source: str
    expr: Matmul


class _Entry(NamedTuple):
    """What one call signature runs: the kernel, the output's layout, and which operands need a copy."""

    kernel: Any  # a contraction Kernel, or the library call the tuning chose
    choice: Choice
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: Any
    device: Any
    copy_a: bool
    copy_b: bool


_entries: dict[tuple, _Entry] = {}
_warned: set[str] = set()


def _expr_of(a: Any, b: Any, bias: Any, epilogue: Sequence[Epilogue], allow_tf32: bool = True) -> Matmul:
    steps = tuple(epilogue)
    if bias is not None and not any(e.needs_bias for e in steps):
        steps = (BiasAdd(), *steps)
    return contraction_expr(a, b, steps, allow_tf32)


def choose(expr: Matmul, history: dispatch.HistoryBest | None, device_index: int = 0) -> Choice:
    """Pick the config to run for `expr` on a device (see the module docstring for the order)."""
    device = device_key(device_info(device_index), expr.op)
    if history is not None:
        exact = history.best(expr.key, device)
        if exact is not None:
            return Choice(exact, "tuned", expr)
        usable = family(expr.op).libraries(expr)  # another shape's library call may not apply here (addmm: a bias)
        tuned = [(Matmul.from_dict(spec), cfg) for spec, cfg in history.tuned(expr.op, expr.dtype, device)
                 if cfg.library is None or cfg.library in usable]
        if tuned:
            near, cfg = min(tuned, key=lambda t: expr.shape_distance(t[0]))
            return _warn(Choice(cfg, "nearest", expr), f"the nearest tuned shape ({near.describe()})")
    return _warn(Choice(DEFAULT, "default", expr), "a safe default config")


def _warn(choice: Choice, what: str) -> Choice:
    if choice.expr.key not in _warned:
        _warned.add(choice.expr.key)
        warnings.warn(f"tritune: no tuned config for {choice.expr.describe()} on this device; using {what}",
                      stacklevel=5)
    return choice


def matmul(a: Any, b: Any, bias: Any = None, *, epilogue: Sequence[Epilogue] = (), inputs: Sequence[Any] = (),
           db: Any = None, config: Config | None = None, allow_tf32: bool = True) -> Any:
    """epilogue(a @ b [+ bias]) with the best tuned config (or exactly `config`); a, b 2-D or 3-D tensors.

    `inputs` are the extra tensors the epilogue's steps read (its `Input`s, in order): a residual of
    the output's shape, [M] or [N] vectors. allow_tf32 lets fp32 operands use tf32 tensor cores
    (and picks the records tuned that way).
    """
    source = config if config is not None else history_of(db)
    steps = epilogue if type(epilogue) is tuple else tuple(epilogue)
    # Everything a compiled binary assumes (shapes, strides, dtypes, device, 16-byte alignment), read
    # with the cheapest accessors: this key is built on every call.
    sig = (a.shape, a.stride(), a.dtype, a.data_ptr() & 15, a.get_device(),
           b.shape, b.stride(), b.dtype, b.data_ptr() & 15, b.get_device(), steps, source, allow_tf32,
           None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.data_ptr() & 15, bias.get_device()),
           *((t.shape, t.stride(), t.dtype, t.data_ptr() & 15, t.get_device()) for t in inputs))
    entry = _entries.get(sig)
    if entry is None:
        entry = _entries[sig] = _prepare(a, b, bias, steps, tuple(inputs), source, allow_tf32)
    kernel, _, shape, strides, dtype, device, copy_a, copy_b = entry
    if copy_a:
        a = a.contiguous()
    if copy_b:
        b = b.contiguous()
    out = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    kernel(a, b, out, bias, *inputs)
    return out


def _prepare(a: Any, b: Any, bias: Any, epilogue: Sequence[Epilogue], inputs: tuple, source: Any,
             allow_tf32: bool) -> _Entry:
    check_cuda((a, b, bias, *inputs), "tritune.ops.matmul")
    if any(t is not None and t.device != a.device for t in (b, bias, *inputs)):
        raise ExprError(f"matmul operands are on different devices: {a.device} and {b.device}")
    if bias is not None and bias.dtype != a.dtype:
        raise ExprError(f"bias dtype {bias.dtype} differs from the operands' {a.dtype}")
    # any stride pattern other than row-major or transposed is copied to contiguous
    copy_a, copy_b = layout_of(a) is None, layout_of(b) is None
    a = a.contiguous() if copy_a else a
    b = b.contiguous() if copy_b else b
    expr = _expr_of(a, b, bias, epilogue, allow_tf32)
    if isinstance(source, Config):
        choice = Choice(source, "given", expr)
    else:
        choice = choose(expr, source, (a.device.index or 0) if a.is_cuda else 0)
    shape = (expr.batch, expr.m, expr.n) if max(a.dim(), b.dim()) == 3 else (expr.m, expr.n)
    why = input_problem(expr, inputs, shape)
    if why:
        raise ExprError(why)
    probe = a.new_empty(shape)  # the output is always a fresh contiguous tensor like this one
    kernel = family(expr.op).kernel(expr, choice.config, problem_of(expr, a, b, probe, bias, *inputs))
    return _Entry(kernel, choice, shape, probe.stride(), a.dtype, a.device, copy_a, copy_b)


def explain(a: Any, b: Any, bias: Any = None, *, epilogue: Sequence[Epilogue] = (), db: Any = None) -> Choice:
    """Which config `matmul` would run for these arguments, and why."""
    check_cuda((a, b, bias), "tritune.ops.explain")
    return choose(_expr_of(a, b, bias, epilogue), history_of(db))
