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
- the outputs are handed out where the graph wrote them, with the contract of Inductor's CUDA-graph
  trees: outputs still held when the compiled model is next called (a new step: Dynamo's count of
  calls, or `torch.compiler.cudagraph_mark_step_begin()`) raise on access (`STALE`, naming the
  fix: clone what must outlive the next call), never read another step's values; a graph called
  again within one step while its last outputs are held runs without its CUDA graph. A torch that
  cannot make a storage raise (a CPU build) gets clones instead.

A graph that writes one of its non-static inputs in place is not captured (the write would land
in the graph's copy): the backend leaves it to the trees. A capture that fails (an op that syncs
with the host, an output that aliases an input) leaves the graph to run without CUDA graphs,
logged once.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from tritune.errors import first_line
from tritune.kernels.frontend.epilogue_match import written

log = logging.getLogger("tritune.compiler")
WARM_CALLS = 2  # calls run before the capture: Inductor's first calls may compile and autotune
STALE = ("tritune: this output of a compiled model lived in CUDA-graph memory that a later call has "
         "overwritten (or that was freed with its graph); clone the outputs you keep past the next call")


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
        self.handout: Handout | None = None
        self.addresses: list[int] = []

    def __call__(self, *args: Any) -> Any:
        if self.broken:
            return self.fn(*args)
        if self.handout is not None and not self.handout.may_overwrite():
            return self.fn(*args)  # called again within one step while its last outputs are held
        if self.graph is not None and [args[i].data_ptr() for i in self.static] != self.addresses:
            self.handout.retire()  # a weight moved: capture again, reading it where it is now
            self.graph = None
        if self.graph is None:
            if self.calls < WARM_CALLS:
                self.calls += 1
                return self.fn(*args)
            if not self._capture(args):
                return self.fn(*args)
        for i in self.copied:
            self.inputs[i].copy_(args[i])
        self.handout.retire()
        self.graph.replay()
        return self.handout.outputs()

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
        self.graph, self.inputs = graph, inputs
        self.handout = Handout(outputs)
        self.addresses = [args[i].data_ptr() for i in self.static]
        return True

    def _give_up(self, why: str) -> bool:
        self.broken = True
        log.warning("tritune: a compiled graph runs without CUDA graphs: %s", why)
        return False


class Handout:
    """A captured graph's outputs (none of them views of an input: `_capture` checks) as each
    replay hands them out: tensors over the graph's memory, each step's on storages of its own, so
    that those still held when the next step replays can be made to raise `STALE` on access (they
    would read that step's values). Where torch cannot do that (a CPU build), clones."""

    def __init__(self, outputs: Sequence[Any]) -> None:
        self.captured, self.generation = list(outputs), None
        # clones where torch cannot make a storage raise (a CPU build) or tell calls apart
        poison = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
        self.poison = poison if _generation() is not None else None
        # (output index, its storage's address and bytes) of each tensor output
        self.tensors = [(i, o.untyped_storage().data_ptr(), o.untyped_storage().nbytes())
                        for i, o in enumerate(self.captured) if isinstance(o, torch.Tensor)]
        self.live: list = []  # weak references to the storages handed out by the last step

    def __del__(self) -> None:
        # the graph's memory goes back to the allocator with the captured outputs: outputs handed
        # out over it must not read whatever is put there next
        with contextlib.suppress(Exception):  # at interpreter exit torch may be gone already
            self.retire()

    def may_overwrite(self) -> bool:
        """Whether a replay may write over the last step's outputs: they are clones, or none is
        held, or the model was called anew since (a held one then raises on access)."""
        return (self.poison is None or _generation() != self.generation
                or all(ref.expired() for ref in self.live))

    def retire(self) -> None:
        """Make the last step's outputs that are still held raise on access: the replay about to
        run overwrites their memory."""
        for ref in self.live:
            if not ref.expired():
                self.poison(ref.cdata, STALE)
        self.live = []

    def outputs(self) -> list:
        """This step's outputs: aliases of the graph's memory on fresh storages (clones without the poison)."""
        from torch.multiprocessing.reductions import StorageWeakRef

        outs = list(self.captured)
        storages: dict[int, Any] = {}
        for i, address, nbytes in self.tensors:
            o = outs[i]
            if self.poison is None:
                outs[i] = o.clone()
                continue
            if address not in storages:  # outputs viewing one buffer share one storage, as they did
                storages[address] = torch._C._construct_storage_from_data_pointer(address, o.device, nbytes)
            outs[i] = torch.empty(0, dtype=o.dtype, device=o.device).set_(
                storages[address], o.storage_offset(), o.size(), o.stride())
        self.live, self.generation = [StorageWeakRef(s) for s in storages.values()], _generation()
        return outs


def _generation() -> int | None:
    """Which call of the compiled model this is, as Inductor's CUDA-graph trees tell steps apart:
    the user's step marks (`torch.compiler.cudagraph_mark_step_begin`) if any, else Dynamo's count
    of calls into compiled code; None where this torch keeps neither where it used to."""
    counters = _counters()
    if counters is None:
        return None
    marks, calls = counters
    return getattr(marks, "mark_step_counter", 0) or getattr(calls, "generation", None)


@functools.cache
def _counters() -> tuple[Any, Any] | None:
    try:
        from torch._dynamo.mutation_guard import GenerationTracker
        from torch._inductor.cudagraph_trees import MarkStepBox
    except ImportError:
        return None
    return MarkStepBox, GenerationTracker
