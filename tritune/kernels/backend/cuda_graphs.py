"""Plain CUDA graphs around compiled graphs: the backend's CUDA-graph mode ("reduce-overhead").

Inductor's reduce-overhead replays through CUDA-graph trees, whose bookkeeping on every call (input
checks, memory-pool generations, output liveness) costs the host about 50 us per decode step more
than a plain replay (a narrow 2-layer decoder whose step is all host time: 151-165 us a step
through the trees, 98-114 us through this replay; BENCHMARKS.md). Where the GPU's step is shorter
than that, the trees set the wall time. `GraphStep` replays Inductor's default lowering from one
CUDA graph instead, as serving engines capture theirs:

- the parameters and buffers (the inputs Dynamo marks static) are read in place, where they were
  at capture; a call with them elsewhere (another layer's weights, where a graph break inside
  repeated layers reuses one compiled graph; a reassigned weight) replays the graph captured on
  those addresses, captured then if there is none yet;
- every other input is copied into the graph's own buffer before each replay;
- the outputs are handed out where the graph wrote them. Where a caller still holds them at the
  next call (`y = model(x)` in a loop holds the last `y` while the next step runs; a graph called
  again within one step), a second CUDA graph of the same call, with outputs of its own, is
  captured once and the two take turns, so a loop's outputs stay valid one call longer and are
  never rebuilt (graphs whose memory is small: a decode step's). Past that (both graphs' outputs
  held, or a larger graph), the contract of Inductor's CUDA-graph trees: outputs of an earlier
  call of the compiled model (a new step: Dynamo's count of calls, or
  `torch.compiler.cudagraph_mark_step_begin()`) still held when a replay overwrites them raise on
  access (`STALE`, naming the fix: clone what must outlive the next call), never read another
  step's values; a graph called again within one step while all its outputs are held runs without
  a CUDA graph. A torch that cannot make a storage raise (a CPU build) gets clones instead.

An input the caller marked static that is not a parameter (a static KV cache's tensors, which
transformers' generate() allocates anew for every call) may come at a new address with the same
shape: where nothing but the graph holds the memory the graph was captured on, and nothing but the
new tensor holds the new memory, the new tensor's contents are copied into the captured memory
and the tensor is pointed at it (`_adopt`), so the graph replays without a new capture; the new
memory goes back to the allocator. Where either is held elsewhere (a cache the caller kept), the
call is captured anew, as a new set of weights is.

A graph that writes one of its non-static inputs in place is not captured (the write would land
in the graph's copy): the backend leaves it to the trees. A capture that fails (an op that syncs
with the host, an output that aliases an input) leaves the graph to run without CUDA graphs,
logged once.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.fx as fx

from tritune.errors import first_line
from tritune.kernels.backend.epilogue_match import written
from tritune.kernels.backend.sites import counters_counted, counters_from

log = logging.getLogger("tritune.compiler")
WARM_CALLS = 2  # calls run before the capture: Inductor's first calls may compile and autotune
# CUDA graphs kept per compiled graph, one per set of its weights' addresses: a graph break inside
# repeated layers has one compiled graph called with each layer's weights. Each keeps its own
# memory; past this many the graph runs without CUDA graphs.
MAX_CAPTURES = 32
# A second CUDA graph of a call (outputs of its own, for callers that hold the last ones) only where
# the first one's memory is at most this: a decode step's is a few MB, a prefill's may be GBs.
SECOND_SET_MAX_BYTES = 256 << 20
# torch's C++ check that tensors at some indices are at the given addresses (CUDA builds)
_same_addresses = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
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


class Replayed(NamedTuple):
    """One CUDA graph of a call, the handout of its outputs, and the split sites' arrival counters
    it reads (zeroed once, before its capture: `sites.counters_from`)."""

    graph: Any
    handout: Handout
    counters: tuple = ()


@dataclass
class Capture:
    """The CUDA graphs of a compiled graph on one set of weights: the inputs they read (the static
    ones where they were at capture, its own copies of the others), the static inputs' addresses,
    and one or two graphs (`sets`), each with its outputs' handout."""

    inputs: list
    addresses: list[int | None]  # of each input at capture (None for the copied ones)
    sets: list[Replayed]  # the last replayed last
    may_add: bool  # whether a second graph may be captured: the first one's memory is small, no try failed


