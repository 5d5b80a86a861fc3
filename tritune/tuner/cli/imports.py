"""What `tune-cli import` takes: each trial of a JSONL file checked against its op before any is
stored (`records.jsonl` checks the form: fields, types, statuses, times). A trial's op is known, its
spec builds its op's expression and has the key it is stored under, and its config is a library
call of that expression or a schedule inside the op's space: each knob one of the space's, with one
of that knob's values, and every knob that the op's cost-model features read (a knob added since
may be missing: the kernels take its default, as a recording of an older space replays)."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from tritune.kernels.expr import ExprError
from tritune.kernels.family import expr_from_dict, family
from tritune.records.jsonl import Trial
from tritune.schedules.config import Config
from tritune.schedules.space import Limits


def check_trial(trial: Trial) -> None:
    """ValueError (one line, the reason) for a trial its op would not store."""
    (key, op, dtype, spec), device, result, _ = trial
    expr = _expr(op, spec)
    if (expr.op, expr.dtype) != (op, dtype):
        raise ValueError(f"workload op {op!r} and dtype {dtype!r} differ from its spec's ({expr.op}, {expr.dtype})")
    if expr.key != key:
        raise ValueError(f"workload key {key!r} is not its spec's ({expr.key})")
    config = result.config
    if config.library is not None:
        if len(config) != 1 or config.library not in family(op).libraries(expr):
            raise ValueError(f"config {config.to_json()} is no library call of {expr.describe()}; "
                             f"known: {', '.join(family(op).libraries(expr))}")
        return
    _check_schedule(spec, device.capability, config)


@lru_cache(maxsize=256)
def _expr(op: str, spec: str) -> Any:
    """The expression of a stored spec, checked (ValueError naming what is wrong)."""
    try:
        family(op)
    except ExprError as exc:
        raise ValueError(str(exc)) from None
    try:
        return expr_from_dict(json.loads(spec))
    except (ExprError, KeyError, TypeError) as exc:  # an ExprError is a ValueError: say which part failed
        raise ValueError(f"bad workload spec: {exc}") from None


@lru_cache(maxsize=256)
def _space(spec: str, capability: str) -> tuple[dict[str, tuple], Any, Limits]:
    """The knobs of a workload's space on a device of this capability (with every optional knob such a
    device may offer), its expression, and the device's limits."""
    try:
        major, minor = (int(part) for part in capability.split("."))
    except ValueError:
        raise ValueError(f"bad device capability {capability!r} (expected MAJOR.MINOR)") from None
    expr, known = expr_from_dict(json.loads(spec)), Limits.for_capability(major, minor)
    limits = Limits(known.shared_bytes, known.sms, pdl=True)
    return {k.name: k.values for k in family(expr.op).space(expr, limits).knobs}, expr, limits


def _check_schedule(spec: str, capability: str, config: Config) -> None:
    knobs, expr, limits = _space(spec, capability)
    for name, value in config.items():
        if name not in knobs:
            raise ValueError(f"config knob {name!r} is not one of {expr.op}'s: {', '.join(knobs)}")
        if value not in knobs[name]:
            raise ValueError(f"config {name}={value!r} is outside {expr.op}'s space {knobs[name]}")
    names = (spec, capability, tuple(config))
    if names not in _complete:  # configs with the same knobs are all complete or none is
        try:
            family(expr.op).features(expr, limits, [config])
        except KeyError as exc:
            raise ValueError(f"config lacks knob {exc.args[0]!r}") from None
        _complete.add(names)


_complete: set[tuple[str, str, tuple[str, ...]]] = set()  # (spec, capability, knobs) of complete configs
