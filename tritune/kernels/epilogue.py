"""Epilogues: elementwise steps applied to a contraction's fp32 accumulator before the store,
shared by every family that fuses them (contraction, conv2d).

An epilogue is a chain: each step maps the running value v (at first the accumulator) to a new
one. A binary step's other operand is a constant, an extra input (`Input`: a tensor of the
output's shape, or a vector over its rows or its columns, in any dtype), or a chain applied to v
itself, so a pointwise DAG whose shared value is v can be written too: x * sigmoid(x) is
`mul(other=[sigmoid])`. The canonical JSON form is the list of the steps' dicts; scale, bias,
relu and gelu keep the forms stored records have always had. Extra inputs are numbered in the
order they appear (depth first); the kernel reads them after its fixed arguments.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

from tritune.kernels.expr import ExprError, check_dtype


@dataclass(frozen=True)
class Epilogue:
    """One elementwise step applied to the fp32 value, in order, before the store."""

    name: ClassVar[str] = ""
    needs_bias: ClassVar[bool] = False

    def triton(self, v: str, emit: Any) -> str:
        """Triton expression of the step on the fp32 tile named `v` (`bias` is loaded if needed)."""
        raise NotImplementedError

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        """The same step on a torch tensor (float64 reference, or eager torch), given the bias and
        this step's own extra inputs."""
        raise NotImplementedError

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        """The step applied in place to a library call's output (as a fused pointwise kernel would)."""
        out.copy_(self.reference(out, bias, *inputs))

    def inputs(self) -> tuple["Input", ...]:
        """The extra inputs this step reads, in order."""
        return ()

    def to_dict(self) -> dict:
        """Canonical dict form."""
        return {"op": self.name, **{k: v for k, v in self.__dict__.items()}}


@dataclass(frozen=True)
class Scale(Epilogue):
    """acc * alpha (also what multiplying or dividing by a constant, and negating, is written as)."""

    alpha: float = 1.0
    name: ClassVar[str] = "scale"

    def triton(self, v: str, emit: Any) -> str:
        return f"{v} * {float(self.alpha)!r}"

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        return x * self.alpha

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        out.mul_(self.alpha)


@dataclass(frozen=True)
class BiasAdd(Epilogue):
    """acc + bias[n] (a vector over the output columns, in the output dtype, as in a linear layer)."""

    name: ClassVar[str] = "bias"
    needs_bias: ClassVar[bool] = True

    def triton(self, v: str, emit: Any) -> str:
        return f"{v} + bias[None, :]"

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        return x + bias

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        out.add_(bias)


@dataclass(frozen=True)
class Relu(Epilogue):
    """max(acc, 0)."""

    name: ClassVar[str] = "relu"

    def triton(self, v: str, emit: Any) -> str:
        return f"tl.maximum({v}, 0.0)"

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        return x.clamp_min(0)

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        out.relu_()


@dataclass(frozen=True)
class Gelu(Epilogue):
    """GELU, exact (erf) or the tanh approximation."""

    approximate: str = "none"
    name: ClassVar[str] = "gelu"

    def __post_init__(self) -> None:
        if self.approximate not in ("none", "tanh"):
            raise ExprError(f"gelu approximate must be 'none' or 'tanh', got {self.approximate!r}")

    def triton(self, v: str, emit: Any) -> str:
        if self.approximate == "tanh":
            # 0.5*x*(1+tanh(u)) == x*sigmoid(2u); tl has sigmoid but no portable tanh
            return f"{v} * tl.sigmoid(1.5957691216057308 * ({v} + 0.044715 * {v} * {v} * {v}))"
        return f"0.5 * {v} * (1.0 + tl.erf({v} * 0.7071067811865476))"

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        import torch.nn.functional as F

        return F.gelu(x, approximate=self.approximate)

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        import torch

        torch.ops.aten.gelu_(out, approximate=self.approximate)


# name -> Triton expression of the fp32 tile {v}; torch has the function (and its in-place form)
# under the same name, silu in torch.nn.functional. tanh through sigmoid: tl has no portable tanh.
UNARY = {
    "exp": "tl.exp({v})", "log": "tl.log({v})", "sqrt": "tl.sqrt({v})", "rsqrt": "tl.rsqrt({v})",
    "abs": "tl.abs({v})", "erf": "tl.erf({v})", "sigmoid": "tl.sigmoid({v})",
    "tanh": "2.0 * tl.sigmoid(2.0 * {v}) - 1.0", "silu": "{v} * tl.sigmoid({v})",
}


