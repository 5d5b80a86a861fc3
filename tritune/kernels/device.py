"""Facts about the device kernels run on: the one place that asks the GPU, or knows that Triton's
interpreter stands in for one (as in the CPU tests)."""
from __future__ import annotations

import ctypes
import importlib.util
import re
from functools import lru_cache
from pathlib import Path
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


# the CUDA driver's device attributes that torch's device properties read
_ATTRIBUTES = {"major": 75, "minor": 76, "sms": 16, "shared_bytes": 97}  # 97: the opt-in per-block limit
FACT_KEYS = ("gpu", "capability", "sms", "shared_bytes", "triton", "torch")  # what tasks and trials are keyed by


def driver_facts(index: int = 0) -> dict | None:
    """`device_info`'s facts of device `index` read from the CUDA driver (libcuda, through ctypes)
    and the packages' files, without torch and without a CUDA context: milliseconds, against the
    seconds a process takes to import torch and start CUDA; the tuning process can start its
    search on them while its GPU worker starts (which checks them). None where the driver cannot
    tell (no driver, no such device, any error)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count, device, value = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        if cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count)) or index >= count.value \
                or cuda.cuDeviceGet(ctypes.byref(device), index) or cuda.cuDeviceGetName(name, 256, device):
            return None
        read = {}
        for key, attribute in _ATTRIBUTES.items():
            if cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device):
                return None
            read[key] = value.value
        import triton

        return {"gpu": name.value.decode(), "capability": f"{read['major']}.{read['minor']}", "sms": read["sms"],
                "shared_bytes": read["shared_bytes"], "triton": triton.__version__, "torch": torch_version(),
                "device": index, "device_count": count.value}
    except Exception:  # noqa: BLE001 - no driver, or one that does not answer: the worker will tell
        return None


@lru_cache(maxsize=1)
def torch_version() -> str:
    """torch's `__version__`, read from its version file without importing torch (seconds); read once."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("torch")
    text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    if found is None:
        raise ValueError("torch/version.py names no __version__")
    return found.group(1)


def current_sms() -> int:
    """SM count of the current GPU (what persistent kernels size their grid by)."""
    if interpreted():
        return INTERPRETER_SMS
    import torch

    return device_info(torch.cuda.current_device())["sms"]
