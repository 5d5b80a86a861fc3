"""The gated dual GEMM: out = act(x @ W1ᵀ [+ b1]) * (x @ W2ᵀ [+ b2]), the gated MLP's first half
(SwiGLU with silu, GeGLU with gelu), both products sharing the input x."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import Epilogue
from tritune.kernels.expr import INT32_MAX, ExprError, Keyed, check_fields
from tritune.kernels.norm import check_norm
from tritune.kernels.norm import describe as describe_norm
from tritune.kernels.pointwise import unary

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")  # gelu: exact (erf); gelu_tanh: the tanh approximation


@dataclass(frozen=True)
class Gated(Keyed):
    """out[m, n] = act(sum_k x[m,k] W1[n,k] [+ b1[n]]) * (sum_k x[m,k] W2[n,k] [+ b2[n]]), fp32 accumulation.

    x is [M, K] row-major; the weights are [N, K] as nn.Linear stores them (trans_b, the default)
    or [K, N]; both of one layout. `bias` adds a bias vector [N] to each product before the
    activation and the product; allow_tf32 as for matmul; `norm_eps`: x's rows are read through an
    RMSNorm with this epsilon and a weight [K] (`tritune.kernels.norm`), the launch's last argument.
    """

    m: int
    n: int
    k: int
    dtype: str = "fp16"
    activation: str = "silu"
    trans_b: bool = True
    bias: bool = False
    allow_tf32: bool = True
    norm_eps: float | None = None
    op: ClassVar[str] = "gated"

    def __post_init__(self) -> None:
        check_fields(self, ("m", "n", "k"))
        if self.activation not in ACTIVATIONS:
            raise ExprError(f"unknown activation {self.activation!r}; one of {', '.join(ACTIVATIONS)}")
        for name in ("trans_b", "bias", "allow_tf32"):
            if not isinstance(getattr(self, name), bool):
                raise ExprError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if max(self.m * self.k, self.k * self.n, self.m * self.n) > INT32_MAX:
            raise ExprError("each operand must have fewer than 2**31 elements")
        check_norm(self.norm_eps)

    @property
    def act(self) -> Epilogue:
        """The activation as an epilogue step (its Triton code and torch reference)."""
        return unary(self.activation)

    @property
    def flops(self) -> int:
        """Multiply-adds of both products counted as two operations."""
        return 4 * self.m * self.n * self.k

    @property
    def tf32(self) -> bool:
        """Whether tensor cores may round fp32 inputs to tf32."""
        return self.dtype == "fp32" and self.allow_tf32

    def as_matmul(self) -> Matmul:
        """One of the two products as a Matmul (what the schedule space and features build on)."""
        return Matmul(self.m, self.n, self.k, dtype=self.dtype, trans_b=self.trans_b, allow_tf32=self.allow_tf32)

    def to_dict(self) -> dict:
        """Canonical dict form (the workload spec stored in the database)."""
        d = {"op": self.op, "m": self.m, "n": self.n, "k": self.k, "dtype": self.dtype,
             "activation": self.activation, "trans_b": self.trans_b, "bias": self.bias, "tf32": self.tf32}
        return d if self.norm_eps is None else {**d, "norm_eps": self.norm_eps}

    @classmethod
    def from_dict(cls, d: dict) -> "Gated":
        """Inverse of to_dict (ExprError if it is not a gated spec)."""
        if d.get("op") != cls.op:
            raise ExprError(f"not a gated workload: op={d.get('op')!r}")
        try:
            return cls(m=d["m"], n=d["n"], k=d["k"], dtype=d["dtype"], activation=d["activation"],
                       trans_b=d["trans_b"], bias=d["bias"], allow_tf32=d.get("tf32", True) or d["dtype"] != "fp32",
                       norm_eps=d.get("norm_eps"))
        except (KeyError, TypeError) as e:
            raise ExprError(f"bad gated workload spec: {e}") from None

    def describe(self) -> str:
        """Short human form, e.g. 'gated silu 2048x8192x2048 fp16'."""
        extra = describe_norm(self.norm_eps) + ("" if self.trans_b else " KN") + (" +bias" if self.bias else "")
        return f"gated {self.activation} {self.m}x{self.n}x{self.k} {self.dtype}{extra}"


# Small awkward dual GEMMs (no size a multiple of a tile, M or N of 1, both weight layouts, every
# activation, biases, every dtype) for correctness checks on a GPU and under the interpreter
# (which computes bf16 dots wrongly: CPU tests skip that one).
AWKWARD = (
    Gated(37, 29, 53), Gated(1, 45, 70, activation="gelu", trans_b=False),
    Gated(50, 1, 33, activation="gelu_tanh", bias=True),
    Gated(33, 47, 29, dtype="fp32", allow_tf32=False, activation="gelu", bias=True, trans_b=False),
    Gated(19, 70, 41, dtype="fp32", activation="silu"),
    Gated(70, 50, 128, dtype="bf16", bias=True), Gated(9, 130, 72, dtype="bf16", activation="gelu_tanh", trans_b=False),
    # an RMSNorm prologue (gate/up after a Llama or Qwen layer's post-attention norm)
    Gated(37, 29, 53, norm_eps=1e-6), Gated(19, 70, 41, dtype="fp32", bias=True, norm_eps=1e-5),
    Gated(16, 64, 64, dtype="bf16", norm_eps=1e-6),
)
