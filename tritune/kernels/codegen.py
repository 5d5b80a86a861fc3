"""Shared codegen plumbing of every family: load generated source, specialise, compile, launch.

A kernel binary assumes things about its arguments (which ints equal 1, which are multiples of
16, which pointers are 16-byte aligned), exactly as Triton's JIT would; families describe their
arguments once and these helpers build the same binary ahead of time (builder) and find it again
(runner, replay).
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tritune.kernels.device import interpreted
from tritune.kernels.expr import INT32_MAX, ExprError
from tritune.settings import SETTINGS

TRITON_DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32", "i32": "i32", "i64": "i64"}

_LOADED: dict[str, Any] = {}


def load_source(text: str, name: str) -> Any:
    """Write generated source to the kernel cache (Triton reads source files), import it once, return `name`."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    if digest not in _LOADED:
        path = SETTINGS.kernel_dir / f"tritune_{digest}.py"
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{id(text)}.tmp")
            tmp.write_text(text)
            tmp.replace(path)  # atomic: parallel builders may write the same file
        module_name = f"tritune_generated_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        _LOADED[digest] = module
    return getattr(_LOADED[digest], name)


def files_hash(*paths: Path) -> str:
    """A short hash of source files' bytes: the template key before compiled-text keys
    (`template_key`), by which `former_keys` was found."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()[:16]


def divisibility(value: int) -> int:
    """The largest power of two, at most 16, that divides an integer argument."""
    return min(16, value & -value) if value else 16


def specialize(pointers: Sequence[tuple[str, str, bool]], ints: Sequence[tuple[str, int, int]],
               consts: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Triton (signature, constexprs, attrs) for pointer args (name, dtype, 16-byte aligned), int
    args (name, value, divisibility hint: 16 as the JIT gives, or less when a family knows better;
    1 = none) and constexprs, in that argument order.
    """
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int], list] = {}
    for i, (name, dtype, aligned) in enumerate(pointers):
        signature[name] = "*" + TRITON_DTYPES[dtype]
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    for i, (name, value, div) in enumerate(ints, start=len(pointers)):
        if value == 1:
            signature[name], constants[name] = "constexpr", 1
            continue
        signature[name] = "i64" if abs(value) > INT32_MAX else "i32"
        if div > 1:
            attrs[(i,)] = [["tt.divisibility", div]]
    for name, value in consts.items():
        signature[name], constants[name] = "constexpr", value
    return signature, constants, attrs


@dataclass(frozen=True)
class Binary:
    """What one kernel binary is built from: the @triton.jit function, its args and options.

    pointers: (name, dtype, 16-byte aligned); ints: (name, value, divisibility hint: 16 as the JIT
    gives, less where a family knows a smaller one, 1 for none); consts: the template's constexprs.
    """

    fn: Any
    pointers: tuple[tuple[str, str, bool], ...]
    ints: tuple[tuple[str, int, int], ...]
    consts: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]  # num_warps, num_stages, ...

    def compile(self, target: Any) -> Any:
        """Compile for a target (no GPU needed); returns Triton's CompiledKernel."""
        import triton
        from triton.compiler import ASTSource

        signature, consts, attrs = specialize(self.pointers, self.ints, dict(self.consts))
        return triton.compile(ASTSource(self.fn, signature, consts, attrs), target=target,
                              options=dict(self.options))


def current_target() -> Any:
    """The Triton target of the current GPU."""
    from triton.runtime import driver

    return driver.active.get_current_target()


class Launcher:
    """One binary bound to a grid; call it with the pointer args (tensors) to launch once.

    On a GPU it launches Triton's CompiledKernel directly (no JIT dispatch); under the interpreter
    it runs the @triton.jit function.
    """

    def __init__(self, binary: Binary, grid: tuple[int, ...], target: Any = None) -> None:
        self.binary, self.grid = binary, grid
        self._ints = tuple(value for _, value, _ in binary.ints)
        self._consts = dict(binary.consts)
        self._tail = self._ints + tuple(self._consts.values())  # the launch's non-pointer args
        self.compiled = None if interpreted() else binary.compile(target or current_target())
        self._launch = None

    def __call__(self, *pointers: Any) -> None:
        """Launch once on tensors whose ints and alignment match the ones this binary was built for."""
        if self.compiled is None:
            self.binary.fn[self.grid](*pointers, *self._ints, **self._consts, **dict(self.binary.options))
            return
        if self._launch is None:
            self._launch = self.compiled[self.grid]  # loads the binary; raises OutOfResources
        # Triton >= 3.3 launchers take constexpr arguments too and skip them
        self._launch(*pointers, *self._tail)

    @property
    def shared_bytes(self) -> int | None:
        """Shared memory the compiled binary needs (None under the interpreter)."""
        return None if self.compiled is None else self.compiled.metadata.shared


def use_torch_scratch() -> None:
    """Let kernels that build tensor descriptors on the device take their scratch from torch."""
    import torch
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


class Emitter:
    """Triton statements computing a chain on the fp32 tile `acc`; `loader(i, input)` gives the
    expression loading extra input i as an fp32 tile that broadcasts against it."""

    def __init__(self, loader: Callable[[int, Any], str] | None = None) -> None:
        self.lines: list[str] = []
        self._loader, self._inputs, self._temps = loader, 0, 0

    def load(self, inp: Any) -> str:
        """Emit the load of the next extra input; its variable's name."""
        if self._loader is None:
            raise ExprError("this kernel's epilogue takes no extra inputs")
        name = f"in{self._inputs}"
        self.lines.append(f"{name} = {self._loader(self._inputs, inp)}")
        self._inputs += 1
        return name

    def chain(self, steps: Sequence[Any], v: str) -> str:
        """Emit a nested chain on a copy of `v`; its result's variable name."""
        t = f"t{self._temps}"
        self._temps += 1
        self.lines.append(f"{t} = {v}")
        return self.run(steps, t)

    def run(self, steps: Sequence[Any], v: str) -> str:
        """Emit each step as an update of variable `v`; returns `v`."""
        for s in steps:
            self.lines.append(f"{v} = {s.triton(v, self)}")
        return v


def epilogue_source(steps: Sequence[Any], indent: str, loader: Callable[[int, Any], str] | None = None) -> str:
    """The Triton statements applying `steps` to `acc`, one per line at `indent`."""
    emit = Emitter(loader)
    emit.run(steps, "acc")
    return "".join(f"{indent}{line}\n" for line in emit.lines)
