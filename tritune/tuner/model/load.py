"""The one model loader: a model factory named on the command line (`pkg.module:factory` or
`path/to/file.py:factory`), the model built from it in a dtype on a device, and its inputs.

Two ways to build: `weights="empty"` on the meta device and then given uninitialised storage (no
weights initialised, nothing computed: what capturing a model's workloads needs), or
`weights="random"`, seeded random weights and inputs (what running and checking a model needs)."""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable, Sequence

from tritune.errors import first_line
from tritune.kernels.expr import ExprError, check_dtype, parse_dims, torch_dtype


class ModelError(ValueError):
    """A model spec, input shape or dtype that cannot be used (the message is one line)."""


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by 'pkg.module:factory' or 'path/to/file.py:factory'."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ModelError(f"bad --model {spec!r}: expected pkg.module:factory or path/to/file.py:factory")
    try:
        module = _load_file(where) if where.endswith(".py") else importlib.import_module(where)
    except ModelError:
        raise
    except SystemExit as exc:  # the user's module exiting is one line too, not our exit code
        raise ModelError(f"importing {where!r} called exit({exc.code!r})") from None
    except Exception as exc:  # any import-time failure of the user's module
        raise ModelError(f"cannot import {where!r}: {first_line(exc)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ModelError(f"{where!r} has no callable {name!r}")
    return factory


def _load_file(path: str) -> Any:
    if not Path(path).is_file():
        raise ModelError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"tritune_model_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_shapes(texts: Sequence[str]) -> list[tuple[int, ...]]:
    """'1,2048,4096' (or 1x2048x4096) per model input -> shapes."""
    try:
        return [tuple(parse_dims(t, range(1, 9), "up to 8 sizes")) for t in texts]
    except ExprError as exc:
        raise ModelError(str(exc).replace("--shape", "--input-shape")) from None


def build(factory: Callable[[], Any], shapes: Sequence[tuple[int, ...]], dtype: str, device: str,
          weights: str = "empty") -> tuple[Any, tuple]:
    """The model in `dtype` on `device`, eval mode, and inputs of those shapes: uninitialised
    (`weights="empty"`), or seeded random weights and inputs (`"random"`)."""
    import torch

    try:
        check_dtype(dtype)
    except ExprError as exc:
        raise ModelError(str(exc)) from None
    if weights == "random":
        torch.manual_seed(0)
    try:
        with torch.device("meta" if weights == "empty" else device):
            model = factory()
        if not isinstance(model, torch.nn.Module):
            raise ModelError(f"the factory returned a {type(model).__name__}, not a torch.nn.Module")
        # cast while still on meta: no full-precision copy is allocated (and converted) on the device
        model = model.to(torch_dtype(dtype))
        model = (model.to_empty(device=device) if weights == "empty" else model).eval()
    except ModelError:
        raise
    except SystemExit as exc:  # a factory that exits: one line, not its exit code
        raise ModelError(f"the model factory called exit({exc.code!r})") from None
    except Exception as exc:  # the user's constructor
        raise ModelError(f"the model factory failed: {first_line(exc)}") from None
    return model, tuple(_input(s, dtype, device, weights) for s in shapes)


def _input(shape: tuple[int, ...], dtype: str, device: str, weights: str) -> Any:
    """One model input of `shape`; one that cannot be allocated is a ModelError."""
    import torch

    make = torch.empty if weights == "empty" else torch.randn
    try:
        return make(shape, dtype=torch_dtype(dtype), device=device)
    except (RuntimeError, MemoryError) as exc:  # torch's allocators raise RuntimeError (OutOfMemoryError is one)
        size = "x".join(map(str, shape))
        raise ModelError(f"cannot allocate a {size} {dtype} input on {device}: {first_line(exc)}") from None


def load(spec: str, input_shapes: Sequence[str], dtype: str, device: str, weights: str = "empty") -> tuple[Any, tuple]:
    """`build` of the factory named by `spec` with inputs of `input_shapes` ('1,2048,4096' each)."""
    return build(load_factory(spec), parse_shapes(input_shapes), dtype, device, weights)


def model_tasks(spec: str, input_shapes: Sequence[str], dtype: str, device: str | None = None) -> list:
    """Load, build and capture a model: its tasks (ModelError for anything the user can fix)."""
    from tritune.kernels.backend.extract import extract_tasks

    model, inputs = build(load_factory(spec), parse_shapes(input_shapes), dtype, device or default_device())
    return captured_tasks(lambda: extract_tasks(model, inputs))


def default_device() -> str:
    """The first GPU where there is one, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def captured_tasks(extract: Callable[[], list]) -> list:
    """`extract()`'s tasks, torch's fake-tensor log quiet, what the user can fix a ModelError."""
    from tritune.kernels.backend.extract import ExtractError

    try:
        tasks = extract()
    except ExtractError as exc:
        raise ModelError(str(exc)) from None
    if not tasks:
        raise ModelError("the model runs no contraction (mm, addmm, bmm, baddbmm, matmul, linear) tritune can tune")
    return tasks
