"""What to tune on which device: the Task (an expression, the device key its trials are stored
under, the device's limits), made from the facts a GPU worker reports."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from tritune.kernels.family import Family, device_key, family
from tritune.records.result import DeviceKey, MeasureResult
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space
from tritune.settings import SETTINGS


@dataclass(frozen=True)
class Task:
    """What to tune (the expression) on which device."""

    expr: Any
    device: DeviceKey
    limits: Limits
    absent: tuple[str, ...] = ()  # knobs left out of the space (at their defaults)
    only: frozenset[Config] | None = None  # the space limited to these configs (a recorded sample)

    @property
    def family(self) -> Family:
        """The op family of the expression."""
        return family(self.expr.op)

    def featurize(self, configs: Sequence[Config]) -> np.ndarray:
        """Cost-model features of configs of this task."""
        return self.family.features(self.expr, self.limits, configs)

    @property
    def libraries(self) -> tuple[Config, ...]:
        """The library implementations measured beside the space, as candidates like any config
        (none where the space is limited to a recorded sample, which holds none)."""
        if self.only is not None:
            return ()
        return tuple(Config.of(library=name) for name in self.family.libraries(self.expr))

    @cached_property
    def space(self) -> Space:
        """The schedule space of this task."""
        space = self.family.space(self.expr, self.limits)
        space = space.without(self.absent) if self.absent else space
        return space if self.only is None else space.restricted(self.only)


def best_of(results: Sequence[MeasureResult]) -> MeasureResult | None:
    """The fastest correct result (lowest median), or None."""
    ok = [r for r in results if r.ok]
    return min(ok, key=lambda r: r.t_median) if ok else None


def device_limits(info: dict) -> Limits:
    """What the GPU the runner reported allows a program (the known table fills what it did not say)."""
    major, minor = (int(x) for x in info["capability"].split("."))
    known = Limits.for_capability(major, minor)
    # programmatic dependent launch where asked for (TRITUNE_PDL) and the GPU has it (the
    # interpreter reports capability 0.0)
    return Limits(info["shared_bytes"] or known.shared_bytes, info["sms"] or known.sms,
                  pdl=SETTINGS.pdl and major >= 9)


def device_target(info: dict) -> Any:
    """Triton's compile target for the GPU the runner reported."""
    from triton.backends.compiler import GPUTarget

    major, minor = (int(x) for x in info["capability"].split("."))
    return GPUTarget("cuda", major * 10 + minor, 32)


def device_task(expr: Any, info: dict) -> Task:
    """The task for an expression on the GPU the runner reported."""
    return Task(expr, device_key(info, expr.op), device_limits(info))
