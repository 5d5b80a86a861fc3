"""The backend's CUDA-graph mode: Inductor's default lowering replayed from one plain CUDA graph
(`GraphStep`). On the CPU a stand-in graph records the call made during capture and repeats it on
the captured tensors at each replay, writing into the captured outputs, as a real graph does."""
import logging

import pytest
import torch

from test_compiler import store, tuned_calls  # noqa: F401 - fixtures
from tritune.kernels.backend import cuda_graphs
from tritune.kernels.backend.graph import aten_graph
from tritune.kernels.backend.cuda_graphs import GraphStep, capturable


class FakeGraph:
    """Records the one call made while capturing; replay() runs it again into the same outputs."""

    captures = 0
    current = None

    def __init__(self):
        self.call = None

    def replay(self):
        fn, args, outs = self.call
        for out, new in zip(outs, fn(*args)):
            out.copy_(new)


class Capture:
    def __init__(self, graph):
        self.graph = graph

    def __enter__(self):
        FakeGraph.current, FakeGraph.captures = self.graph, FakeGraph.captures + 1

    def __exit__(self, *exc):
        FakeGraph.current = None


class Recorded:
    """A compiled graph: fn(*args) -> list of fresh tensors; registers itself with a capture."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        outs = self.fn(*args)
        if FakeGraph.current is not None:
            FakeGraph.current.call = (self.fn, args, outs)
        return outs


@pytest.fixture
def fake_cuda(monkeypatch):
    class Stream:
        def wait_stream(self, other):
            pass

    FakeGraph.captures = 0
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: torch.autograd.grad_mode.no_grad())


def _step(weight):
    fn = Recorded(lambda w, x: [x @ w + 1.0])
    return fn, GraphStep(fn, [weight, torch.randn(3, 4)])


def test_replays_read_weights_in_place_and_copy_other_inputs(fake_cuda):
    # this torch cannot make a storage raise on access (a CPU build): every step's outputs are clones
    w = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False)
    fn, step = _step(w)
    kept = []
    for i in range(6):
        x = torch.randn(3, 4)  # a new tensor every call: copied into the graph's buffer
        out = step(w, x)[0]
        assert torch.equal(out, x @ w + 1.0)
        kept.append((out, x @ w + 1.0))
    assert FakeGraph.captures == 1 and fn.calls == cuda_graphs.WARM_CALLS + 2  # warm calls, side stream, capture
    # each step's output is its own: later replays did not overwrite it
    assert all(torch.equal(out, want) for out, want in kept)
    with torch.no_grad():
        w.mul_(2.0)  # updated in place: the graph reads it where it is
    x = torch.randn(3, 4)
    assert torch.equal(step(w, x)[0], x @ w + 1.0) and FakeGraph.captures == 1


@pytest.fixture
def poison(monkeypatch):
    """A stand-in for CUDA torch's `_set_storage_data_ptr_access_error_msg`: the storages it was
    asked to make raise, by their handle."""
    poisoned = {}
    monkeypatch.setattr(torch._C, "_set_storage_data_ptr_access_error_msg",
                        lambda cdata, msg: poisoned.setdefault(cdata, msg), raising=False)
    return poisoned


def _new_call():
    torch.compiler.cudagraph_mark_step_begin()  # what a new call of the compiled model counts as


def _poisoned(t, poisoned):
    return t.untyped_storage()._cdata in poisoned


def _captured():
    """A step over a weight, called anew until its graph is captured and replayed once: (weight,
    compiled graph, step, last input, last output)."""
    w = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False)
    fn, step = _step(w)
    for _ in range(cuda_graphs.WARM_CALLS + 2):
        _new_call()
        x = torch.randn(3, 4)
        out = step(w, x)[0]
    return w, fn, step, x, out


def test_outputs_are_the_graphs_memory_a_held_set_is_spared_once_and_raises_when_both_are_held(fake_cuda, poison):
    w, fn, step, x, out = _captured()
    first = step.last.sets[0][1].captured[0]
    assert out.data_ptr() == first.data_ptr() and torch.equal(out, x @ w + 1.0)  # no copy: an alias
    held, want = out, out.clone()
    _new_call()
    x = torch.randn(3, 4)
    second = step(w, x)[0]  # `held` is still held: a second graph, with outputs of its own
    assert FakeGraph.captures == 2 and second.data_ptr() != held.data_ptr()
    assert torch.equal(second, x @ w + 1.0) and torch.equal(held, want) and not poison
    _new_call()
    x = torch.randn(3, 4)
    third = step(w, x)[0]  # both sets held: the earlier call's is overwritten, and raises, naming the fix
    assert third.data_ptr() == held.data_ptr() and torch.equal(third, x @ w + 1.0)
    assert _poisoned(held, poison) and "clone" in poison[held.untyped_storage()._cdata]
    assert not torch.equal(held, want) and not _poisoned(second, poison) and not _poisoned(third, poison)
    dropped = third.untyped_storage()._cdata
    del third
    _new_call()
    step(w, torch.randn(3, 4))
    assert dropped not in poison and FakeGraph.captures == 2  # nothing held there: nothing to poison


def test_a_held_output_past_the_memory_for_a_second_graph_raises_at_the_next_call(fake_cuda, poison, monkeypatch):
    monkeypatch.setattr(cuda_graphs, "SECOND_SET_MAX_BYTES", -1)  # a graph whose memory is too large to double
    w, fn, step, x, out = _captured()
    held = out
    _new_call()
    x = torch.randn(3, 4)
    assert torch.equal(step(w, x)[0], x @ w + 1.0) and _poisoned(held, poison) and FakeGraph.captures == 1


def test_a_second_graph_that_cannot_be_captured_leaves_held_outputs_to_raise(fake_cuda, poison, monkeypatch, caplog):
    w, fn, step, x, out = _captured()

    def refuse(graph):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(torch.cuda, "graph", refuse)
    with caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        _new_call()
        x = torch.randn(3, 4)
        assert torch.equal(step(w, x)[0], x @ w + 1.0)
    assert _poisoned(out, poison) and not step.broken and "second CUDA graph" in caplog.text


def test_outputs_nobody_holds_are_handed_out_again_and_a_held_view_counts_as_held(fake_cuda, poison):
    w, _, step, _, out = _captured()
    first = id(out)
    del out
    _new_call()
    x = torch.randn(3, 4)
    out = step(w, x)[0]
    assert id(out) == first and torch.equal(out, x @ w + 1.0) and not poison  # the same tensor, no host work
    row = out[1]  # a view of the output's memory: the output counts as held
    del out
    _new_call()
    other = step(w, torch.randn(3, 4))[0]
    assert FakeGraph.captures == 2 and not poison  # the view held the first set: the second replayed
    _new_call()
    step(w, torch.randn(3, 4))
    assert _poisoned(row, poison) and not _poisoned(other, poison)


def test_a_graph_called_again_within_one_call_spares_outputs_still_held(fake_cuda, poison):
    w, fn, step, _, h = _captured()
    calls = fn.calls
    x = torch.randn(3, 4)
    again = step(w, x)[0]  # the same step (no new call) while `h` is held: a second graph, captured now
    assert fn.calls == calls + 1 and FakeGraph.captures == 2 and torch.equal(again, x @ w + 1.0)
    x = torch.randn(3, 4)
    third = step(w, x)[0]  # both held within the step: run without a graph
    assert fn.calls == calls + 2 and torch.equal(third, x @ w + 1.0) and not poison
    del h, again, third
    step(w, x)  # nothing held any more: replayed
    assert fn.calls == calls + 2


def test_each_set_of_weights_replays_its_own_capture_and_held_outputs_of_another_stay(fake_cuda, poison):
    # a graph break inside repeated layers: one compiled graph called with each layer's weights
    w, fn, step, _, out = _captured()
    del out
    other = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False)
    for _ in range(3):
        _new_call()
        outs = []  # the last call's outputs dropped
        for weight in (w, other):
            x = torch.randn(3, 4)
            outs.append((step(weight, x)[0], x @ weight + 1.0))
            assert torch.equal(*outs[-1])
        # this call's first layer's output, held past the second layer's replay
        assert not _poisoned(outs[0][0], poison) and torch.equal(*outs[0])
    assert FakeGraph.captures == 2 and len(step.captures) == 2


def test_more_sets_of_weights_than_kept_run_without_graphs(fake_cuda, poison, monkeypatch, caplog):
    monkeypatch.setattr(cuda_graphs, "MAX_CAPTURES", 2)
    w, _, step, _, _ = _captured()
    with caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        for _ in range(3):
            weight, x = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False), torch.randn(3, 4)
            assert torch.equal(step(weight, x)[0], x @ weight + 1.0)
    assert step.broken and FakeGraph.captures == 2 and "more than 2 sets of weights" in caplog.text


def test_a_weight_that_moved_is_captured_again(fake_cuda):
    w = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False)
    _, step = _step(w)
    x = torch.randn(3, 4)
    for _ in range(4):
        step(w, x)
    moved = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False)
    assert torch.equal(step(moved, x)[0], x @ moved + 1.0) and FakeGraph.captures == 2


def test_a_capture_that_fails_runs_without_graphs(fake_cuda, monkeypatch, caplog):
    def refuse(graph):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(torch.cuda, "graph", refuse)
    w = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False)
    fn, step = _step(w)
    with caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        for _ in range(5):
            x = torch.randn(3, 4)
            assert torch.equal(step(w, x)[0], x @ w + 1.0)
    assert step.broken and "could not be captured" in caplog.text


def test_an_output_that_views_an_input_is_not_replayed(fake_cuda):
    fn = Recorded(lambda w, x: [x.view(-1)])
    step = GraphStep(fn, [torch.nn.Parameter(torch.randn(2), requires_grad=False), torch.randn(3, 4)])
    w = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    for _ in range(4):
        x = torch.randn(3, 4)
        out = step(w, x)[0]
        assert torch.equal(out, x.view(-1)) and out.data_ptr() == x.data_ptr()  # the caller's input's view
    assert step.broken


def test_a_graph_writing_a_buffer_writes_it_once_a_call_the_capturing_call_included(fake_cuda):
    buf = torch.zeros(3)
    buf._dynamo_static_input_type = "unguarded"  # a module's buffer, read and written in place

    def writes(b, x):
        if FakeGraph.current is not None:
            return [torch.empty_like(b)]  # capturing: a real capture records the kernels and runs none
        b.add_(x)
        return [b * 2]
    step, want = GraphStep(Recorded(writes), [buf, torch.randn(3)]), torch.zeros(3)
    for _ in range(6):
        x = torch.randn(3)
        want += x
        out = step(buf, x)[0]
        assert torch.allclose(buf, want) and torch.allclose(out, 2 * want)
    assert FakeGraph.captures == 1


def test_graphs_writing_a_non_static_input_stay_with_the_trees():
    buf = torch.nn.Buffer(torch.zeros(3)) if hasattr(torch.nn, "Buffer") else torch.zeros(3)
    buf._dynamo_static_input_type = "unguarded"  # what Dynamo marks a module's buffer with
    x = torch.randn(3)

    def writes_input(b, x):
        x.add_(1.0)
        return (b + x,)

    def writes_buffer(b, x):
        b.add_(x)
        return (b * 2,)

    assert not capturable(aten_graph(writes_input, (buf, x)), [buf, x])
    assert capturable(aten_graph(writes_buffer, (buf, x)), [buf, x])
    assert capturable(aten_graph(lambda b, x: (b + x,), (buf, x)), [buf, x])


def test_the_backend_replays_graphs_with_tuned_sites_from_one_cuda_graph(fake_cuda, monkeypatch, tmp_path,
                                                                          tuned_calls):
    import tritune
    from tritune.kernels.backend import compiler

    lowered = []

    def plain_inductor(mode=None, combo=False, early=False, options=None):  # stands in for Inductor: the graph as it is, recorded
        def compile_graph(gm, example_inputs):
            lowered.append(mode)
            return Recorded(gm)
        return compile_graph

    monkeypatch.setattr(compiler, "inductor", plain_inductor)
    model, x = torch.nn.Sequential(torch.nn.Linear(23, 21), torch.nn.ReLU(), torch.nn.Linear(21, 9)), torch.randn(17, 23)
    db = store(tmp_path / "t.db", [t.expr for t in tritune.extract_tasks(model, (x,))])
    torch._dynamo.reset()
    backend = tritune.compiler(db, mode="reduce-overhead")
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        outs = [(compiled(x), model(x)) for x in (torch.randn(17, 23) for _ in range(5))]
    assert [k for _, k in backend.sites] == ["tuned", "tuned"] and lowered == [None]  # the default lowering
    assert FakeGraph.captures == 1 and all(torch.allclose(y, want, atol=1e-5) for y, want in outs)


def test_through_torch_compile_outputs_are_handed_out_again_and_a_held_one_gets_a_second_graph(fake_cuda, poison, monkeypatch, tmp_path,
                                                                             tuned_calls):
    import tritune
    from tritune.kernels.backend import compiler

    from torch._inductor.cudagraph_trees import MarkStepBox

    monkeypatch.setattr(MarkStepBox, "mark_step_counter", 0)  # calls tell steps apart, not step marks (other tests')
    monkeypatch.setattr(compiler, "inductor", lambda mode=None, combo=False, early=False, options=None: lambda gm, ex: Recorded(gm))
    builds = []
    fresh = cuda_graphs.Handout._fresh
    monkeypatch.setattr(cuda_graphs.Handout, "_fresh", lambda self: builds.append(1) or fresh(self))
    model = torch.nn.Sequential(torch.nn.Linear(23, 21), torch.nn.ReLU(), torch.nn.Linear(21, 9))
    db = store(tmp_path / "t.db", [t.expr for t in tritune.extract_tasks(model, (torch.randn(17, 23),))])
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=tritune.compiler(db, mode="reduce-overhead"), fullgraph=True)
    with torch.no_grad():
        for _ in range(6):  # each output dropped before the next call: Dynamo keeps no reference to it
            x = torch.randn(17, 23)
            y = compiled(x)
            assert torch.allclose(y, model(x), atol=1e-5)
            del y
        assert len(builds) == 1 and not poison
        y = compiled(x)
        for _ in range(4):  # `y` still held at each call, as in `y = model(x)` in a loop: two graphs take turns
            old, want, x = y, y.clone(), torch.randn(17, 23)
            y = compiled(x)
            assert torch.allclose(y, model(x), atol=1e-5) and torch.equal(old, want)
    assert len(builds) == 2 and not poison and FakeGraph.captures == 2


def _cache_step():
    """A step that appends to a marked cache in place, as a static KV cache's update does."""
    def writes(cache, x):
        if FakeGraph.current is not None:
            return [torch.empty_like(cache)]  # capturing: a real capture runs no kernel
        cache.add_(x)
        return [cache * 2]
    return writes