@dataclass(frozen=True)
class Unary(Epilogue):
    """f(acc) for a function of UNARY."""

    fn: str

    def __post_init__(self) -> None:
        if self.fn not in UNARY:
            raise ExprError(f"unknown elementwise function {self.fn!r}; known: {', '.join(UNARY)}")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.fn

    def triton(self, v: str, emit: Any) -> str:
        return UNARY[self.fn].format(v=v)

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        import torch
        import torch.nn.functional as F

        return F.silu(x) if self.fn == "silu" else getattr(torch, self.fn)(x)

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        import torch.nn.functional as F

        if self.fn == "silu":
            F.silu(out, inplace=True)
        else:
            getattr(out, self.fn + "_")()

    def to_dict(self) -> dict:
        return {"op": self.fn}


@dataclass(frozen=True)
class Pow(Epilogue):
    """acc ** exponent for a small integer exponent (2 to 8: repeated multiplication)."""

    exponent: int = 2
    name: ClassVar[str] = "pow"

    def __post_init__(self) -> None:
        if type(self.exponent) is not int or not 2 <= self.exponent <= 8:
            raise ExprError(f"pow takes an integer exponent from 2 to 8, got {self.exponent!r}")

    def triton(self, v: str, emit: Any) -> str:
        return " * ".join([v] * self.exponent)

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        return x.pow(self.exponent)

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        out.pow_(self.exponent)