class GraphStep:
    """`fn` (Inductor's compiled graph, called as Dynamo calls a backend's result) replayed from a
    CUDA graph captured at its third call (which returns its own run's outputs), one per set of
    the static inputs' addresses (up to MAX_CAPTURES)."""

    def __init__(self, fn: Callable[..., Any], example_inputs: Sequence[Any]) -> None:
        self.fn = fn
        self.static = [i for i, x in enumerate(example_inputs) if static_input(x)]
        # static inputs that are not parameters: read through stand-ins the capture owns (`_adopt`)
        self.marked = {i for i in self.static if not isinstance(example_inputs[i], torch.nn.Parameter)}
        self.copied = [i for i, x in enumerate(example_inputs) if not static_input(x)]
        self.calls, self.broken = 0, False
        self.captures: dict[tuple[int, ...], Capture] = {}  # by the static inputs' addresses
        self.last: Capture | None = None  # the capture replayed last
        self.second_set_max_bytes = SECOND_SET_MAX_BYTES
        self.counters_asked: list = []  # by split sites, at the capturing call's run (`sites.counters_counted`)

    def __call__(self, *args: Any) -> Any:
        if self.broken:
            return self.fn(*args)
        capture = self._find(args)
        if capture is None and self.last is not None:
            capture = self._adopt(args)
        if capture is None:
            if self.calls < WARM_CALLS:
                self.calls += 1
                return self.fn(*args)
            return self._capture(args)
        chosen = self._choose(capture)
        if chosen is None:
            return self.fn(*args)  # called again within one step while all its outputs are held
        if chosen is not capture.sets[-1]:  # the sets in the order of their last replays
            capture.sets.remove(chosen)
            capture.sets.append(chosen)
        self.last = capture
        for i in self.copied:
            capture.inputs[i].copy_(args[i])
        chosen.graph.replay()
        return chosen.handout.outputs()

    def _choose(self, capture: Capture) -> Replayed | None:
        """The graph to replay: one whose outputs nobody holds (handed out again as they are), else
        a second graph captured now (once, where memory allows), else the one replayed longest ago
        whose held outputs are from an earlier call of the model (retired here: they will raise),
        else None."""
        for chosen in capture.sets:
            if not chosen.handout.held():
                return chosen
        if len(capture.sets) == 1 and capture.may_add:
            recorded = self._record(capture.inputs)
            if isinstance(recorded, tuple):
                capture.sets.append(Replayed(recorded[0], Handout(recorded[1]), recorded[2]))
                return capture.sets[-1]
            capture.may_add = False
            log.warning("tritune: a second CUDA graph of a compiled graph was not captured: %s", recorded)
        chosen = next((c for c in capture.sets if c.handout.may_overwrite()), None)
        if chosen is not None:
            chosen.handout.retire()
        return chosen

    def _find(self, args: Sequence[Any]) -> Capture | None:
        """The capture that reads the static inputs where they are now: the last one replayed
        (checked in torch's C++ where it has the check: tens of weights cost microseconds of the
        host's time in Python), else the one captured on these addresses."""
        if self.last is not None:
            addresses = self.last.addresses
            if (_same_addresses(list(args), addresses, self.static) if _same_addresses is not None
                    else all(args[i].data_ptr() == addresses[i] for i in self.static)):
                return self.last
        return self.captures.get(tuple(args[i].data_ptr() for i in self.static)) if len(self.captures) > 1 else None

    def _adopt(self, args: Sequence[Any]) -> Capture | None:
        """The capture replayed last, where the static inputs that moved since are all marked ones
        it may adopt (`_adoptable`): each one's contents copied into the captured memory and the
        tensor pointed at it. Else None."""
        capture = self.last
        moved = [i for i in self.static if args[i].data_ptr() != capture.addresses[i]]
        if not moved or not all(i in self.marked and _adoptable(capture.inputs[i], args[i]) for i in moved):
            return None
        try:
            for i in moved:
                held, new = capture.inputs[i], args[i]
                held.copy_(new)
                new.set_(held.untyped_storage(), held.storage_offset(), held.size(), held.stride())
        except RuntimeError as exc:  # e.g. a tensor torch will not re-point: captured anew
            log.warning("tritune: a moved static input could not be adopted: %s", first_line(exc))
            return None
        return capture

    def _capture(self, args: Sequence[Any]) -> Any:
        """This call's outputs, from a call on a side stream (as torch's capture wants: libraries
        set up per stream), then a CUDA graph of the call on the static inputs and copies of the
        others, captured for the next calls. Not replayed now: a graph that writes an input in
        place (a buffer) would write it twice. Where a graph cannot be captured, the graph runs
        without CUDA graphs from now on (logged)."""
        if len(self.captures) >= MAX_CAPTURES:
            self._give_up(f"it was called with more than {MAX_CAPTURES} sets of weights")
            return self.fn(*args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), counters_counted() as self.counters_asked:
            outputs = self.fn(*args)
        current = torch.cuda.current_stream()
        current.wait_stream(side)
        for o in outputs:
            if isinstance(o, torch.Tensor) and o.is_cuda:
                o.record_stream(current)  # made on the side stream, used on this one
        static = set(self.static)
        inputs = [_stand_in(a) if i in self.marked else a if i in static else a.clone() for i, a in enumerate(args)]
        reserved = torch.cuda.memory_reserved()
        recorded = self._record(inputs)
        if not isinstance(recorded, tuple):
            self._give_up(recorded)
            return outputs
        small = torch.cuda.memory_reserved() - reserved <= self.second_set_max_bytes
        addresses = [a.data_ptr() if i in static else None for i, a in enumerate(args)]
        self.last = Capture(inputs, addresses, [Replayed(recorded[0], Handout(recorded[1]), recorded[2])], small)
        self.captures[tuple(addresses[i] for i in self.static)] = self.last
        return outputs

    def _record(self, inputs: list) -> tuple[Any, list, tuple] | str:
        """A CUDA graph of a call on `inputs` (in memory of its own), its outputs and the split
        sites' arrival counters it reads (as the capturing call's run asked for them), or why not."""
        graph = torch.cuda.CUDAGraph()
        try:
            with counters_from(self.counters_asked) as counters, torch.cuda.graph(graph):
                outputs = self.fn(*inputs)
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: run without a graph
            return f"it could not be captured ({first_line(exc)})"
        owned = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        if any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in owned for o in outputs):
            return "an output is a view of an input"
        return graph, outputs, counters

    def _give_up(self, why: str) -> None:
        # the captures stay: outputs a caller holds keep their memory
        self.broken = True
        log.warning("tritune: a compiled graph runs without CUDA graphs: %s", why)


