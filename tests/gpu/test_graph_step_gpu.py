"""The backend's CUDA-graph step on the GPU: a step's outputs are the graph's own memory; one held
at the next call is spared by a second graph, one held past two calls raises (naming the fix)
instead of reading a later step's values, and a clone taken in time keeps them."""
import pytest
import torch

import gpu_cases


def test_outputs_held_past_two_calls_raise_and_clones_keep_them(tmp_path):
    import tritune

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32)).cuda().half()
    x, y = (torch.randn(16, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    db = gpu_cases.store_defaults(tritune.extract_tasks(model, (x,)), tmp_path / "t.db")
    torch._dynamo.reset()
    backend = tritune.compiler(db, mode="reduce-overhead")
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        for _ in range(3):  # warm-up, capture
            compiled(x)
        first = compiled(x)
        where, kept = first.data_ptr(), first.clone()
        second = compiled(y)  # `first` held: a second graph, outputs of its own
        torch.cuda.synchronize()
        assert second.data_ptr() != where and torch.equal(first, kept)
        third = compiled(y)  # both held: the first graph again, where it wrote before (no copy)
        torch.cuda.synchronize()
        want_x, want_y = model(x), model(y)
    assert any(kind == "tuned" for _, kind in backend.sites)
    assert third.data_ptr() == where
    with pytest.raises(RuntimeError, match="clone the outputs"):
        first.sum()
    assert torch.allclose(kept, want_x, atol=1e-2) and torch.allclose(second, want_y, atol=1e-2)
    assert torch.equal(second, third)


def test_a_step_reads_weights_in_place_and_captures_on_weights_elsewhere():
    from tritune.kernels.backend.cuda_graphs import GraphStep

    def w_new():
        return torch.nn.Parameter(torch.randn(64, 32, device="cuda"), requires_grad=False)

    w, x = w_new(), torch.randn(16, 64, device="cuda")
    step = GraphStep(lambda w, x: [x @ w + 1.0], [w, x])
    for _ in range(4):
        x = torch.randn(16, 64, device="cuda")
        assert torch.allclose(step(w, x)[0], x @ w + 1.0, atol=1e-3)
    assert len(step.captures) == 1
    with torch.no_grad():
        w.mul_(2.0)  # in place: read where it is, no new capture
    assert torch.allclose(step(w, x)[0], x @ w + 1.0, atol=1e-3) and len(step.captures) == 1
    moved = w_new()
    assert torch.allclose(step(moved, x)[0], x @ moved + 1.0, atol=1e-3) and len(step.captures) == 2


class _BrokenLayers(torch.nn.Module):
    """Layers with a graph break inside each: Dynamo calls one compiled graph with each layer's weights."""

    def __init__(self, layers: int = 4, width: int = 64):
        super().__init__()
        self.ups = torch.nn.ModuleList(torch.nn.Linear(width, 2 * width) for _ in range(layers))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * width, width) for _ in range(layers))

    def forward(self, x):
        for up, down in zip(self.ups, self.downs):
            h = torch.relu(up(x))
            torch._dynamo.graph_break()
            x = x + down(h)
        return x


def test_a_graph_break_inside_layers_replays_each_layers_graph_and_loop_outputs_stay_right(tmp_path, caplog):
    import logging

    import tritune

    torch.manual_seed(0)
    model = _BrokenLayers().cuda().half()
    xs = [torch.randn(16, 64, device="cuda", dtype=torch.float16) for _ in range(6)]
    db = gpu_cases.store_defaults(tritune.extract_tasks(model, (xs[0],)), tmp_path / "t.db")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=tritune.compiler(db, mode="reduce-overhead"))
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        got, y = [], None
        for x in xs:  # `y = model(x)` in a loop: the last output is held while the next step runs
            prev, y = y, compiled(x)
            torch.cuda.synchronize()
            got.append(y.clone())
            if prev is not None:
                assert torch.equal(prev, got[-2])  # still the previous step's values
        want = [model(x) for x in xs]
    assert "without CUDA graphs" not in caplog.text
    assert all(torch.allclose(g, w, atol=2e-2, rtol=2e-2) for g, w in zip(got, want))


class _Counting(torch.nn.Module):
    """A projection that also adds its output's column sums into a buffer, in place, every call."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 32)
        self.register_buffer("seen", torch.zeros(32))

    def forward(self, x):
        y = self.lin(x)
        self.seen.add_(y.sum(0))
        return y


def test_a_buffer_written_in_place_is_written_once_a_call_through_capture_and_replays(tmp_path):
    import tritune

    torch.manual_seed(0)
    model = _Counting().cuda().half()
    reference = _Counting().cuda().half()
    reference.load_state_dict(model.state_dict())
    xs = [torch.randn(16, 64, device="cuda", dtype=torch.float16) for _ in range(6)]
    db = gpu_cases.store_defaults(tritune.extract_tasks(model, (xs[0],)), tmp_path / "t.db")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=tritune.compiler(db, mode="reduce-overhead"), fullgraph=True)
    with torch.no_grad():
        for x in xs:  # warm-up calls, the capturing call, replays
            compiled(x)
            reference(x)
        torch.cuda.synchronize()
    assert torch.allclose(model.seen.float(), reference.seen.float(), rtol=1e-2, atol=0.1)


def _split_where_allowed(tasks: list, path) -> str:
    """A database where each task's default config is its one trial, split in two along K except
    for a contraction that reads a norm (its statistics need the whole K loop: no split)."""
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key, family
    from tritune.records.database import Database
    from tritune.records.result import MeasureResult, Status

    with Database(path) as db:
        for task in tasks:
            expr = task.expr
            config = family(expr.op).default_config(expr)
            if expr.op in ("gated", "wide") or (expr.op == "matmul" and expr.norm_eps is None):
                config = config.replace(SPLIT_K=2)
            db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
            db.save(expr.key, device_key(device_info(), expr.op), [MeasureResult(config, Status.OK, *[1.0] * 4)])
    return str(path)


@pytest.mark.parametrize("name", ("llama", "gpt2"))
def test_split_sites_replay_on_counters_zeroed_once(name, tmp_path):
    """A zoo decoder at decode whose GEMM sites split along K, in the CUDA-graph mode: their arrival
    counters are zeroed once, before the capture, outside the graph's memory (which the graph's
    other buffers reuse within a replay), and each replay leaves them at 0 for the next. Every call
    on new inputs against float64 (a counter off 0 leaves tiles unfinished or half summed)."""
    pytest.importorskip("transformers")
    from functools import partial

    import tritune
    from tritune.tuner.model import zoo
    from tritune.tuner.model.load import build
    from tritune.tuner.worker.candidate import rel_error

    model, (x,) = build(partial(getattr(zoo, name), hidden=256, layers=2), [(16, 1, 256)], "fp32", "cuda", "random")
    xs = [x * (1 + 0.25 * i) + 0.1 * i for i in range(6)]
    with torch.no_grad():
        refs = [model.double()(x.double()) for x in xs]
        model = model.half()
        errors = [rel_error(model(x.half()), ref) for x, ref in zip(xs, refs)]
    db = _split_where_allowed(tritune.extract_tasks(model, (xs[0].half(),)), tmp_path / "t.db")
    torch._dynamo.reset()
    backend = tritune.compiler(db, mode="reduce-overhead")
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        outs = [compiled(x.half()).clone() for x in xs]  # warm-up, capture, replays
        torch.cuda.synchronize()
    assert sum(kind == "tuned" for _, kind in backend.sites) >= 4, backend.sites
    assert all(rel_error(out, ref) <= 2 * err + 1e-3 for out, ref, err in zip(outs, refs, errors))
