"""tritune: a TVM-style autotuner for Triton GPU kernels.

    with tritune.apply_history_best("tuning.db"):
        y = tritune.ops.matmul(a, b)
"""
from typing import Any

__all__ = ["apply_history_best", "ops"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # imported on first use so that `import tritune` (and the CLI's start) stays light
    if name == "ops":
        from tritune.kernels import ops

        return ops
    if name == "apply_history_best":
        from tritune.records.dispatch import apply_history_best

        return apply_history_best
    raise AttributeError(f"module 'tritune' has no attribute {name!r}")
