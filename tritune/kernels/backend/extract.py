"""Tuning tasks from a model: `tritune.extract_tasks(model, example_inputs)`.

The model is captured with torch.export (nothing is computed, so uninitialised weights do, e.g.
`model.to_empty(device=...)`), traced to the normal form the torch.compile backend matches on
(`graph.aten_graph`), and every contraction with its fusable epilogue (`graph.find`: any chain of
elementwise ops, residuals and row / column vectors as extra inputs), every gated pair
act(x @ W1ᵀ) * (x @ W2ᵀ), every wide group (2 or 3 projections of one input: q, k, v) and every
attention of at most 64 query rows per head (decode) becomes a task; equal workloads are counted
once. Capture on the device the model runs on: ops that pick their kernel by device trace
differently elsewhere (on "meta", attention becomes its math form, with two bmm).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

# first_line is also kept importable from here for one release: tuner modules import it from extract
from tritune.errors import first_line
from tritune.kernels.attention.expr import Attention
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide


class ExtractError(ValueError):
    """A model that cannot be captured, or inputs it does not accept (the message is one line)."""


@dataclass(frozen=True)
class ModelTask:
    """One distinct workload of a model (a contraction and its epilogue, a gated pair, a wide group,
    or attention), how often a forward pass runs it, and the elementwise ops after it that did not fuse."""

    expr: Matmul | Gated | Wide | Attention
    count: int
    unfused: tuple[str, ...] = ()

    @property
    def flops(self) -> int:
        """Operations of all its occurrences in one forward pass."""
        return self.count * self.expr.flops

    def describe(self) -> str:
        """e.g. 'matmul 2048x4096x4096 fp16 NT+bias x4 (where unfused)'."""
        tail = f" ({', '.join(self.unfused)} unfused)" if self.unfused else ""
        return f"{self.expr.describe()} x{self.count}{tail}"


def extract_tasks(model: Any, example_inputs: Any, *, allow_tf32: bool | None = None) -> list[ModelTask]:
    """The contraction, gated, wide and attention workloads of `model(*example_inputs)`, deduplicated
    with counts, in the order the model first runs them. allow_tf32 (fp32 models) defaults to torch's
    matmul precision setting.
    """
    import torch

    from tritune.kernels.backend import graph

    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if allow_tf32 is None:
        allow_tf32 = graph.tf32_allowed()
    try:
        with torch.no_grad(), _fake_tensor_log_off():
            program = torch.export.export(model, args, strict=False)
    except Exception as exc:  # export raises many types; the user needs the first line, not the stack
        raise ExtractError(f"torch.export could not capture the model: {first_line(exc)}") from None
    matches = graph.find(graph.aten_graph(program.module(), args), allow_tf32)
    return _count(matches)


class _Captured(Exception):
    """Raised by a captured graph in place of running it."""


def extract_call_tasks(fn: Any, kwargs: dict, *, allow_tf32: bool | None = None) -> list[ModelTask]:
    """The workloads of `fn(**kwargs)` as torch.compile captures it (Dynamo's graph, as the
    torch.compile backend sees it: a decode step with its cache's tensors as inputs), deduplicated
    with counts. Nothing is computed where the call is one graph; where it breaks into several,
    each runs once (uncompiled) so that the next is captured."""
    import torch
    from torch._guards import detect_fake_mode

    from tritune.kernels.backend import graph

    tf32 = graph.tf32_allowed() if allow_tf32 is None else allow_tf32
    matches: list = []

    def capture(whole: bool) -> Any:
        def backend(gm: Any, example_inputs: Any, **_: Any) -> Any:
            matches.extend(graph.find(graph.aten_graph(gm, example_inputs, detect_fake_mode(example_inputs)), tf32))
            return _stop if whole else gm.forward
        return backend

    def captured(whole: bool) -> list[ModelTask]:
        matches.clear()
        try:
            with torch.no_grad(), _fake_tensor_log_off():
                torch.compile(fn, backend=capture(whole), fullgraph=whole, dynamic=False)(**kwargs)
        except _Captured:
            pass
        return _count(matches)

    try:
        return captured(whole=True)
    except Exception:  # noqa: BLE001 - a graph break (Dynamo raises many types): captured in parts
        try:
            return captured(whole=False)
        except Exception as exc:  # noqa: BLE001
            raise ExtractError(f"torch.compile could not capture the call: {first_line(exc)}") from None


def _stop(*args: Any) -> Any:
    raise _Captured


def _count(matches: Sequence[Any]) -> list[ModelTask]:
    order: dict[str, ModelTask] = {}
    for m in matches:
        seen = order.get(m.expr.key)
        unfused = tuple(sorted({*(seen.unfused if seen else ()), *([m.unfused] if m.unfused else [])}))
        order[m.expr.key] = ModelTask(m.expr, (seen.count if seen else 0) + 1, unfused)
    return list(order.values())


@contextmanager
def _fake_tensor_log_off() -> Iterator[None]:
    """torch logs, with a traceback, an op its fake tensors cannot run (inputs that do not fit the
    model) before it raises; what it raises is the one line (an ExtractError) the caller reads."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    was, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was
