"""One plain CUDA graph per compiled graph: the backend's CUDA-graph mode ("reduce-overhead").

Inductor's reduce-overhead replays through CUDA-graph trees, whose bookkeeping on every call (input
checks, memory-pool generations, output liveness) costs the host about 50 us per decode step more
than a plain replay (a narrow 2-layer decoder whose step is all host time: 151-165 us a step
through the trees, 98-114 us through this replay; BENCHMARKS.md). Where the GPU's step is shorter
than that, the trees set the wall time. `GraphStep` replays Inductor's default lowering from one
CUDA graph instead, as serving engines capture theirs:

- the parameters and buffers (the inputs Dynamo marks static) are read in place, where they were
  at capture; an input that moved since (a reassigned weight) makes it capture again;
- every other input is copied into the graph's own buffer before each replay;
- the outputs are cloned after it, so a caller may keep a step's results past the next step.

A graph that writes one of its non-static inputs in place is not captured (the write would land
in the graph's copy): the backend leaves it to the trees. A capture that fails (an op that syncs
with the host, an output that aliases an input) leaves the graph to run without CUDA graphs,
logged once.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from tritune.errors import first_line
from tritune.kernels.frontend.epilogue_match import written

log = logging.getLogger("tritune.compiler")
WARM_CALLS = 2  # calls run before the capture: Inductor's first calls may compile and autotune


def static_input(x: Any) -> bool:
    """Whether an input stays where it is from call to call: a parameter or a buffer (Dynamo marks them)."""
    return isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) is not None


def capturable(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether `GraphStep` may replay `gm`: tensors only, and no non-static input written in place."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(example_inputs) or not all(isinstance(x, torch.Tensor) for x in example_inputs):
        return False
    return not any(written(p, exact=True) for p, x in zip(placeholders, example_inputs) if not static_input(x))


class GraphStep:
    """`fn` (Inductor's compiled graph, called as Dynamo calls a backend's result) replayed from a
    CUDA graph captured at its third call."""

    def __init__(self, fn: Callable[..., Any], example_inputs: Sequence[Any]) -> None:
        self.fn = fn
        self.static = [i for i, x in enumerate(example_inputs) if static_input(x)]
        self.copied = [i for i, x in enumerate(example_inputs) if not static_input(x)]
        self.calls, self.graph, self.broken = 0, None, False
        self.inputs: list = []
        self.outputs: Any = None
        self.addresses: list[int] = []

    def __call__(self, *args: Any) -> Any:
        if self.broken:
            return self.fn(*args)
        if self.graph is not None and [args[i].data_ptr() for i in self.static] != self.addresses:
            self.graph = None  # a weight moved: capture again, reading it where it is now
        if self.graph is None:
            if self.calls < WARM_CALLS:
                self.calls += 1
                return self.fn(*args)
            if not self._capture(args):
                return self.fn(*args)
        for i in self.copied:
            self.inputs[i].copy_(args[i])
        self.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]

    def _capture(self, args: Sequence[Any]) -> bool:
        """Capture a call on the static inputs and copies of the others; False (logged, and the
        graph runs without CUDA graphs from now on) where that cannot work."""
        static = set(self.static)
        inputs = [a if i in static else a.clone() for i, a in enumerate(args)]
        graph = torch.cuda.CUDAGraph()
        try:
            # a call on a side stream first, as torch's capture wants (libraries set up per stream)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                outputs = self.fn(*inputs)
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: run without a graph
            return self._give_up(f"it could not be captured ({first_line(exc)})")
        owned = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        if any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in owned for o in outputs):
            return self._give_up("an output is a view of an input")
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.addresses = [args[i].data_ptr() for i in self.static]
        return True

    def _give_up(self, why: str) -> bool:
        self.broken = True
        log.warning("tritune: a compiled graph runs without CUDA graphs: %s", why)
        return False
