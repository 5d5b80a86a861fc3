"""What every expression shares: dtypes, errors, the canonical key, field checks, tolerances and
the parsers of `tune-cli run`'s workload options. Expressions say what is computed, never how.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

DTYPES = ("fp16", "bf16", "fp32")
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
INT32_MAX = 2**31 - 1
# Relative Frobenius error allowed per operand type: output rounding of fp16 is ~3e-4 and of
# bf16 ~2e-3; tf32 rounds inputs to 10 mantissa bits, like fp16.
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2, "tf32": 2e-3, "fp32": 1e-5}


class ExprError(ValueError):
    """An expression that cannot be built: bad shape, dtype or epilogue."""


class Keyed:
    """Canonical JSON form and key of an expression, both derived from its `to_dict()`."""

    def to_dict(self) -> dict:
        raise NotImplementedError

    def to_json(self) -> str:
        """Canonical JSON form; the workload key derives from it."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """A short stable hash of the canonical JSON form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def check_dtype(dtype: str) -> None:
    """ExprError unless `dtype` is one of DTYPES."""
    if dtype not in DTYPES:
        raise ExprError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")


def check_fields(expr: Any, dims: tuple[str, ...]) -> None:
    """ExprError unless the named fields are positive ints, `dtype` is known, any `epilogue` has one bias at most."""
    for name in dims:
        value = getattr(expr, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExprError(f"{name} must be a positive integer, got {value!r}")
    check_dtype(expr.dtype)
    if sum(e.needs_bias for e in getattr(expr, "epilogue", ())) > 1:
        raise ExprError("at most one bias add per epilogue")


def torch_dtype(name: str) -> Any:
    """The torch dtype of a dtype name."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def parse_dims(text: str, counts: Sequence[int], what: str) -> list[int]:
    """'4096' or '2,64,64' (or 'x'-separated) -> positive ints; `counts` lists the lengths allowed."""
    try:
        dims = [int(p) for p in text.replace("x", ",").split(",")]
    except ValueError:
        dims = []
    if len(dims) not in counts or min(dims) < 1:
        raise ExprError(f"bad --shape {text!r}: expected {what} of positive integers")
    return dims


def check_options(options: dict[str, str], allowed: Sequence[str], op: str) -> None:
    """ExprError naming the first option an op does not take (nothing is silently ignored)."""
    for name in options:
        if name not in allowed:
            raise ExprError(f"--{name} does not apply to --op {op}; it takes: "
                            f"{', '.join('--' + a for a in allowed) or 'no extra options'}")