def _new_cache(fill):
    cache = fill.clone()  # a generate() call's cache: allocated anew, then filled by its prefill
    torch._dynamo.mark_static_address(cache)
    return cache


def _decode(step, cache, calls=3):
    want = cache.clone()
    for _ in range(calls):
        x = torch.randn(3)
        want += x
        out = step(cache, x)[0]
        assert torch.allclose(cache, want) and torch.allclose(out, 2 * want)


def test_a_cache_allocated_anew_for_every_call_is_adopted_into_the_captured_memory(fake_cuda):
    cache = _new_cache(torch.zeros(3))
    step = GraphStep(Recorded(_cache_step()), [cache, torch.randn(3)])
    for _ in range(4):  # generate() calls: each a new cache, its prefill's contents kept, decoded in place
        cache = _new_cache(torch.randn(3))
        _decode(step, cache)
    assert FakeGraph.captures == 1 and not step.broken
    assert cache.data_ptr() == step.last.inputs[0].data_ptr()  # the cache reads the captured memory


def test_a_cache_the_caller_kept_or_views_elsewhere_are_not_adopted(fake_cuda):
    kept = _new_cache(torch.zeros(3))
    step = GraphStep(Recorded(_cache_step()), [kept, torch.randn(3)])
    _decode(step, kept, calls=cuda_graphs.WARM_CALLS + 2)
    before = kept.clone()
    cache = _new_cache(torch.randn(3))
    _decode(step, cache)  # the last cache is still held: captured anew, the kept one untouched
    assert FakeGraph.captures == 2 and torch.equal(kept, before) and cache.data_ptr() != kept.data_ptr()
    del kept
    cache = _new_cache(torch.randn(3))
    view = cache[1:]  # a view of the new cache elsewhere: pointing the cache away would split them
    _decode(step, cache)
    assert FakeGraph.captures == 3 and view.data_ptr() == cache.data_ptr() + cache.element_size()
