"""The contraction expression: C[b,m,n] = epilogue(A[b,m,k] @ B[b,k,n]) in any layout, the epilogue
any chain of elementwise steps, with extra inputs (a residual, row or column vectors)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from tritune.kernels.epilogue import (Binary, BiasAdd, Clamp, Epilogue, Gelu, Input, Pow, Relu, Scale, Unary,
                                      epilogue_from_dict, inputs_of)
from tritune.kernels.expr import INT32_MAX, ExprError, Keyed, check_fields
from tritune.kernels.norm import check_norm
from tritune.kernels.norm import describe as describe_norm


@dataclass(frozen=True)
class Matmul(Keyed):
    """Contraction C[b,m,n] = epilogue(sum_k A[b,m,k] * B[b,k,n]), accumulated in fp32.

    trans_a / trans_b say the operand is stored transposed (A as [K, M], B as [N, K]);
    allow_tf32 lets fp32 inputs use tf32 tensor cores (recorded in the workload). The epilogue's
    extra inputs (`inputs`) are operands after the bias: a residual [B, M, N] (batch stride 0 to
    share one [M, N]), or vectors over rows [M] or columns [N] shared by the batch. `norm_eps`:
    A's rows are read through an RMSNorm with this epsilon and a weight [K] (`tritune.kernels.norm`;
    one row-major A, no batch), the weight the kernel's last argument; `layer_norm`: through a
    LayerNorm instead, its weight and bias [K] the kernel's last two arguments.
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
    norm_eps: float | None = None
    layer_norm: bool = False
    op: ClassVar[str] = "matmul"

    def __post_init__(self) -> None:
        check_fields(self, ("m", "n", "k", "batch"))
        object.__setattr__(self, "epilogue", tuple(self.epilogue))
        if not all(isinstance(e, Epilogue) for e in self.epilogue):
            raise ExprError(f"an epilogue is a sequence of steps, got {self.epilogue!r}")
        if max(self.m * self.k, self.k * self.n, self.m * self.n) > INT32_MAX:
            raise ExprError("each operand must have fewer than 2**31 elements per batch")
        check_norm(self.norm_eps)
        if self.norm_eps is not None and (self.batch > 1 or self.trans_a):
            raise ExprError("a row norm before the contraction needs one row-major A (no batch, A not transposed)")
        if self.layer_norm is not False and (self.layer_norm is not True or self.norm_eps is None):
            raise ExprError("layer_norm is True only with a norm epsilon (norm_eps), else False")

    @property
    def has_bias(self) -> bool:
        """True when the epilogue reads a bias vector."""
        return any(e.needs_bias for e in self.epilogue)

    @property
    def inputs(self) -> tuple[Input, ...]:
        """The epilogue's extra inputs, in kernel argument order."""
        return inputs_of(self.epilogue)

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
        d = {
            "op": self.op, "batch": self.batch, "m": self.m, "n": self.n, "k": self.k,
            "dtype": self.dtype, "trans_a": self.trans_a, "trans_b": self.trans_b,
            "epilogue": [e.to_dict() for e in self.epilogue], "tf32": self.tf32,
        }
        # only a normed workload names its norm: every other workload keeps its key
        if self.norm_eps is None:
            return d
        return {**d, "norm_eps": self.norm_eps, **({"layer_norm": True} if self.layer_norm else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "Matmul":
        """Inverse of to_dict."""
        if d.get("op") != cls.op:
            raise ExprError(f"not a matmul workload: op={d.get('op')!r}")
        try:
            return cls(
                m=d["m"], n=d["n"], k=d["k"], batch=d.get("batch", 1), dtype=d["dtype"],
                trans_a=d.get("trans_a", False), trans_b=d.get("trans_b", False),
                epilogue=tuple(epilogue_from_dict(e) for e in d.get("epilogue", ())),
                allow_tf32=d.get("tf32", True) or d["dtype"] != "fp32", norm_eps=d.get("norm_eps"),
                layer_norm=d.get("layer_norm", False),
            )
        except (KeyError, TypeError) as e:
            raise ExprError(f"bad matmul workload spec: {e}") from None

    def shape_distance(self, other: "Matmul") -> float:
        """Distance in log2 space between two problem sizes (for nearest-shape fallback)."""
        dims = ("batch", "m", "n", "k")
        return math.sqrt(sum((math.log2(getattr(self, d)) - math.log2(getattr(other, d))) ** 2 for d in dims))

    def describe(self) -> str:
        """Short human form, e.g. 'matmul 4096x4096x4096 fp16'."""
        b = f"{self.batch}x" if self.batch > 1 else ""
        lay = ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")
        epi = "+" + "+".join(e.name for e in self.epilogue) if self.epilogue else ""
        return f"matmul {b}{self.m}x{self.n}x{self.k} {self.dtype} {lay}{describe_norm(self.norm_eps, self.layer_norm)}{epi}"


# Small awkward contractions (no size a multiple of a tile, M or N of 1, batched, every layout and
# epilogue and extra input kind, every dtype) for correctness checks on a GPU and under the interpreter (which computes
# bf16 dots wrongly: CPU tests skip that one).
AWKWARD = (
    Matmul(37, 29, 53), Matmul(1, 45, 70, trans_a=True), Matmul(50, 1, 33, trans_b=True),
    Matmul(19, 23, 41, batch=3, dtype="fp32", trans_a=True, trans_b=True, epilogue=(Scale(0.5), BiasAdd(), Gelu())),
    Matmul(64, 48, 17, batch=2, epilogue=(BiasAdd(), Relu())),
    Matmul(33, 47, 29, dtype="fp32", allow_tf32=False, epilogue=(Gelu("tanh"),)),
    Matmul(70, 50, 128, dtype="bf16", epilogue=(BiasAdd(), Gelu())),
    Matmul(9, 130, 72, batch=4, dtype="bf16", trans_b=True, epilogue=(Relu(),)),
    # general epilogues: a residual after bias + GELU; row and column scales, constants and
    # x * sigmoid(x) written as a chain; the residual in fp32 beside a bf16 output
    Matmul(37, 29, 53, trans_b=True, epilogue=(BiasAdd(), Gelu("tanh"), Binary("add", Input("mn", "fp16")))),
    Matmul(19, 23, 41, batch=3, dtype="fp32", trans_a=True, epilogue=(
        Binary("mul", Input("m", "fp32")), Binary("add", Input("n", "fp16")), Binary("mul", (Unary("sigmoid"),)),
        Binary("add", 0.5), Clamp(-2.0, 3.0), Pow(2))),
    Matmul(70, 50, 128, dtype="bf16", epilogue=(Unary("silu"), Binary("mul", Input("mn", "fp32")),
                                                Binary("mul", Input("n", "bf16")))),
    # an RMSNorm prologue: alone, with a bias and a residual, in bf16, K not a multiple of a step
    Matmul(37, 29, 53, trans_b=True, norm_eps=1e-6),
    Matmul(1, 45, 70, dtype="fp32", epilogue=(BiasAdd(), Binary("add", Input("mn", "fp32"))), norm_eps=1e-5),
    Matmul(9, 130, 72, dtype="bf16", trans_b=True, norm_eps=1e-6),
    # a LayerNorm prologue: one row with a bias and GELU over a [K, N] weight, rows past a tile
    # with a residual, bf16, K not a multiple of a step
    Matmul(1, 45, 70, epilogue=(BiasAdd(), Gelu()), norm_eps=1e-5, layer_norm=True),
    Matmul(37, 29, 53, dtype="fp32", trans_b=True, epilogue=(Binary("add", Input("mn", "fp32")),),
           norm_eps=1e-5, layer_norm=True),
    Matmul(9, 130, 72, dtype="bf16", trans_b=True, norm_eps=1e-6, layer_norm=True),
)
