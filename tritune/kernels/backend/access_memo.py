"""A memo of torch's analysis of which tensors a user-defined Triton kernel reads and writes.

torch generates the kernel's Triton IR to find what it writes, at every call site of every compile:
once when AOT autograd functionalizes the graph and once when Inductor lowers it. A decoder's 80
tuned sites run 5 kernels, and the Triton front end's code generation for them was the largest
part of compiling the model with its tuned kernels (cProfile of tune-model's check). The analysis
sees each tensor as a 2-element tensor of its dtype and each symbolic size as 2, so its answer
depends only on the kernel, the tensors' dtypes and the other arguments' values: the memo keys on
exactly those, and an argument of any other type is analysed by torch as before.

torch hands a kernel launched with `num_warps` or `num_stages` to the analysis wrapped in a new
Triton `Autotuner` of one config at every call site; the analysis reads only the wrapped function
and its first config's arguments, so the memo keys an autotuner on those (keyed on the object, every
site of a decoder missed: 0.05-0.16 s each, about 160 analyses per compile).
"""
from __future__ import annotations

import copy
import functools
import sys
from typing import Any, Callable

import torch

NAMES = ("identify_accessed_tensors", "identify_mutated_tensors")  # torch's name for it, newer and older
MAX_ENTRIES = 4096
_PLAIN = (type(None), bool, int, float, str, torch.dtype)


class _Unkeyed(Exception):
    """An argument the memo cannot key on: torch analyses the call itself."""


def install() -> bool:
    """Memoise torch's analysis in this process (once; later calls do nothing); False where this
    torch has none of the functions it knows."""
    try:
        from torch._higher_order_ops import triton_kernel_wrap as module
    except ImportError:
        return False
    found = False
    for name in NAMES:
        fn = getattr(module, name, None)
        if callable(fn):
            found = True
            if not getattr(fn, "memoised_by_tritune", False):
                setattr(module, name, memoised(fn))
    return found


def memoised(fn: Callable) -> Callable:
    """`fn(kernel, kwargs, *rest)` answered from a memo where every argument can be keyed; each
    answer is a copy (callers keep what they are given)."""
    memo: dict[tuple, tuple[Any, Any]] = {}

    @functools.wraps(fn)
    def wrapper(kernel: Any, kwargs: dict, *rest: Any) -> Any:
        try:
            key = (kernel_key(kernel), tuple(sorted((name, arg_key(v)) for name, v in kwargs.items())), repr(rest))
        except _Unkeyed:
            return fn(kernel, kwargs, *rest)
        if key not in memo:
            if len(memo) >= MAX_ENTRIES:
                memo.clear()
            # the kernel is held (an autotuner holds its function): the ids in the key stay its own
            memo[key] = (kernel, fn(kernel, kwargs, *rest))
        return copy.deepcopy(memo[key][1])

    wrapper.memoised_by_tritune = True  # type: ignore[attr-defined]
    return wrapper


def kernel_key(kernel: Any) -> tuple:
    """What the analysis sees of the kernel: the function itself, or of a Triton autotuner the
    function it wraps and its first config's arguments (torch's analysis takes those)."""
    if _is_autotuner(kernel):
        configs = getattr(kernel, "configs", None) or ()
        first = tuple(sorted((name, arg_key(v)) for name, v in configs[0].kwargs.items())) if configs else None
        return ("autotuner", id(kernel.fn), first)
    return ("kernel", id(kernel))


def _is_autotuner(kernel: Any) -> bool:
    autotuner = sys.modules.get("triton.runtime.autotuner")
    return autotuner is not None and isinstance(kernel, autotuner.Autotuner)


def arg_key(value: Any) -> tuple:
    """What the analysis sees of one argument: a tensor's dtype (an Inductor IR node's, with its
    type), a symbolic value as such, a plain value itself; _Unkeyed for anything else."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) or _is_sympy(value):
        return ("symbolic",)
    if isinstance(value, _PLAIN):
        return (type(value).__name__, str(value) if isinstance(value, torch.dtype) else value)
    if isinstance(value, tuple):
        return ("tuple", tuple(arg_key(v) for v in value))
    ir = sys.modules.get("torch._inductor.ir")
    if ir is not None and isinstance(value, ir.IRNode) and hasattr(value, "get_dtype"):
        return ("ir", type(value).__name__, str(value.get_dtype()))
    raise _Unkeyed(type(value).__name__)


def _is_sympy(value: Any) -> bool:
    sympy = sys.modules.get("sympy")
    return sympy is not None and isinstance(value, sympy.Basic)