@dataclass(frozen=True)
class Clamp(Epilogue):
    """acc clamped to [min, max]; either bound may be None (max(acc, 0) is written relu)."""

    min: float | None = None
    max: float | None = None
    name: ClassVar[str] = "clamp"

    def __post_init__(self) -> None:
        for side in ("min", "max"):
            value = getattr(self, side)
            if value is not None:
                object.__setattr__(self, side, number(value, f"clamp {side}"))
        if self.min is None and self.max is None:
            raise ExprError("clamp needs a min, a max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ExprError(f"clamp min {self.min} > max {self.max}")
        if self.min == 0.0 and self.max is None:
            raise ExprError("clamp with min 0 alone is relu: write relu")

    def triton(self, v: str, emit: Any) -> str:
        out = v if self.min is None else f"tl.maximum({v}, {self.min!r})"
        return out if self.max is None else f"tl.minimum({out}, {self.max!r})"

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        return x.clamp(self.min, self.max)

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        out.clamp_(self.min, self.max)


def number(value: Any, what: str) -> float:
    """A finite float (ExprError otherwise): constants enter the workload key in one form."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ExprError(f"{what} must be a finite number, got {value!r}")
    return float(value)


# what an extra input is, by its `shape`; vectors are shared by every batch entry
INPUT_SHAPES = {"mn": "of the output's shape ([B,]M,N)", "m": "one value per row ([M])",
                "n": "one value per column ([N])"}


@dataclass(frozen=True)
class Input:
    """An extra tensor operand of an epilogue, broadcast to the output; loaded and used as fp32."""

    shape: str
    dtype: str

    def __post_init__(self) -> None:
        if self.shape not in INPUT_SHAPES:
            raise ExprError(f"unknown input shape {self.shape!r}; known: {', '.join(INPUT_SHAPES)}")
        check_dtype(self.dtype)

    def to_dict(self) -> dict:
        """Canonical dict form."""
        return {"input": self.shape, "dtype": self.dtype}

    def broadcast(self, t: Any, out: Any) -> Any:
        """A view of tensor `t` (this input) that broadcasts against `out` (2-D or 3-D)."""
        if self.shape == "m":
            return t[:, None]
        if self.shape == "mn" and t.dim() > out.dim():
            return t.reshape(out.shape)  # a [1, M, N] input of a 2-D call
        return t


# name -> Triton expression of {v} and the other operand {o}; only add, rsub and rdiv take a
# constant (the others are written scale, add or clamp), so each constant step has one form
BINARY = {
    "add": "{v} + {o}", "sub": "{v} - {o}", "rsub": "{o} - {v}", "mul": "{v} * {o}", "div": "{v} / {o}",
    "rdiv": "{o} / {v}", "max": "tl.maximum({v}, {o})", "min": "tl.minimum({v}, {o})",
}
WITH_CONSTANT = {"add": "", "rsub": "", "rdiv": "", "sub": "add of -c", "mul": "scale", "div": "scale by 1/c",
                 "max": "clamp min", "min": "clamp max"}


@dataclass(frozen=True)
class Binary(Epilogue):
    """acc (op) other, where other is a constant, an extra Input, or a chain of steps applied to acc."""

    fn: str
    other: Any  # float | Input | tuple[Epilogue, ...]

    def __post_init__(self) -> None:
        if self.fn not in BINARY:
            raise ExprError(f"unknown binary op {self.fn!r}; known: {', '.join(BINARY)}")
        other = self.other
        if isinstance(other, (list, tuple)):
            other = tuple(other)
            if not other or not all(isinstance(s, Epilogue) for s in other):
                raise ExprError(f"{self.fn}: a chain operand is a non-empty list of steps")
            if any(s.needs_bias for s in walk(other)):
                raise ExprError("the bias is added in the main chain only (add a column input instead)")
        elif not isinstance(other, Input):
            other = number(other, f"{self.fn}'s operand")
            if WITH_CONSTANT[self.fn]:
                raise ExprError(f"{self.fn} by a constant is written {WITH_CONSTANT[self.fn]}")
        object.__setattr__(self, "other", other)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.fn

    def inputs(self) -> tuple[Input, ...]:
        if isinstance(self.other, Input):
            return (self.other,)
        return inputs_of(self.other) if isinstance(self.other, tuple) else ()

    def triton(self, v: str, emit: Any) -> str:
        if isinstance(self.other, Input):
            o = emit.load(self.other)
        elif isinstance(self.other, tuple):
            o = emit.chain(self.other, v)
        else:
            o = repr(self.other)
        return BINARY[self.fn].format(v=v, o=o)

    def _operand(self, x: Any, bias: Any, inputs: tuple) -> Any:
        if isinstance(self.other, Input):
            return self.other.broadcast(inputs[0], x)
        return apply(self.other, x, bias, inputs) if isinstance(self.other, tuple) else self.other

    def reference(self, x: Any, bias: Any = None, *inputs: Any) -> Any:
        return _combine(self.fn, x, self._operand(x, bias, inputs))

    def inplace(self, out: Any, bias: Any = None, *inputs: Any) -> None:
        o = self._operand(out, bias, inputs)
        if self.fn in ("add", "sub", "mul", "div"):
            getattr(out, self.fn + "_")(o)
        else:  # no in-place form in torch
            out.copy_(_combine(self.fn, out, o))

    def to_dict(self) -> dict:
        other = self.other
        if isinstance(other, tuple):
            other = [s.to_dict() for s in other]
        return {"op": self.fn, "other": other.to_dict() if isinstance(other, Input) else other}


def _combine(fn: str, x: Any, o: Any) -> Any:
    """x (fn) o in torch."""
    import torch

    if fn in ("max", "min"):
        return (torch.maximum if fn == "max" else torch.minimum)(x, o)
    return {"add": lambda: x + o, "sub": lambda: x - o, "rsub": lambda: o - x, "mul": lambda: x * o,
            "div": lambda: x / o, "rdiv": lambda: o / x}[fn]()


EPILOGUES: dict[str, Callable[..., Epilogue]] = {e.name: e for e in (Scale, BiasAdd, Relu, Gelu, Pow, Clamp)}


def epilogue_from_dict(d: dict) -> Epilogue:
    """Inverse of Epilogue.to_dict."""
    if not isinstance(d, dict):
        raise ExprError(f"an epilogue step is an object, got {d!r}")
    d = dict(d)
    name = d.pop("op", None)
    if name in UNARY and not d:
        return Unary(name)
    if name in BINARY and set(d) == {"other"}:
        return Binary(name, _operand_from_json(d["other"]))
    if name not in EPILOGUES:
        known = sorted({*EPILOGUES, *UNARY, *BINARY})
        raise ExprError(f"unknown epilogue {name!r} (or bad fields {sorted(d)}); known: {', '.join(known)}")
    try:
        return EPILOGUES[name](**d)
    except TypeError as e:
        raise ExprError(f"bad epilogue step {name!r}: {e}") from None


def _operand_from_json(other: Any) -> Any:
    if isinstance(other, list):
        return tuple(epilogue_from_dict(s) for s in other)
    if isinstance(other, dict):
        if set(other) != {"input", "dtype"}:
            raise ExprError(f"an input operand is {{'input': shape, 'dtype': dtype}}, got {other!r}")
        return Input(other["input"], other["dtype"])
    return other


def walk(steps: Sequence[Epilogue]) -> list[Epilogue]:
    """Every step of a chain, nested chains included (depth first)."""
    out = []
    for s in steps:
        out.append(s)
        if isinstance(s, Binary) and isinstance(s.other, tuple):
            out += walk(s.other)
    return out


def inputs_of(steps: Sequence[Epilogue]) -> tuple[Input, ...]:
    """The extra inputs of a chain, in the order the kernel takes them."""
    return tuple(i for s in steps for i in s.inputs())


def apply(steps: Sequence[Epilogue], x: Any, bias: Any = None, inputs: Sequence[Any] = ()) -> Any:
    """A chain on a torch tensor (functional): the float64 reference, or eager torch."""
    inputs = tuple(inputs)
    for s in steps:
        n = len(s.inputs())
        x, inputs = s.reference(x, bias, *inputs[:n]), inputs[n:]
    return x


def apply_(steps: Sequence[Epilogue], out: Any, bias: Any = None, inputs: Sequence[Any] = ()) -> None:
    """A chain applied in place to a library call's output."""
    inputs = tuple(inputs)
    for s in steps:
        n = len(s.inputs())
        s.inplace(out, bias, *inputs[:n])
        inputs = inputs[n:]
