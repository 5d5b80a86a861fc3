"""Epilogue steps by op name, in their one canonical form, and tune-cli's `--epilogue` grammar.

What a traced graph or a command line calls an op (`mul` by 2, `neg`, `max` with 0, `square`) is
turned here into the single step that stores it (`scale`, `scale`, `relu`, `pow`), so equal
epilogues always have equal workload keys.
"""
from __future__ import annotations

import json
from typing import Any

from tritune.kernels.epilogue import (BINARY, UNARY, Binary, BiasAdd, Clamp, Epilogue, Gelu, Input, Pow, Relu,
                                      Scale, Unary, epilogue_from_dict, number)
from tritune.kernels.expr import DTYPES, ExprError

# --epilogue names of extra inputs -> Input shapes
INPUT_NAMES = {"residual": "mn", "row": "m", "col": "n"}
GRAMMAR = (
    "comma-separated steps applied in order to the fp32 accumulator: bias (the [N] bias of a linear "
    "layer); relu, gelu, gelu_tanh, neg, square, " + ", ".join(UNARY) + "; scale=C, pow=2..8, clamp=LO:HI "
    "(either bound may be empty); add|sub|rsub|mul|div|rdiv=C with a number C; "
    "add|sub|rsub|mul|div|rdiv|max|min=IN with an extra input IN: residual ([B,]M,N), row ([M]) or col "
    "([N]), in the output dtype or IN:fp32; 'residual' alone adds one. Or the canonical JSON list, e.g. "
    "'[{\"op\":\"mul\",\"other\":[{\"op\":\"sigmoid\"}]}]' (x*sigmoid(x))"
)

KNOWN = ", ".join(["bias", "residual", "relu", "gelu", "gelu_tanh", "neg", "square", *UNARY, "scale=", "pow=", "clamp=",
                   *(f"{fn}=" for fn in BINARY)])


def unary(name: str) -> Epilogue:
    """The step of an elementwise function: relu, gelu, gelu_tanh, neg, square, or one of UNARY."""
    named = {"relu": Relu(), "gelu": Gelu(), "gelu_tanh": Gelu("tanh"), "neg": Scale(-1.0), "square": Pow(2)}
    if name in named:
        return named[name]
    return Unary(name)


def binary(fn: str, other: Any) -> Epilogue:
    """The step computing `acc fn other` for a constant, an Input or a chain (a tuple of steps);
    constants take the one form each is stored in (mul -> scale, sub -> add, max -> relu/clamp ...)."""
    if isinstance(other, (Input, tuple, list)):
        return Binary(fn, other)
    c = number(other, f"{fn}'s operand")
    if fn == "mul":
        return Scale(c)
    if fn == "div":
        if c == 0:
            raise ExprError("division by the constant 0")
        return Scale(1.0 / c)
    if fn == "sub":
        return Binary("add", -c)
    if fn == "max":
        return Relu() if c == 0 else Clamp(min=c)
    if fn == "min":
        return Clamp(max=c)
    return Binary(fn, c)


def parse_epilogue(text: str, dtype: str = "fp16") -> tuple[Epilogue, ...]:
    """tune-cli's --epilogue (see GRAMMAR) -> steps; extra inputs default to the output `dtype`."""
    text = text.strip()
    if text[:1] in ("[", "{"):
        try:
            steps = json.loads(text)
        except json.JSONDecodeError as e:
            raise ExprError(f"bad --epilogue JSON: {e}") from None
        if not isinstance(steps, list):
            raise ExprError("a JSON --epilogue is a list of steps")
        return tuple(epilogue_from_dict(s) for s in steps)
    return tuple(_step(item, dtype) for item in filter(None, (p.strip() for p in text.split(","))))


def _step(item: str, dtype: str) -> Epilogue:
    name, eq, arg = item.partition("=")
    if not eq:
        if name in ("bias", "scale"):
            return BiasAdd() if name == "bias" else Scale(1.0)
        if name in INPUT_NAMES:
            return Binary("add", _input(name, dtype))
        if name in UNARY or name in ("relu", "gelu", "gelu_tanh", "neg", "square"):
            return unary(name)
        raise ExprError(f"unknown epilogue {name!r} in --epilogue; known: {KNOWN} (see tune-cli run --help)")
    if name == "scale":
        return Scale(_number(arg, item))
    if name == "pow":
        try:
            return Pow(int(arg))
        except ValueError:
            raise ExprError(f"bad {item!r} in --epilogue: pow takes an integer from 2 to 8") from None
    if name == "clamp":
        lo, colon, hi = arg.partition(":")
        if not colon:
            raise ExprError(f"bad {item!r} in --epilogue: expected clamp=LO:HI (either may be empty)")
        return Clamp(_number(lo, item) if lo else None, _number(hi, item) if hi else None)
    if name in BINARY:
        source = arg.partition(":")[0]
        return binary(name, _input(arg, dtype) if source in INPUT_NAMES else _number(arg, item))
    raise ExprError(f"unknown epilogue {name!r} in --epilogue; known: {KNOWN} (see tune-cli run --help)")


def _input(text: str, dtype: str) -> Input:
    name, _, given = text.partition(":")
    if given and given not in DTYPES:
        raise ExprError(f"bad input dtype {given!r} in --epilogue: one of {', '.join(DTYPES)}")
    return Input(INPUT_NAMES[name], given or dtype)


def _number(text: str, item: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ExprError(f"bad {item!r} in --epilogue: expected a number or an input "
                        f"({', '.join(INPUT_NAMES)})") from None
    return number(value, item)
