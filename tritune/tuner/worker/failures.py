"""Classify an exception from compiling, loading or running a candidate into a Status."""
from __future__ import annotations

from tritune.records.result import Status

# CUDA errors after which the context is unusable: the worker must exit and be replaced.
FATAL_MARKERS = ("illegal memory access", "illegal address", "misaligned address",
                 "unspecified launch failure", "illegal instruction", "device-side assert")
# The compiler or loader ran out of shared memory or registers.
RESOURCE_MARKERS = ("outofresources", "out of resource", "register target", "too many resources")


def classify(exc: BaseException, compiling: bool = False) -> tuple[Status, bool]:
    """(status, fatal): fatal means the CUDA context is lost and the worker must be replaced."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(marker in text for marker in FATAL_MARKERS):
        return Status.CRASH, True
    if any(marker in text for marker in RESOURCE_MARKERS):
        return Status.OUT_OF_RESOURCES, False
    if compiling or "compil" in text:
        return Status.COMPILE_ERROR, False
    return Status.RUNTIME_ERROR, "cuda" in text
