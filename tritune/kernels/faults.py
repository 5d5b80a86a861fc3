"""Test hooks that work for every family: a config with a `fault` knob launches a candidate that
misbehaves on purpose, so crash isolation, timeouts and the correctness check are exercised on
real GPUs for any op (`tune-cli run --inject-fault`).

- "oob": a store far outside any allocation before the launch (an illegal address: the CUDA
  context is lost, the runner records CRASH and replaces its worker);
- "hang": a kernel that never ends before the launch (the runner records TIMEOUT);
- "wrong": the candidate reads a negated copy of its first operand (the check records WRONG_ANSWER).

The builder compiles the candidate without its fault: only the launch misbehaves.
"""
from __future__ import annotations

from typing import Any, Callable

from tritune.kernels.codegen import load_source
from tritune.schedules.config import Config

FAULTS = ("oob", "hang", "wrong")


def check(fault: Any) -> None:
    """ValueError for a fault no family knows (never silently ignored)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def strip(config: Config) -> Config:
    """The config without its test fault (what the candidate's binary is built from)."""
    return config if "fault" not in config else Config.of({k: v for k, v in config.items() if k != "fault"})


def inject(launch: Callable[..., None], fault: str) -> Callable[..., None]:
    """`launch` made to misbehave as `fault` (checked by `check`) says."""
    if fault == "wrong":
        return lambda first, *rest: launch(_negated(first), *rest)
    spoil = load_source(_SOURCE, f"tritune_fault_{fault}")

    def run(*args: Any) -> None:
        spoil[(1,)](args[0])  # the first operand: finite random values, never the NaN-poisoned output
        launch(*args)
    return run


def _negated(t: Any) -> Any:
    import torch

    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)  # same layout: same binary
    return torch.neg(t, out=out)


_SOURCE = '''\
import triton
import triton.language as tl


@triton.jit
def tritune_fault_oob(P):
    tl.store(P + (1 << 40), tl.load(P))


@triton.jit
def tritune_fault_hang(P):
    spin = tl.load(P, volatile=True).to(tl.float32)
    while spin == spin:  # the operand is finite, so this never ends
        spin = tl.load(P, volatile=True).to(tl.float32)
'''
