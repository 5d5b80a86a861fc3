"""Tensor expressions: what is computed (shapes, dtypes, layout, fused epilogue), never how."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

DTYPES = ("fp16", "bf16", "fp32")
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
INT32_MAX = 2**31 - 1


class ExprError(ValueError):
    """An expression that cannot be built: bad shape, dtype or epilogue."""


@dataclass(frozen=True)
class Epilogue:
    """One elementwise step applied to the fp32 accumulator, in order, before the store."""

    name: ClassVar[str] = ""
    needs_bias: ClassVar[bool] = False

    def triton(self) -> str:
        """Triton statement(s) updating `acc` (fp32 [BLOCK_M, BLOCK_N]); `bias` is loaded if needed."""
        raise NotImplementedError

    def reference(self, x: Any, bias: Any) -> Any:
        """The same step on a torch tensor (float64 reference)."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """Canonical dict form."""
        return {"op": self.name, **{k: v for k, v in self.__dict__.items()}}


@dataclass(frozen=True)
class Scale(Epilogue):
    """acc * alpha."""

    alpha: float = 1.0
    name: ClassVar[str] = "scale"

    def triton(self) -> str:
        return f"acc = acc * {float(self.alpha)!r}"

    def reference(self, x: Any, bias: Any) -> Any:
        return x * self.alpha


@dataclass(frozen=True)
class BiasAdd(Epilogue):
    """acc + bias[n] (a vector over the output columns, as in a linear layer)."""

    name: ClassVar[str] = "bias"
    needs_bias: ClassVar[bool] = True

    def triton(self) -> str:
        return "acc = acc + bias[None, :]"

    def reference(self, x: Any, bias: Any) -> Any:
        return x + bias


@dataclass(frozen=True)
class Relu(Epilogue):
    """max(acc, 0)."""

    name: ClassVar[str] = "relu"

    def triton(self) -> str:
        return "acc = tl.maximum(acc, 0.0)"

    def reference(self, x: Any, bias: Any) -> Any:
        return x.clamp_min(0)


@dataclass(frozen=True)
class Gelu(Epilogue):
    """GELU, exact (erf) or the tanh approximation."""

    approximate: str = "none"
    name: ClassVar[str] = "gelu"

    def __post_init__(self) -> None:
        if self.approximate not in ("none", "tanh"):
            raise ExprError(f"gelu approximate must be 'none' or 'tanh', got {self.approximate!r}")

    def triton(self) -> str:
        if self.approximate == "tanh":
            # 0.5*x*(1+tanh(u)) == x*sigmoid(2u); tl has sigmoid but no portable tanh
            return "acc = acc * tl.sigmoid(1.5957691216057308 * (acc + 0.044715 * acc * acc * acc))"
        return "acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))"

    def reference(self, x: Any, bias: Any) -> Any:
        import torch.nn.functional as F

        return F.gelu(x, approximate=self.approximate)


EPILOGUES: dict[str, Callable[..., Epilogue]] = {e.name: e for e in (Scale, BiasAdd, Relu, Gelu)}


def epilogue_from_dict(d: dict) -> Epilogue:
    """Inverse of Epilogue.to_dict."""
    d = dict(d)
    name = d.pop("op", None)
    if name not in EPILOGUES:
        raise ExprError(f"unknown epilogue {name!r}; known: {', '.join(EPILOGUES)}")
    return EPILOGUES[name](**d)


@dataclass(frozen=True)
class Matmul:
    """Contraction C[b,m,n] = epilogue(sum_k A[b,m,k] * B[b,k,n]), accumulated in fp32.

    trans_a / trans_b say the operand is stored transposed (A as [K, M], B as [N, K]);
    allow_tf32 lets fp32 inputs use tf32 tensor cores (recorded in the workload).
    """

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "fp16"
    trans_a: bool = False
    trans_b: bool = False
    epilogue: tuple[Epilogue, ...] = field(default=())
    allow_tf32: bool = True
    op: ClassVar[str] = "matmul"

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ExprError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES:
            raise ExprError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if max(self.m * self.k, self.k * self.n, self.m * self.n) > INT32_MAX:
            raise ExprError("each operand must have fewer than 2**31 elements per batch")
        if sum(e.needs_bias for e in self.epilogue) > 1:
            raise ExprError("at most one bias add per epilogue")

    @property
    def has_bias(self) -> bool:
        """True when the epilogue reads a bias vector."""
        return any(e.needs_bias for e in self.epilogue)

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations."""
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def tf32(self) -> bool:
        """Whether tensor cores may round fp32 inputs to tf32."""
        return self.dtype == "fp32" and self.allow_tf32

    def to_dict(self) -> dict:
        """Canonical dict form (the workload spec stored in the database)."""
        return {
            "op": self.op, "batch": self.batch, "m": self.m, "n": self.n, "k": self.k,
            "dtype": self.dtype, "trans_a": self.trans_a, "trans_b": self.trans_b,
            "epilogue": [e.to_dict() for e in self.epilogue], "tf32": self.tf32,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Matmul":
        """Inverse of to_dict."""
        if d.get("op") != cls.op:
            raise ExprError(f"not a matmul workload: op={d.get('op')!r}")
        return cls(
            m=d["m"], n=d["n"], k=d["k"], batch=d.get("batch", 1), dtype=d["dtype"],
            trans_a=d.get("trans_a", False), trans_b=d.get("trans_b", False),
            epilogue=tuple(epilogue_from_dict(e) for e in d.get("epilogue", ())),
            allow_tf32=d.get("tf32", True) or d["dtype"] != "fp32",
        )

    def to_json(self) -> str:
        """Canonical JSON form; the workload key derives from it."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """A short stable hash of the canonical JSON form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def shape_distance(self, other: "Matmul") -> float:
        """Distance in log2 space between two problem sizes (for nearest-shape fallback)."""
        dims = ("batch", "m", "n", "k")
        return math.sqrt(sum((math.log2(getattr(self, d)) - math.log2(getattr(other, d))) ** 2 for d in dims))

    def describe(self) -> str:
        """Short human form, e.g. 'matmul 4096x4096x4096 fp16'."""
        b = f"{self.batch}x" if self.batch > 1 else ""
        lay = ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")
        epi = "+" + "+".join(e.name for e in self.epilogue) if self.epilogue else ""
        return f"matmul {b}{self.m}x{self.n}x{self.k} {self.dtype} {lay}{epi}"


# ----- helpers shared by every expression type (Matmul predates them and keeps its own copies)

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


def check_fields(expr: Any, dims: tuple[str, ...]) -> None:
    """ExprError unless the named fields are positive ints, `dtype` is known, any `epilogue` has one bias at most."""
    for name in dims:
        value = getattr(expr, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExprError(f"{name} must be a positive integer, got {value!r}")
    if expr.dtype not in DTYPES:
        raise ExprError(f"unknown dtype {expr.dtype!r}; choose one of {', '.join(DTYPES)}")
    if sum(e.needs_bias for e in getattr(expr, "epilogue", ())) > 1:
        raise ExprError("at most one bias add per epilogue")
