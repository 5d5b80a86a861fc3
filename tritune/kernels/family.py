"""Op families: everything the tuner, runner and replay need to know about one op, by name.

A family ties an expression type to its schedule space, cost-model features, codegen and launch,
and its semantics (random operands, float64 reference, the eager PyTorch version, tolerance).
A new op is one folder under `tritune/kernels/` (expression, family, template, features), one
schedule module, and one line in `REGISTRY`; tests/kernels/test_family_contract.py holds every registered
family to the same rules. Families are imported lazily so that `import tritune` stays light.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from tritune.kernels import faults
from tritune.kernels.codegen import Binary
from tritune.kernels.expr import ExprError
from tritune.kernels.template_key import files_key
from tritune.records.result import DeviceKey
from tritune.schedules.config import Config
from tritune.schedules.space import Limits, Space

# op name -> "module:attribute" of its Family instance
REGISTRY = {
    "matmul": "tritune.kernels.contraction.family:MATMUL",
    "bmm": "tritune.kernels.contraction.family:BMM",
    "conv2d": "tritune.kernels.conv.family:CONV2D",
    "softmax": "tritune.kernels.rows.family:SOFTMAX",
    "layernorm": "tritune.kernels.rows.family:LAYERNORM",
    "gated": "tritune.kernels.gated.family:GATED",
    "wide": "tritune.kernels.wide.family:WIDE",
    "attention": "tritune.kernels.attention.family:ATTENTION",
}
# files of tritune/kernels that shape every family's binaries
SHARED_SOURCES = ("codegen.py", "expr.py", "epilogue.py")


@dataclass
class Operands:
    """The arguments of one launch, in kernel order, and which of them is the output."""

    args: tuple
    out: Any


class Family(ABC):
    """One op: expression type, space, features, build, launch, and semantics."""

    op: str
    baseline: ClassVar[str] = "torch"  # how the eager comparison is labelled in tables
    # files under tritune/kernels that shape this family's binaries: their compiled text (see
    # `tritune.kernels.template_key`) is part of the device key, so a code change in any of them
    # retires stored records, and a comment or docstring edit does not
    sources: ClassVar[tuple[str, ...]] = ()
    # bumped on purpose to retire the family's stored records where its sources' code is unchanged
    template_version: ClassVar[int]
    # the module that specialises and launches the family's kernels; it defines
    # canonical_problem(expr), problem_of(expr, *args), binary(expr, config, problem) and
    # launcher(expr, config, problem). Imported on first use: a template may define its kernels
    # with triton at import, which the CLI's start does without
    launch_module: ClassVar[str]

    def template_hash(self) -> str:
        """The template part of the device key: this family's template version and the compiled
        text of its kernels' sources and the shared codegen (`template_key.files_key`)."""
        return files_key(self.template_version, self.source_paths())

    def source_paths(self) -> tuple[Path, ...]:
        """The files that shape this family's binaries: the shared codegen, then its own sources."""
        here = Path(__file__).parent
        return tuple(here / name for name in (*SHARED_SOURCES, *self.sources))

    # ----- expressions
    @abstractmethod
    def from_dict(self, spec: dict) -> Any:
        """The expression of a stored workload spec (raises ExprError if it is not one)."""

    @abstractmethod
    def from_cli(self, shape: str, dtype: str, options: dict[str, str]) -> Any:
        """The expression of `tune-cli run --op OP --shape ... --dtype ...` and op-specific options.

        `options` holds only the options the user set; an option the op does not take is an
        ExprError naming it, never silently ignored.
        """

    @property
    @abstractmethod
    def cli_help(self) -> str:
        """One line: the --shape format and the options this op takes (shown by `tune-cli run --help`)."""

    @abstractmethod
    def examples(self) -> tuple:
        """Small awkward expressions of the op (odd sizes, every dtype and option) for correctness checks."""

    def rate(self, expr: Any, ms: float | None) -> tuple[float, str]:
        """Throughput at a time in ms, as (value, unit): TFLOP/s for compute-bound ops."""
        return (expr.flops / (ms * 1e-3) / 1e12 if ms else 0.0), "TFLOP/s"

    # ----- schedules and cost model
    @abstractmethod
    def space(self, expr: Any, limits: Limits) -> Space:
        """The schedule space of an expression on a device."""

    @abstractmethod
    def features(self, expr: Any, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
        """Cost-model feature rows, one per config."""

    # ops whose measurements warm-start this op's search where it has none of its own to learn
    # from: their feature rows, lifted into this op's by `lift_prior`
    prior_from: ClassVar[tuple[str, ...]] = ()

    def lift_prior(self, expr: Any, rows: np.ndarray) -> np.ndarray:
        """Feature rows of a `prior_from` op's configs as rows of this op's features for `expr`."""
        raise NotImplementedError(f"{self.op} learns from no other op")

    @abstractmethod
    def default_config(self, expr: Any) -> Config:
        """A config that is valid for any expression of the op (replay's last resort)."""

    # ----- build and launch
    def canonical_problem(self, expr: Any) -> Any:
        """The launch facts (ints, alignment) of freshly allocated operands: what the builder builds for."""
        return self._launch().canonical_problem(expr)

    def problem_of(self, expr: Any, args: tuple) -> Any:
        """The launch facts of concrete tensors (in kernel argument order)."""
        return self._launch().problem_of(expr, *args)

    def binary(self, expr: Any, config: Config, problem: Any) -> Binary:
        """What one candidate's binary is built from."""
        return self._launch().binary(expr, config, problem)

    def launcher(self, expr: Any, config: Config, problem: Any) -> Callable[..., None]:
        """The candidate bound to one problem: call it with the operands' args to run once."""
        return self._launch().launcher(expr, config, problem)

    def _launch(self) -> Any:
        return importlib.import_module(self.launch_module)

    def compile(self, expr: Any, config: Config, problem: Any, target: Any) -> Any:
        """Compile one candidate for a target without a GPU; returns Triton's CompiledKernel."""
        return self.binary(expr, faults.strip(config), problem).compile(target)

    def kernel(self, expr: Any, config: Config, problem: Any) -> Callable[..., Any]:
        """A launcher bound to one problem (or, for a library config, the library call); a config's
        `fault` knob (a test hook, see `tritune.kernels.faults`) makes it misbehave on purpose."""
        if config.library is not None:
            return self.library(expr, config.library)
        fault = config.get("fault")
        if fault is not None:
            faults.check(fault)  # before anything is built
        launch = self.launcher(expr, faults.strip(config), problem)
        return launch if fault is None else faults.inject(launch, fault)

    # ----- semantics (run in the GPU worker, or on CPU under the interpreter)
    @abstractmethod
    def inputs(self, expr: Any, seed: int, device: str) -> Operands:
        """Fresh random operands (never zeros) and a NaN-poisoned output."""

    @abstractmethod
    def reference(self, expr: Any, args: tuple) -> Any:
        """The expected output in float64."""

    @abstractmethod
    def eager(self, expr: Any, x: Operands) -> Callable[[], Any]:
        """What a user would run in eager PyTorch for the same expression."""

    def libraries(self, expr: Any) -> tuple[str, ...]:
        """The library implementations a user has for the expression without tritune; each is
        measured as a candidate (`Config.of(library=name)`) and chosen when it wins. Default: the
        torch expression ('torch': cuDNN, torch's own kernels)."""
        return ("torch",)

    def library(self, expr: Any, name: str) -> Callable[..., Any]:
        """Library implementation `name`, called like a kernel (with the kernel's args); it returns
        the output (which may be a fresh tensor rather than the output argument)."""
        if name not in self.libraries(expr):
            raise ExprError(f"{expr.describe()} has no library implementation {name!r}; "
                            f"known: {', '.join(self.libraries(expr))}")
        return self.expression(expr)

    @abstractmethod
    def expression(self, expr: Any) -> Callable[..., Any]:
        """The expression written as torch ops, a function of the kernel's args (the output slot
        ignored) returning a fresh result: what `torch.compile` lowers in the head-to-head."""

    @abstractmethod
    def tolerance(self, expr: Any) -> float:
        """Relative Frobenius error a correct kernel stays under."""


def ops() -> tuple[str, ...]:
    """Names of every registered op."""
    return tuple(REGISTRY)


_loaded: dict[str, Family] = {}


def family(op: str) -> Family:
    """The family of an op name (ExprError for an unknown one)."""
    if op not in REGISTRY:
        raise ExprError(f"unknown op {op!r}; known: {', '.join(REGISTRY)}")
    if op not in _loaded:
        module, attr = REGISTRY[op].split(":")
        _loaded[op] = getattr(importlib.import_module(module), attr)
    return _loaded[op]


def device_key(info: dict, op: str) -> DeviceKey:
    """The key under which measurements of an op on a device (`device.device_info`), compiler and
    template are stored."""
    return DeviceKey(info["gpu"], info["capability"], info["triton"], info["torch"], family(op).template_hash())


def expr_from_dict(spec: dict) -> Any:
    """The expression of any stored workload spec, dispatched on its 'op'."""
    return family(spec.get("op", "")).from_dict(spec)


def parse_expr(op: str, shape: str, dtype: str, **options: str | None) -> Any:
    """The expression of `tune-cli run`'s workload options (options left None are unset); ExprError
    for anything the user must fix."""
    return family(op).from_cli(shape, dtype, {k: v for k, v in options.items() if v is not None})


def rate_text(expr: Any, ms: float | None) -> str:
    """Throughput of the expression at a time in ms, as tables show it: '612.3 TFLOP/s', '2.81 TB/s'."""
    value, unit = family(expr.op).rate(expr, ms)
    return f"{value:.{1 if value >= 10 else 2}f} {unit}"
