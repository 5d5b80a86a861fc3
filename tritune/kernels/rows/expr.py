"""Row reductions: softmax and layernorm over the last dimension of an [M, N] tensor.

Both read every row once, reduce it (max and sum of exponentials; mean and variance) in fp32 and
write a row of the same shape: memory-bound, so they are rated in bytes moved, not flops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tritune.kernels.expr import DTYPE_BYTES, INT32_MAX, ExprError, Keyed, check_fields


@dataclass(frozen=True)
class RowOp(Keyed):
    """y[m, :] = f(x[m, :]) for each of M rows of length N; fp32 math whatever the storage type."""

    m: int
    n: int
    dtype: str = "fp16"
    op: ClassVar[str] = ""
    vectors: ClassVar[int] = 0  # length-N parameter vectors read besides x

    def __post_init__(self) -> None:
        check_fields(self, ("m", "n"))
        if self.m * self.n > INT32_MAX:
            raise ExprError(f"the input must have fewer than 2**31 elements, has {self.m * self.n}")

    @property
    def flops(self) -> int:
        """Not counted: a row reduction is bound by memory (see `bytes`)."""
        return 0

    @property
    def bytes(self) -> int:
        """Bytes a kernel must move at least: read x and write y once (and any per-column vectors)."""
        return (2 * self.m + self.vectors) * self.n * DTYPE_BYTES[self.dtype]

    def extra(self) -> dict:
        """Fields of a subclass beyond m, n and dtype, as stored."""
        return {}

    def to_dict(self) -> dict:
        """Canonical dict form (the workload spec stored in the database)."""
        return {"op": self.op, "m": self.m, "n": self.n, "dtype": self.dtype, **self.extra()}

    @classmethod
    def from_dict(cls, d: dict) -> "RowOp":
        """Inverse of to_dict (ExprError if it is not a spec of this op)."""
        if d.get("op") != cls.op:
            raise ExprError(f"not a {cls.op} workload: op={d.get('op')!r}")
        try:
            return cls(**{k: v for k, v in d.items() if k != "op"})
        except TypeError as e:
            raise ExprError(f"bad {cls.op} workload spec: {e}") from None

    def describe(self) -> str:
        """Short human form, e.g. 'softmax 4096x4096 fp16'."""
        extra = "".join(f" {k}={v:g}" for k, v in self.extra().items())
        return f"{self.op} {self.m}x{self.n} {self.dtype}{extra}"


@dataclass(frozen=True)
class Softmax(RowOp):
    """y = exp(x - max(x)) / sum(exp(x - max(x))) along each row."""

    op: ClassVar[str] = "softmax"


@dataclass(frozen=True)
class LayerNorm(RowOp):
    """y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias along each row (biased variance),
    as torch.nn.functional.layer_norm over the last dimension; weight and bias have length N."""

    eps: float = 1e-5
    op: ClassVar[str] = "layernorm"
    vectors: ClassVar[int] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0 <= self.eps < math.inf:
            raise ExprError(f"eps must be a finite number >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))  # 0 and 0.0: one workload key

    def extra(self) -> dict:
        return {"eps": self.eps}


# Small awkward row reductions (odd N, one column, one row, N past any single block, every dtype)
# for correctness checks on a GPU and under the interpreter.
AWKWARD = (
    Softmax(37, 1000), Softmax(1, 4099, "fp32"), Softmax(129, 1, "bf16"), Softmax(5, 50257),
    LayerNorm(37, 1000), LayerNorm(1, 4099, "fp32"), LayerNorm(129, 3, "bf16"), LayerNorm(6, 20000, eps=1e-3),
)