def _stand_in(x: torch.Tensor) -> torch.Tensor:
    """A tensor of the capture's own over `x`'s memory (the graph reads that memory, whoever holds
    `x` later)."""
    return torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage(), x.storage_offset(), x.size(), x.stride())


def _adoptable(held: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether `new` may be pointed at the captured memory `held`: the same geometry, nobody but the
    capture holds `held`'s memory, nobody but `new` holds its own (no view of it elsewhere), and
    torch lets it be re-pointed (no gradient, not an inference tensor outside inference mode)."""
    same = (held.dtype, held.device, held.shape, held.stride(), held.storage_offset(), held.untyped_storage().nbytes()) == \
        (new.dtype, new.device, new.shape, new.stride(), new.storage_offset(), new.untyped_storage().nbytes())
    movable = not new.requires_grad and (torch.is_inference_mode_enabled() or not new.is_inference())
    return same and movable and _alone(held) and _alone(new)


def _alone(x: torch.Tensor) -> bool:
    """Whether `x` is the only tensor over its memory."""
    return torch._C._storage_Use_Count(x.untyped_storage()._cdata) <= _one_tensors_count()


@functools.cache
def _one_tensors_count() -> int:
    """The use count of a storage that one tensor holds, as `_alone` reads it."""
    one = torch.empty(1)
    return torch._C._storage_Use_Count(one.untyped_storage()._cdata)


class Handout:
    """A captured graph's outputs (none of them views of an input: `_capture` checks) as each
    replay hands them out: tensors over the graph's memory. While the caller holds none of them
    (neither the tensor nor a view of its memory) when the next replay runs, the same tensors are
    handed out again, as Inductor's trees do (no host time to build them); those still held are
    made to raise `STALE` on access, and fresh ones are built. Where torch cannot make a storage
    raise (a CPU build), clones."""

    def __init__(self, outputs: Sequence[Any]) -> None:
        self.captured, self.generation = list(outputs), None
        # clones where torch cannot make a storage raise (a CPU build) or tell calls apart
        poison = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
        self.poison = poison if _generation() is not None else None
        self.tensors = [i for i, o in enumerate(self.captured) if isinstance(o, torch.Tensor)]
        self.given: list | None = None  # the outputs handed out last, over the graph's memory
        # (storage handle, its use count when nothing but `given` held it: torch keeps a reference too)
        self.storages: list[tuple[int, int]] = []

    def __del__(self) -> None:
        # the graph's memory goes back to the allocator with the captured outputs: outputs handed
        # out over it must not read whatever is put there next
        with contextlib.suppress(Exception):  # at interpreter exit torch may be gone already
            self._poison()

    def held(self) -> bool:
        """Whether the caller holds any output handed out last: the tensor itself (a reference
        besides `given`'s, in Python or C++), or a view of its memory."""
        if self.given is None:
            return False
        given = self.given
        if any(sys.getrefcount(given[i]) > 2 or given[i]._use_count() > 1 for i in self.tensors):
            return True  # 2: `given`'s reference and getrefcount's own
        return any(torch._C._storage_Use_Count(handle) > alone for handle, alone in self.storages)

    def may_overwrite(self) -> bool:
        """Whether a replay may write over the last step's outputs: they are clones, or none is
        held, or the model was called anew since (a held one then raises on access)."""
        return self.poison is None or _generation() != self.generation or not self.held()

    def retire(self) -> None:
        """Before a replay: if the last step's outputs are still held, they raise on access from
        now on (the replay overwrites their memory), and the next outputs are fresh tensors."""
        if self.held():
            self._poison()
            self.given, self.storages = None, []

    def _poison(self) -> None:
        """Make every storage handed out last raise `STALE` on access."""
        for handle, _ in self.storages:
            self.poison(handle, STALE)

    def outputs(self) -> list:
        """This step's outputs: tensors over the graph's memory (clones without the poison)."""
        if self.poison is None:
            return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.captured]
        if self.given is None:
            self.given, self.storages = self._fresh()
        self.generation = _generation()
        return list(self.given)

    def _fresh(self) -> tuple[list, list[tuple[int, int]]]:
        """New tensors over the graph's memory, on storages of their own (outputs viewing one buffer
        share one, as they did), and each storage's handle with its use count now (nothing else
        holds it yet)."""
        given, storages = list(self.captured), {}
        for i in self.tensors:
            o = given[i]
            address = o.untyped_storage().data_ptr()
            if address not in storages:
                storages[address] = torch._C._construct_storage_from_data_pointer(
                    address, o.device, o.untyped_storage().nbytes())
            given[i] = torch.empty(0, dtype=o.dtype, device=o.device).set_(
                storages[address], o.storage_offset(), o.size(), o.stride())
        handles = [s._cdata for s in storages.values()]
        del storages  # only `given` holds them now
        return given, [(handle, torch._C._storage_Use_Count(handle)) for handle in handles]


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
