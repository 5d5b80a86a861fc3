"""The one place where tritune reads environment variables and picks default locations."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tritune"


@dataclass(frozen=True)
class Settings:
    """Resolved locations and switches; build with `Settings.from_env()`."""

    db_path: Path
    kernel_dir: Path
    interpret: bool
    # a module standing in for the GPU (its worker `handlers` and compile `build`), so that tests
    # run whole `tune-cli` processes on machines without one; None on real hosts
    fake_gpu: str | None = None
    # whether the GEMM spaces offer programmatic dependent launch (Hopper and later): off unless
    # asked for, since it did not pay in whole decode steps (BENCHMARKS.md) while a candidate timed
    # back to back with itself overlaps its own next launch, which a model's step never gives it
    pdl: bool = False
    # whether a tuning run may start its search on the device facts the CUDA driver gives (read
    # without torch) while its GPU worker starts, which then checks them
    early_start: bool = True

    @classmethod
    def from_env(cls) -> "Settings":
        """Read TRITUNE_DB, TRITUNE_CACHE_DIR, TRITON_INTERPRET, TRITUNE_FAKE_GPU, TRITUNE_PDL and
        TRITUNE_EARLY_START once."""
        cache = Path(os.environ.get("TRITUNE_CACHE_DIR") or _cache_home())
        db = Path(os.environ.get("TRITUNE_DB") or cache / "tuning.db")
        interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        return cls(db_path=db.expanduser(), kernel_dir=cache.expanduser() / "kernels", interpret=interpret,
                   fake_gpu=os.environ.get("TRITUNE_FAKE_GPU") or None,
                   pdl=os.environ.get("TRITUNE_PDL", "0") not in ("", "0"),
                   early_start=os.environ.get("TRITUNE_EARLY_START", "1") not in ("", "0"))


SETTINGS = Settings.from_env()
