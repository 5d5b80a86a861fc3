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

    @classmethod
    def from_env(cls) -> "Settings":
        """Read TRITUNE_DB, TRITUNE_CACHE_DIR, TRITON_INTERPRET and TRITUNE_FAKE_GPU once."""
        cache = Path(os.environ.get("TRITUNE_CACHE_DIR") or _cache_home())
        db = Path(os.environ.get("TRITUNE_DB") or cache / "tuning.db")
        interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        return cls(db_path=db.expanduser(), kernel_dir=cache.expanduser() / "kernels", interpret=interpret,
                   fake_gpu=os.environ.get("TRITUNE_FAKE_GPU") or None)


SETTINGS = Settings.from_env()
