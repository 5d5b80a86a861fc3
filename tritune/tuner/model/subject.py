"""A model as tune-model's check and the benchmarks run it: on input tensors of given shapes, or as
the static-cache decode step that transformers' generate() compiles (`model.decode`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tritune.tuner.model.decode import DecodeShape, decode_step
from tritune.tuner.model.load import captured_tasks, default_device, load, model_tasks


@dataclass(frozen=True)
class Subject:
    """A model built to run: `fn` is what torch.compile compiles, `call(compiled, cuda_graphs)` one
    run of `fn` or of its compiled form (a callable of no arguments), `model` the module."""

    fn: Callable[..., Any]
    call: Callable[[Callable[..., Any], bool], Callable[[], Any]]
    model: Any


def load_subject(spec: str, input_shapes: Sequence[str], dtype: str, device: str, weights: str = "random",
                 decode: str | None = None) -> Subject:
    """The model named by `spec` on inputs of `input_shapes`, or (`decode`: 'BATCH,CONTEXT[,NEW]')
    as its static-cache decode step."""
    if decode is None:
        from tritune.tuner.timing import step_caller

        model, inputs = load(spec, input_shapes, dtype, device, weights)
        return Subject(model, lambda fn, cuda_graphs: step_caller(fn, inputs, cuda_graphs), model)
    step = decode_step(spec, DecodeShape.parse(decode), dtype, device, weights)
    return Subject(step.model.__call__, step.call, step.model)


def subject_tasks(spec: str, input_shapes: Sequence[str], dtype: str, device: str | None = None,
                  decode: str | None = None) -> list:
    """The tasks of the model on inputs of `input_shapes`, or of its `decode` step (captured as
    torch.compile captures it; uninitialised weights, nothing of the model computed)."""
    if decode is None:
        return model_tasks(spec, input_shapes, dtype, device)
    from tritune.kernels.backend.extract import extract_call_tasks

    step = decode_step(spec, DecodeShape.parse(decode), dtype, device or default_device(), "empty")
    return captured_tasks(lambda: extract_call_tasks(step.model.__call__, step.kwargs))
