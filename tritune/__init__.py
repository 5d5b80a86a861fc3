"""tritune: a TVM-style autotuner for Triton GPU kernels.

    with tritune.apply_history_best("tuning.db"):
        y = tritune.ops.matmul(a, b)
    tasks = tritune.extract_tasks(model, (x,))                     # what to tune in a model
    fast = torch.compile(model, backend=tritune.compiler("tuning.db"))  # replay it
"""
import importlib
from typing import Any

__all__ = ["NoCudaDevice", "apply_history_best", "compiler", "extract_tasks", "ops"]
__version__ = "0.1.0"

# name -> (module, attribute; None for the module itself)
_LAZY = {
    "ops": ("tritune.kernels.backend.ops", None),
    "apply_history_best": ("tritune.records.dispatch", "apply_history_best"),
    "extract_tasks": ("tritune.kernels.backend.extract", "extract_tasks"),
    "compiler": ("tritune.kernels.backend.compiler", "compiler"),
    "NoCudaDevice": ("tritune.kernels.device", "NoCudaDevice"),  # what ops raise for tensors off CUDA
}


def __getattr__(name: str) -> Any:
    # imported on first use so that `import tritune` (and the CLI's start) stays light
    if name not in _LAZY:
        raise AttributeError(f"module 'tritune' has no attribute {name!r}")
    module, attr = _LAZY[name]
    found = importlib.import_module(module)
    return found if attr is None else getattr(found, attr)
