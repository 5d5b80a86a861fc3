"""Measurement results and the device key: plain values shared by tuner, search and records."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from enum import Enum

from tritune.schedules.config import Config


class Status(str, Enum):
    """How a measured candidate ended (after TVM's MeasureErrorNo)."""

    OK = "OK"
    COMPILE_ERROR = "COMPILE_ERROR"
    OUT_OF_RESOURCES = "OUT_OF_RESOURCES"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    WRONG_ANSWER = "WRONG_ANSWER"
    TIMEOUT = "TIMEOUT"
    CRASH = "CRASH"


@dataclass(frozen=True)
class MeasureResult:
    """One measured (or failed) candidate. Times are milliseconds; None unless status is OK."""

    config: Config
    status: Status
    t_min: float | None = None
    t_p20: float | None = None
    t_median: float | None = None
    t_p80: float | None = None
    compile_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    message: str = ""
    measured_on: str = ""  # which GPU measured it, "host:index" ("" where none did: a compile error)

    @property
    def ok(self) -> bool:
        """True when the candidate ran, was correct and was timed."""
        return self.status is Status.OK


@dataclass(frozen=True)
class DeviceKey:
    """Everything besides the workload that changes a measurement: GPU, compiler, template."""

    gpu: str
    capability: str
    triton: str
    torch: str
    template: str

    def to_json(self) -> str:
        """Canonical JSON form."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "DeviceKey":
        """Parse the canonical JSON form."""
        return cls(**json.loads(text))

    @property
    def key(self) -> str:
        """A short stable hash of the canonical JSON form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
