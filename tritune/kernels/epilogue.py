"""Epilogues: elementwise steps applied to a contraction's fp32 accumulator before the store,
shared by every family that fuses them (contraction, conv2d)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from tritune.kernels.expr import ExprError


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


def parse_epilogue(text: str) -> tuple[Epilogue, ...]:
    """'scale=0.5,bias,gelu_tanh' (tune-cli's --epilogue) -> epilogue steps."""
    steps = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, arg = item.partition("=")
        spec: dict[str, Any] = {"op": name}
        if name == "scale":
            try:
                spec["alpha"] = float(arg or 1.0)
            except ValueError:
                raise ExprError(f"bad scale {arg!r} in --epilogue: expected a number") from None
        elif name == "gelu_tanh":
            spec = {"op": "gelu", "approximate": "tanh"}
        steps.append(epilogue_from_dict(spec))
    return tuple(steps)
