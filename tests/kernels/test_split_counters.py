"""Split sites' arrival counters in the backend's CUDA-graph mode: sized at a run of the graph outside
the capture, allocated and zeroed before it, outside the graph's own memory (not zeroed by a kernel
in every replay), kept as long as the graph. That split kernels leave their counters at 0 again is
tested per family (test_kernels, test_gated, test_wide, test_attention); replays on a GPU, with a
graph's other buffers reusing its memory, in tests/gpu."""
import json

import pytest
import torch

from test_compiler import FAST, store, tuned_calls  # noqa: F401 - fixtures
from test_graph_step import FakeGraph, Recorded, fake_cuda  # noqa: F401 - fixtures
from test_pdl import _mlp_graph
from tritune.kernels.backend import cuda_graphs, graph, sites, tuned_op
from tritune.kernels.backend.compiler import rewrite
from tritune.schedules.config import Config

TILE = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1)


@pytest.mark.parametrize("captured, knobs, early, twins", [
    (True, dict(SPLIT_K=2), False, True),
    (False, dict(SPLIT_K=2), False, False),
    (True, dict(SPLIT_K=1), False, False),
    (True, dict(SPLIT_K=2, PDL=1), False, False),  # the twin would launch it early
    (True, dict(SPLIT_K=2, PDL=1), True, True),
])
def test_split_sites_call_the_twin_only_in_one_cuda_graph(captured, knobs, early, twins):
    aten, _, _ = _mlp_graph()
    tile = Config.of(TILE, **knobs)
    hits = [(s, tuned_op.spec_of(s.expr, tile.replace(FUSE=0) if s.expr.op == "gated" else tile))
            for s in graph.find(aten)]
    rewrite(aten, hits, captured, early)
    targets = {str(n.target) for n in aten.graph.nodes if str(n.target).startswith("tritune.")}
    assert targets == ({"tritune.gated_graphed.default", "tritune.matmul_graphed.default"} if twins
                       else {"tritune.gated.default", "tritune.matmul.default"})


def test_an_attention_split_over_keys_counts_as_split():
    spec = json.dumps({"expr": {"op": "attention"}, "config": {"SPLIT": 4}})
    kind = tuned_op._BY_OP["attention"]
    assert kind.op_for(spec, True) is kind.graphed_op and kind.op_for(spec, False) is kind.op


def test_counters_are_zeros_listed_at_a_run_and_handed_out_in_order_at_a_capture():
    like = torch.empty(3)
    assert torch.equal(sites._counters(like, 5), torch.zeros(5, dtype=torch.int32))
    with sites.counters_counted() as asked:
        assert torch.equal(sites._counters(like, 4), torch.zeros(4, dtype=torch.int32))
        sites._counters(like, 2)
    assert asked == [(like.device, 4), (like.device, 2)]
    with sites.counters_from(asked) as made:
        assert [len(c) for c in made] == [4, 2] and all(not c.any() for c in made)
        assert sites._counters(like, 4) is made[0]
        other = sites._counters(like, 3)  # not what the run asked for next: fresh zeros
        assert other is not made[1] and torch.equal(other, torch.zeros(3, dtype=torch.int32))
        assert sites._counters(like, 2) is made[1]
        assert sites._counters(like, 2) is not made[1]  # none left
    assert sites._counter_plan.get() is None


def test_a_capture_takes_the_counters_its_run_asked_for_zeroed_before_it(fake_cuda):
    got = []

    def step(w, x):  # a split site asking for its counters
        got.append(sites._counters(x, 6))
        return [x @ w + got[-1].sum()]

    w = torch.nn.Parameter(torch.randn(4, 5), requires_grad=False)
    compiled = cuda_graphs.GraphStep(Recorded(step), [w, torch.randn(3, 4)])
    for _ in range(cuda_graphs.WARM_CALLS + 1):
        compiled(w, torch.randn(3, 4))
    (capture,) = compiled.captures.values()
    (replayed,) = capture.sets
    # the warm calls' and the capturing call's own run got fresh zeros; the capture got the planned ones
    assert len(got) == cuda_graphs.WARM_CALLS + 2 and compiled.counters_asked == [(x.device, 6) for x in got[:1]]
    assert replayed.counters == (got[-1],) and all(got[-1] is not g for g in got[:-1])
    assert torch.equal(got[-1], torch.zeros(6, dtype=torch.int32))


def test_a_capture_that_fails_leaves_no_plan(fake_cuda, monkeypatch):
    def fails(*args):
        sites._counters(torch.empty(1), 2)
        raise RuntimeError("operation not permitted when stream is capturing")

    compiled = cuda_graphs.GraphStep(lambda w, x: [x], [torch.nn.Parameter(torch.randn(1)), torch.randn(1)])
    compiled.fn, compiled.counters_asked = fails, [(torch.device("cpu"), 2)]
    assert compiled._record([torch.randn(1)]).startswith("it could not be captured")
    assert sites._counter_plan.get() is None


def test_the_backend_runs_split_sites_through_the_twin_in_one_cuda_graph(fake_cuda, monkeypatch, tmp_path,
                                                                          tuned_calls):
    import tritune
    from tritune.kernels.backend import compiler

    lowered, kept = [], []
    monkeypatch.setattr(compiler, "inductor",
                        lambda mode=None, combo=False, early=False, options=None: lambda gm, ex: lowered.append(gm) or Recorded(gm))
    record = cuda_graphs.GraphStep._record
    monkeypatch.setattr(cuda_graphs.GraphStep, "_record", lambda self, inputs: kept.append(record(self, inputs)) or kept[-1])
    model, x = torch.nn.Sequential(torch.nn.Linear(23, 21), torch.nn.ReLU(), torch.nn.Linear(21, 9)), torch.randn(17, 23)
    split = FAST.replace(SPLIT_K=2)
    db = store(tmp_path / "t.db", [t.expr for t in tritune.extract_tasks(model, (x,))], split)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=tritune.compiler(db, mode="reduce-overhead"), fullgraph=True)
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(17, 23)
            assert torch.allclose(compiled(x), model(x), atol=1e-5)
    (gm,) = lowered
    assert {str(n.target) for n in gm.graph.nodes if str(n.target).startswith("tritune.")} == {
        "tritune.matmul_graphed.default"}
    assert FakeGraph.captures == 1 and tuned_calls
    (graph_, outputs, counters), = kept
    assert len(counters) == 2 and all(torch.equal(c, torch.zeros_like(c)) for c in counters)
