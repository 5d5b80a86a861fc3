"""The conv2d expression: a 2-D convolution over NHWC activations, computed as an implicit GEMM.

Layouts: input [N, H, W, C], weight [K, R, S, C], output [N, P, Q, K], all channels innermost.
KRSC puts the reduction's innermost index (c) contiguous in both operands, so one K step of the
implicit GEMM loads C-contiguous rows of the input and of the weight; it is also exactly the memory
of PyTorch's channels_last [K, C, R, S] weight, so torch/cuDNN runs on the same bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Epilogue, Gelu, Relu, Scale, epilogue_from_dict, inputs_of
from tritune.kernels.expr import INT32_MAX, ExprError, Keyed, check_fields

Pair = tuple[int, int]
DIMS = ("n", "h", "w", "c", "k", "r", "s")


def pair(value: Any, name: str, least: int) -> Pair:
    """(h, w) from an int or a pair of ints, each at least `least` (ExprError otherwise)."""
    items = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        h, w = items
    except (TypeError, ValueError):
        raise ExprError(f"{name} must be an int or a pair (h, w), got {value!r}") from None
    for v in (h, w):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ExprError(f"{name} must be integers >= {least}, got {value!r}")
    return (h, w)


def out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output length of one spatial dimension (PyTorch's formula)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


@dataclass(frozen=True)
class Conv2d(Keyed):
    """y[n,p,q,k] = epilogue(sum_{r,s,c} x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, c] * w[k,r,s,c]).

    Zero padding; fp32 accumulation; allow_tf32 lets fp32 inputs use tf32 tensor cores. The bias
    of the epilogue runs over the output channels k.
    """

    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: Pair = (1, 1)
    padding: Pair = (0, 0)
    dilation: Pair = (1, 1)
    dtype: str = "fp16"
    epilogue: tuple[Epilogue, ...] = field(default=())
    allow_tf32: bool = True
    op: ClassVar[str] = "conv2d"

    def __post_init__(self) -> None:
        check_fields(self, DIMS)
        for name, least in (("stride", 1), ("padding", 0), ("dilation", 1)):
            object.__setattr__(self, name, pair(getattr(self, name), name, least))  # 2 -> (2, 2)
        object.__setattr__(self, "epilogue", tuple(self.epilogue))
        if not all(isinstance(e, Epilogue) for e in self.epilogue) or inputs_of(self.epilogue):
            raise ExprError("a conv2d epilogue is a sequence of steps without extra inputs (bias excepted)")
        if self.p < 1 or self.q < 1:
            raise ExprError(f"output size {self.p}x{self.q} <= 0: the {self.r}x{self.s} filter "
                            f"(dilation {self.dilation}) does not fit the padded {self.h}x{self.w} input")
        sizes = {"input": self.n * self.h * self.w * self.c, "weight": self.k * self.r * self.s * self.c,
                 "output": self.n * self.p * self.q * self.k}
        for what, elements in sizes.items():
            if elements > INT32_MAX:
                raise ExprError(f"the {what} must have fewer than 2**31 elements, has {elements}")

    @property
    def p(self) -> int:
        """Output height."""
        return out_size(self.h, self.r, self.stride[0], self.padding[0], self.dilation[0])

    @property
    def q(self) -> int:
        """Output width."""
        return out_size(self.w, self.s, self.stride[1], self.padding[1], self.dilation[1])

    @property
    def gemm(self) -> tuple[int, int, int]:
        """The implicit GEMM's (M, N, K) = (N*P*Q, K, R*S*C)."""
        return self.n * self.p * self.q, self.k, self.r * self.s * self.c

    @property
    def has_bias(self) -> bool:
        """True when the epilogue reads a bias vector (over output channels)."""
        return any(e.needs_bias for e in self.epilogue)

    @property
    def tf32(self) -> bool:
        """Whether tensor cores may round fp32 inputs to tf32."""
        return self.dtype == "fp32" and self.allow_tf32

    @property
    def flops(self) -> int:
        """Multiply-adds of the direct convolution (padding included) counted as two operations."""
        m, n, k = self.gemm
        return 2 * m * n * k

    def as_matmul(self) -> Matmul:
        """The GEMM view as a Matmul (what the schedule space and cost-model features see).

        Split into a batch only when the im2col matrix would pass Matmul's 2**31 element bound:
        the conv kernel never materialises it, so only the features' view must stay legal.
        """
        m, n, k = self.gemm
        batch = 1
        while -(-m // batch) * max(n, k) > INT32_MAX:
            batch *= 2
        return Matmul(-(-m // batch), n, k, batch=batch, dtype=self.dtype, allow_tf32=self.allow_tf32)

    def to_dict(self) -> dict:
        """Canonical dict form (the workload spec stored in the database)."""
        return {"op": self.op, **{d: getattr(self, d) for d in DIMS},
                "stride": list(self.stride), "padding": list(self.padding), "dilation": list(self.dilation),
                "dtype": self.dtype, "epilogue": [e.to_dict() for e in self.epilogue], "tf32": self.tf32}

    @classmethod
    def from_dict(cls, d: dict) -> "Conv2d":
        """Inverse of to_dict (ExprError if it is not a conv2d spec)."""
        if d.get("op") != cls.op:
            raise ExprError(f"not a conv2d workload: op={d.get('op')!r}")
        try:
            return cls(**{k: d[k] for k in DIMS}, stride=tuple(d["stride"]), padding=tuple(d["padding"]),
                       dilation=tuple(d["dilation"]), dtype=d["dtype"],
                       epilogue=tuple(epilogue_from_dict(e) for e in d.get("epilogue", ())),
                       allow_tf32=d.get("tf32", True) or d["dtype"] != "fp32")
        except (KeyError, TypeError) as e:
            raise ExprError(f"bad conv2d workload spec: {e}") from None

    def describe(self) -> str:
        """Short human form, e.g. 'conv2d 32x56x56x64 -> 64 3x3 s1 p1 fp16'."""
        def hw(v: Pair) -> str:
            return str(v[0]) if v[0] == v[1] else f"{v[0]},{v[1]}"
        dil = f" d{hw(self.dilation)}" if self.dilation != (1, 1) else ""
        epi = "+" + "+".join(e.name for e in self.epilogue) if self.epilogue else ""
        return (f"conv2d {self.n}x{self.h}x{self.w}x{self.c}->{self.k} {self.r}x{self.s} "
                f"s{hw(self.stride)} p{hw(self.padding)}{dil} {self.dtype}{epi}")


# Small awkward convolutions (odd sizes, C below / not a multiple of a K step, strides, padding,
# dilation, batch, every filter size, every dtype) for correctness checks on a GPU and under the
# interpreter (which computes bf16 wrongly: CPU tests skip that one).
AWKWARD = (
    Conv2d(1, 7, 9, 3, 5, 3, 3, padding=1),
    Conv2d(2, 9, 7, 20, 17, 3, 3, stride=2, padding=1, epilogue=(BiasAdd(), Relu())),
    Conv2d(2, 6, 5, 16, 33, 1, 1, dtype="fp32"),
    Conv2d(1, 11, 10, 8, 9, 5, 5, padding=(2, 1), dilation=(1, 2)),
    Conv2d(3, 8, 8, 32, 16, 3, 3, dilation=2, padding=2, epilogue=(Scale(0.5),)),
    Conv2d(1, 13, 13, 3, 16, 7, 7, stride=2, padding=3),
    Conv2d(2, 5, 6, 48, 24, 3, 2, stride=(1, 2), padding=(1, 0), dtype="fp32", allow_tf32=False),
    Conv2d(2, 9, 7, 40, 24, 3, 3, stride=2, padding=1, dtype="bf16", epilogue=(BiasAdd(), Gelu())),
)
