"""Facts about the device kernels run on: the one place that asks the GPU, or knows that Triton's
interpreter stands in for one (as in the CPU tests)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

from tritune.settings import SETTINGS

INTERPRETER = "triton-interpreter"
INTERPRETER_SMS = 4  # persistent kernels still split their tiles over several programs


class NoCudaDevice(RuntimeError):
    """Tuned kernels were asked to run where there is no CUDA device: tensors on another device, or
    a torch that finds no CUDA GPU."""


def check_cuda(tensors: Iterable[Any], what: str) -> None:
    """NoCudaDevice unless every tensor is a CUDA tensor (any tensor passes under Triton's interpreter)."""
    if interpreted():
        return
    elsewhere = sorted({str(t.device) for t in tensors if t is not None and not t.is_cuda})
    if elsewhere:
        import torch

        why = "" if torch.cuda.is_available() else "; torch finds no CUDA device on this machine"
        raise NoCudaDevice(f"{what} runs tuned kernels on CUDA tensors, not on {', '.join(elsewhere)}{why}")


def interpreted() -> bool:
    """Whether kernels run under Triton's interpreter (TRITON_INTERPRET=1) instead of on a GPU."""
    return SETTINGS.interpret


@lru_cache(maxsize=None)
def device_info(index: int = 0) -> dict:
    """Name, capability, SM count, shared-memory limit and versions of a CUDA device."""
    import torch
    import triton

    if interpreted():
        return {"gpu": INTERPRETER, "capability": "0.0", "sms": INTERPRETER_SMS, "shared_bytes": 0,
                "triton": triton.__version__, "torch": str(torch.__version__)}
    if not torch.cuda.is_available():  # torch's own error is an AssertionError from deep inside
        raise NoCudaDevice("tuned kernels need a CUDA device; torch finds none on this machine")
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu": props.name, "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "shared_bytes": getattr(props, "shared_memory_per_block_optin", 0),
        # a plain str: torch's TorchVersion would make whoever unpickles these facts import torch
        # (the tuning process, which never does otherwise: seconds on its start-up's critical path)
        "triton": triton.__version__, "torch": str(torch.__version__),
    }


def current_sms() -> int:
    """SM count of the current GPU (what persistent kernels size their grid by)."""
    if interpreted():
        return INTERPRETER_SMS
    import torch

    return device_info(torch.cuda.current_device())["sms"]
