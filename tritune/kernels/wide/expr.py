"""The wide GEMM: outs_i = x @ W_iᵀ [+ b_i] for 2 or 3 weights sharing the input x (attention's
q, k and v projections), one launch, one output tensor per weight."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd
from tritune.kernels.expr import INT32_MAX, ExprError, Keyed, check_fields
from tritune.kernels.norm import check_norm
from tritune.kernels.norm import describe as describe_norm

MAX_WEIGHTS = 3  # q, k, v; the template's if/elif chain has one branch per weight


@dataclass(frozen=True)
class Wide(Keyed):
    """outs_i[m, n] = sum_k x[m,k] W_i[n,k] [+ b_i[n]] for each width N_i of `ns`, fp32 accumulation.

    x is [M, K] row-major; the weights are [N_i, K] as nn.Linear stores them (trans_b, the default)
    or [K, N_i], all of one layout. `bias` adds a bias vector [N_i] to each product; allow_tf32 as
    for matmul; `norm_eps`: x's rows are read through an RMSNorm with this epsilon and a weight [K]
    (`tritune.kernels.norm`), the launch's last argument.
    """

    m: int
    ns: tuple[int, ...]
    k: int
    dtype: str = "fp16"
    trans_b: bool = True
    bias: bool = False
    allow_tf32: bool = True
    norm_eps: float | None = None
    op: ClassVar[str] = "wide"

    def __post_init__(self) -> None:
        check_fields(self, ("m", "k"))
        if isinstance(self.ns, (str, bytes)) or not hasattr(self.ns, "__iter__"):
            raise ExprError(f"ns must be {2}..{MAX_WEIGHTS} output widths, got {self.ns!r}")
        object.__setattr__(self, "ns", tuple(self.ns))
        if not 2 <= len(self.ns) <= MAX_WEIGHTS or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in self.ns):
            raise ExprError(f"ns must be 2 to {MAX_WEIGHTS} positive output widths, got {self.ns!r}")
        for name in ("trans_b", "bias", "allow_tf32"):
            if not isinstance(getattr(self, name), bool):
                raise ExprError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if max(self.m * self.k, self.k * max(self.ns), self.m * sum(self.ns)) > INT32_MAX:
            raise ExprError("each operand (and all outputs together) must have fewer than 2**31 elements")
        check_norm(self.norm_eps)

    @property
    def flops(self) -> int:
        """Multiply-adds of every product counted as two operations."""
        return 2 * self.m * sum(self.ns) * self.k

    @property
    def tf32(self) -> bool:
        """Whether tensor cores may round fp32 inputs to tf32."""
        return self.dtype == "fp32" and self.allow_tf32

    def as_matmul(self, n: int | None = None) -> Matmul:
        """One product of width `n` (default: all outputs side by side) as a Matmul: what the
        schedule space, features and template helpers build on (with the row norm), and each
        projection's own site (without: the norm stays a kernel of its own)."""
        return Matmul(self.m, n or sum(self.ns), self.k, dtype=self.dtype, trans_b=self.trans_b,
                      epilogue=(BiasAdd(),) if self.bias else (), allow_tf32=self.allow_tf32,
                      norm_eps=None if n else self.norm_eps)

    def to_dict(self) -> dict:
        """Canonical dict form (the workload spec stored in the database)."""
        d = {"op": self.op, "m": self.m, "ns": list(self.ns), "k": self.k, "dtype": self.dtype,
             "trans_b": self.trans_b, "bias": self.bias, "tf32": self.tf32}
        return d if self.norm_eps is None else {**d, "norm_eps": self.norm_eps}

    @classmethod
    def from_dict(cls, d: dict) -> "Wide":
        """Inverse of to_dict (ExprError if it is not a wide spec)."""
        if d.get("op") != cls.op:
            raise ExprError(f"not a wide workload: op={d.get('op')!r}")
        try:
            return cls(m=d["m"], ns=d["ns"], k=d["k"], dtype=d["dtype"], trans_b=d["trans_b"], bias=d["bias"],
                       allow_tf32=d.get("tf32", True) or d["dtype"] != "fp32", norm_eps=d.get("norm_eps"))
        except (KeyError, TypeError) as e:
            raise ExprError(f"bad wide workload spec: {e}") from None

    def describe(self) -> str:
        """Short human form, e.g. 'wide 2048x(2048+512+512)x2048 fp16'."""
        extra = describe_norm(self.norm_eps) + ("" if self.trans_b else " KN") + (" +bias" if self.bias else "")
        return f"wide {self.m}x({'+'.join(map(str, self.ns))})x{self.k} {self.dtype}{extra}"


# Small awkward wide GEMMs (no size a multiple of a tile, M or a width of 1, two and three weights,
# both layouts, biases, every dtype) for correctness checks on a GPU and under the interpreter
# (which computes bf16 dots wrongly: CPU tests skip those).
AWKWARD = (
    Wide(37, (29, 13, 13), 53), Wide(1, (45, 70), 70, trans_b=False),
    Wide(50, (1, 33, 17), 33, bias=True),
    Wide(33, (47, 20), 29, dtype="fp32", allow_tf32=False, bias=True, trans_b=False),
    Wide(19, (70, 24, 24), 41, dtype="fp32"),
    Wide(70, (50, 18, 18), 128, dtype="bf16", bias=True), Wide(9, (130, 33), 72, dtype="bf16", trans_b=False),
    # an RMSNorm prologue (q/k/v after a Llama or Qwen layer's input norm)
    Wide(37, (29, 13, 13), 53, bias=True, norm_eps=1e-6), Wide(16, (64, 16, 16), 64, dtype="bf16", norm_eps=1e-6),
)
