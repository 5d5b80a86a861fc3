"""Facts about the device kernels run on, and the key that tells measurements apart."""
from __future__ import annotations

from functools import lru_cache

from tritune.kernels.family import family
from tritune.records.result import DeviceKey
from tritune.settings import SETTINGS

INTERPRETER = "triton-interpreter"


@lru_cache(maxsize=None)
def device_info(index: int = 0) -> dict:
    """Name, capability, SM count, shared-memory limit and versions of a CUDA device."""
    import torch
    import triton

    if SETTINGS.interpret:
        return {"gpu": INTERPRETER, "capability": "0.0", "sms": 1, "shared_bytes": 0,
                "triton": triton.__version__, "torch": torch.__version__}
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu": props.name, "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "shared_bytes": getattr(props, "shared_memory_per_block_optin", 0),
        "triton": triton.__version__, "torch": torch.__version__,
    }


def device_key(info: dict, op: str = "matmul") -> DeviceKey:
    """The key under which measurements of an op on this device, compiler and template are stored."""
    return DeviceKey(info["gpu"], info["capability"], info["triton"], info["torch"], family(op).template_hash())
