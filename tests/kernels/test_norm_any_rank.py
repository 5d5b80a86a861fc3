"""Norm prologues whatever the rows' leading dimensions: an RMSNorm (or a LayerNorm) read only by a
projection, a gated pair or a wide group goes into its kernel whether the rows come as [tokens,
hidden] (serving engines flatten them), [batch, tokens, hidden] or with more leading dimensions;
a compiled 2-D model runs the normed kernels without the norm's own ops and matches eager."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tritune
from test_compiler import fresh_dynamo  # noqa: F401 - a fixture
from test_generate import store_every_task
from test_norm_prologue import Normed, RMSNorm

from tritune.kernels.backend import graph, sites
from tritune.tuner.worker.candidate import rel_error

SHAPES = [(3, 48), (3, 1, 48), (1, 3, 1, 48)]


class NormedPair(nn.Module):
    """An RMSNorm read by a gated pair (`kind` "gated") or by two projections (a wide group);
    `leak`: the normed rows are returned too (another reader)."""

    def __init__(self, kind="gated", k=48, leak=False):
        super().__init__()
        self.norm, self.kind, self.leak = RMSNorm(k), kind, leak
        self.a, self.b = nn.Linear(k, 40, bias=False), nn.Linear(k, 40 if kind == "gated" else 16, bias=False)

    def forward(self, x):
        y = self.norm(x)
        out = F.silu(self.a(y)) * self.b(y) if self.kind == "gated" else (self.a(y), self.b(y))
        return (out, y) if self.leak else out


def found(model, x):
    return graph.find(graph.aten_graph(model, (x,)), allow_tf32=False)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}-D")
@pytest.mark.parametrize("model,op", [(Normed(), "matmul"), (Normed(layer=True), "matmul"),
                                      (NormedPair("gated"), "gated"), (NormedPair("wide"), "wide")],
                         ids=["rmsnorm", "layernorm", "gated", "wide"])
def test_every_site_kind_takes_the_norm_in_whatever_the_leading_dims(shape, model, op):
    site, = found(model, torch.randn(*shape))
    assert site.expr.op == op and site.expr.m == 3 and site.norm is not None
    assert tuple(graph.val(site.norm.x).shape) == shape and site.expr.norm_eps == site.norm.eps


@pytest.mark.parametrize("model", [Normed(leak=True), Normed(layer=True, leak=True), NormedPair("gated", leak=True),
                                   NormedPair("wide", leak=True)], ids=["rmsnorm", "layernorm", "gated", "wide"])
def test_a_norm_with_another_reader_stays_a_kernel_of_flat_rows_too(model):
    assert [s.norm for s in found(model, torch.randn(3, 48))] == [None]


@pytest.mark.parametrize("model", [Normed(k=256, n=64), NormedPair("gated", k=256), NormedPair("wide", k=256)],
                         ids=["matmul", "gated", "wide"])
def test_compiled_flat_rows_run_the_normed_kernel_and_match_eager(tmp_path, monkeypatch, model):
    calls, graphs = [], []
    for kind in (sites.Site, sites.GatedSite, sites.WideSite):
        def recording(self, *args, _original=kind.__call__):
            calls.append([a.data_ptr() for a in args if isinstance(a, torch.Tensor)])
            return _original(self, *args)
        monkeypatch.setattr(kind, "__call__", recording)
    torch.manual_seed(0)
    model, x = model.eval(), torch.randn(16, 256)
    tasks = tritune.extract_tasks(model, (x,), allow_tf32=False)
    assert [t.expr.norm_eps for t in tasks] == [1e-6]
    backend = tritune.compiler(store_every_task(tmp_path / "t.db", tasks),
                               fallback=lambda gm, inputs: graphs.append(gm) or gm.forward)
    with torch.no_grad():
        outs = torch.compile(model, backend=backend, fullgraph=True)(x)
        refs = model(x)
    for out, ref in zip(*(o if isinstance(o, tuple) else (o,) for o in (outs, refs))):
        assert rel_error(out, ref.double()) < 1e-5
    called, = calls  # with the norm's weight
    assert [k for _, k in backend.sites] == ["tuned"] and model.norm.weight.data_ptr() in called
    # the norm's own ops are gone from the graph: the kernel computes it
    g, = graphs
    assert not any(n.target == torch.ops.aten.rsqrt.default for n in g.graph.nodes)
