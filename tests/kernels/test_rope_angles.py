"""Rotary tables computed in the attention kernel: the positions and frequencies a model builds its
cos and sin tables from are found (in the form transformers writes, a matmul of the expanded
frequencies by the positions, and the broadcast multiply the zoo's trace holds), checked by
evaluating the graph on probe values, and read by the kernel; the tables' ops leave the graph, and
the compiled models match float64. Tables that are not that function of their sources stay tables."""
import copy
from collections import Counter

import pytest
import torch
from torch import nn

import tritune
from test_attention_site import CONFIG, Grouped, attention_calls, fresh_dynamo, rel, small, store  # noqa: F401

from tritune.kernels.backend import graph, tuned_op
from tritune.kernels.backend.attention_match import AttentionMatch
from tritune.kernels.backend.compiler import rewrite

H = 64


class Rotating(nn.Module):
    """Grouped attention whose rotary tables transformers' way builds from the positions (an input,
    as in serving) and a frequencies buffer: a matmul of [B, lanes/2, 1] by [B, 1, rows], or
    `scrambled`: the positions read in another order than the rows'."""

    def __init__(self, lanes=16, scale=1.0, scrambled=False):
        super().__init__()
        self.inner, self.scale, self.scrambled = Grouped(lanes=lanes), scale, scrambled
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, lanes, 2).float() / lanes), persistent=False)

    def forward(self, x, positions, mask):
        if self.scrambled:
            positions = positions.t().contiguous().view(positions.shape)
        f = self.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
        freqs = (f @ positions[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.scale, emb.sin() * self.scale
        return self.inner(x, cos.to(x.dtype), sin.to(x.dtype), mask)


def rotating_args(batch=3, tokens=2):
    torch.manual_seed(2)
    positions = torch.randint(0, 4096, (batch, tokens))
    return torch.randn(batch, tokens, 64), positions, torch.randn(batch, 1, tokens, tokens)


def sites(gm):
    return [s for s in graph.find(gm) if isinstance(s, AttentionMatch)]


def ops_left(gm):
    return Counter(str(n.target) for n in gm.graph.nodes)


@pytest.mark.parametrize("scale", [1.0, 0.5])
@pytest.mark.parametrize("lanes", [16, 4], ids=["whole heads", "a quarter of each head"])
def test_tables_built_from_positions_are_computed_in_the_kernel(tmp_path, attention_calls, lanes, scale):
    model, args = Rotating(lanes, scale).eval(), rotating_args()
    gm = graph.aten_graph(model, args)
    site, = sites(gm)
    e = site.expr
    assert (e.rope_q, e.rope_k, e.rope_dims, e.rope_pos, e.rope_freq, e.rope_scale) == (lanes, lanes, "bn", "i64",
                                                                                        "fp32", scale)
    rewrite(gm, [(site, tuned_op.spec_of(e, CONFIG))])
    assert not any(op in ops_left(gm) for op in ("aten.cos.default", "aten.sin.default", "aten.bmm.default"))
    ref = copy.deepcopy(model).double()(args[0].double(), args[1], args[2].double())
    assert rel(gm(*args), ref) <= 1e-5
    tasks = [t.expr for t in tritune.extract_tasks(model, args) if t.expr.op == "attention"]
    backend = tritune.compiler(store(tmp_path / "t.db", tasks), fallback="eager")
    attention_calls.clear()
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(*args)
        assert rel(y, ref) <= 1e-5 and len(attention_calls) == 1
        later = (args[0], torch.randint(0, 4096, args[1].shape), args[2])  # new positions: the same graph
        ref = copy.deepcopy(model).double()(later[0].double(), later[1], later[2].double())
        assert rel(torch.compile(model, backend=backend, fullgraph=True)(*later), ref) <= 1e-5


def test_positions_read_in_another_order_keep_their_tables():
    model, args = Rotating(scrambled=True).eval(), rotating_args()
    gm = graph.aten_graph(model, args)
    site, = sites(gm)
    assert site.expr.rope_q == 16 and site.expr.rope_pos == ""  # rotated in the kernel, from the tables
    rewrite(gm, [(site, tuned_op.spec_of(site.expr, CONFIG))])
    ref = copy.deepcopy(model).double()(args[0].double(), args[1], args[2].double())
    assert rel(gm(*args), ref) <= 1e-5


@pytest.mark.parametrize("name", ["llama", "neox"])
@pytest.mark.system
def test_the_zoo_decoders_tables_leave_the_graph(name):
    model, x = small(name), torch.randn(16, 1, H)
    gm = graph.aten_graph(model, (x,))
    found = sites(gm)
    assert len(found) == 2 and all(s.expr.rope_pos == "i64" and s.expr.rope_q for s in found)
    rewrite(gm, [(s, tuned_op.spec_of(s.expr, CONFIG)) for s in found])
    assert not any(op in ops_left(gm) for op in ("aten.cos.default", "aten.sin.default"))
    assert rel(gm(x), copy.deepcopy(model).double()(x.double())) <= 1e-5
    # the positions (computed from no input) are one constant of the op's shape, not a small 1-D one that
    # Inductor would inline and then copy out for the op in a kernel of its own
    calls = [n for n in gm.graph.nodes if n.target is tuned_op.ATTENTION_OP]
    positions = [n.args[5] for n in calls]
    assert len(calls) == 2 and all(p.op == "get_attr" and getattr(gm, p.target).dim() == 4 for p in positions)
