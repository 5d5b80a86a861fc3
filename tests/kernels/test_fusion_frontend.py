"""The fusing frontend: general pointwise epilogues (residuals, row / column vectors, activations
written as pointwise ops, x * sigmoid(x)), gated pairs and wide groups (q, k, v) found in traced
models, and replayed by the torch.compile backend under the interpreter against eager."""
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tritune
from models import Fusions, GatedMLP, Projections, fusions_inputs
from tritune.kernels.device import device_info
from tritune.kernels.epilogue import BiasAdd, Binary, Clamp, Input, Pow, Relu, Scale, Unary
from tritune.kernels.family import device_key, family
from tritune.kernels.backend import graph, ops, tuned_op
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config

FAST = Config.of(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=1, num_warps=2, num_stages=2, UNROLL=1)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
GELU_TANH = (Binary("mul", (Binary("add", (Pow(3), Scale(0.044715))), Scale(math.sqrt(2 / math.pi)), Unary("tanh"),
                            Binary("add", 1.0))), Scale(0.5))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def epilogues(model, inputs):
    tasks = tritune.extract_tasks(model, inputs)
    return [(t.expr.describe(), getattr(t.expr, "epilogue", None), t.count) for t in tasks]


def test_every_epilogue_kind_is_captured_from_the_graph():
    (proj, scaled, gelu, swish) = epilogues(Fusions(), fusions_inputs())
    assert proj == ("matmul 66x47x29 fp32 NT+bias+add", (BiasAdd(), Binary("add", Input("mn", "fp32"))), 1)
    # (x @ w) * rows * col: one value per row ([2, 33, 1] of 66 rows), one per column
    assert scaled[1] == (Binary("mul", Input("m", "fp32")), Binary("mul", Input("n", "fp32")))
    assert gelu[1] == (BiasAdd(), *GELU_TANH)  # GPT-2's 0.5*x*(1+tanh(...)) as written
    assert swish[1] == (Binary("mul", (Unary("sigmoid"),)),)


class Chains(nn.Module):
    """Operand order, constants and stops: what each op becomes, and where fusing ends."""

    def forward(self, x, w, v):
        y = x @ w
        a = torch.clamp(2.0 - y, min=-1.0).pow(2) / 3.0  # rsub, clamp, pow, div -> scale
        b = torch.relu(x @ w) + 1.0
        c = torch.where(x @ w > 0, v, v)  # an op with no step: nothing fuses, and it is named
        y2 = x @ w
        d = y2 / y2.sum(-1, keepdim=True)  # read by a row sum: the value leaves the kernel as it is
        e = (x @ w) / (x @ w).sum(-1, keepdim=True)  # another product's row sums: one value per row
        f = 1.0 / torch.sigmoid(x @ w)  # the value on the right: rdiv (torch: reciprocal, then * 1)
        return a, b, c, d, e, f


def test_constants_operand_order_and_where_fusing_stops():
    x, w, v = torch.randn(9, 13), torch.randn(13, 11), torch.randn(9, 11)
    tasks = tritune.extract_tasks(Chains(), (x, w, v))
    found = {t.expr.epilogue: t for t in tasks}
    assert (Binary("rsub", 2.0), Clamp(min=-1.0), Pow(2), Scale(1 / 3.0)) in found
    assert (Relu(), Binary("add", 1.0)) in found
    assert (Unary("sigmoid"), Binary("rdiv", 1.0)) in found
    assert (Binary("div", Input("m", "fp32")),) in found
    plain = found[()]  # c, d, and the product the row sums are taken of
    assert plain.count == 3 and plain.unfused == ("gt",)  # where reads gt(...); a sum is no elementwise op


def test_gated_pairs_are_one_site_either_order_with_biases():
    x = torch.randn(2, 33, 29)
    swiglu = epilogues(GatedMLP(), (x,))
    assert [(d, n) for d, _, n in swiglu] == [("gated silu 66x37x29 fp32", 1), ("matmul 66x29x37 fp32 NT", 1)]
    geglu = tritune.extract_tasks(GatedMLP(act=lambda t: F.gelu(t, approximate="tanh"), bias=True, up_first=True),
                                  (x,))
    assert geglu[0].expr == Gated(66, 37, 29, "fp32", "gelu_tanh", bias=True, allow_tf32=False)
    assert geglu[1].expr.epilogue == (Binary("add", Input("mn", "fp32")),)  # down + the residual
    swish = tritune.extract_tasks(GatedMLP(act=lambda t: t * torch.sigmoid(t)), (x,))
    assert swish[0].expr.activation == "silu"
    # an activation the kernel has not: two contractions, the gate's with the other as an input
    tanh = epilogues(GatedMLP(act=torch.tanh), (x,))
    assert tanh[0][1] == (Unary("tanh"), Binary("mul", Input("mn", "fp32"))) and tanh[1][1] == ()


def test_zoo_models_llama_gated_and_residuals_gpt2_pointwise_gelu():
    from tritune.tuner.model import zoo

    llama = tritune.extract_tasks(zoo.llama(hidden=64, layers=1).eval(), (torch.randn(1, 12, 64),))
    kinds = [t.expr.describe() for t in llama]
    # q, k, v: one task; each layer's two RMSNorms go into q/k/v's and gate/up's prologue, the final
    # one into the LM head's
    assert "gated silu 12x176x64 fp32 rmsnorm" in kinds and "wide 12x(64+16+16)x64 fp32 rmsnorm" in kinds
    assert "matmul 12x32000x64 fp32 NT rmsnorm" in kinds
    assert sum(t.expr.epilogue == (Binary("add", Input("mn", "fp32")),) for t in llama if t.expr.op == "matmul") == 2
    gpt2 = tritune.extract_tasks(zoo.gpt2(hidden=64, layers=1).eval(), (torch.randn(1, 12, 64),))
    up = next(t for t in gpt2 if t.expr.op == "matmul" and t.expr.n == 256)
    assert up.expr.epilogue == (BiasAdd(), *GELU_TANH) and up.expr.trans_b is False  # Conv1D: [K, N] weights
    assert not any(t.unfused for t in gpt2) and not any(t.expr.op == "wide" for t in gpt2)  # c_attn: q, k, v in one
    assert not any(t.expr.op == "matmul" and t.expr.layer_norm for t in gpt2)  # 12 rows: the norms stay kernels
    # at decode (2 sequences) GPT-2's LayerNorms stay kernels ([K, N] weights); GPT-NeoX's go into
    # query_key_value's and dense_h_to_4h's prologues, but not the LM head's (50432 columns)
    gpt2 = tritune.extract_tasks(zoo.gpt2(hidden=64, layers=1).eval(), (torch.randn(2, 1, 64),))
    assert not any(t.expr.op == "matmul" and t.expr.layer_norm for t in gpt2)
    neox = tritune.extract_tasks(zoo.neox(hidden=64, layers=1).eval(), (torch.randn(2, 1, 64),))
    assert [t.expr.n for t in neox if t.expr.op == "matmul" and t.expr.layer_norm] == [192, 256]
    up = next(t for t in neox if t.expr.op == "matmul" and t.expr.n == 256)
    assert up.expr.describe() == "matmul 2x256x64 fp32 NT layernorm+bias+gelu"


def store(path, exprs, library=()):
    """A database where each expression's best is FAST (gated: FUSE 1 for 16-bit; attention: its
    family's default), or a library call."""
    db = Database(path)
    for expr in exprs:
        config = FAST.replace(FUSE=int(expr.dtype != "fp32")) if expr.op == "gated" else FAST
        config = family("attention").default_config(expr) if expr.op == "attention" else config
        results = [MeasureResult(config, Status.OK, 1.0, 1.0, 1.0, 1.0)]
        if expr in library:
            results.append(MeasureResult(Config.of(library="mm"), Status.OK, *[0.9] * 4))
        db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        db.save(expr.key, device_key(device_info(), expr.op), results)
    db.close()
    return path


class Everything(nn.Module):
    """Fusions, a SwiGLU MLP and a GeGLU one with biases and a residual."""

    def __init__(self):
        super().__init__()
        self.fusions, self.swiglu = Fusions(), GatedMLP()
        self.geglu = GatedMLP(act=F.gelu, bias=True, up_first=True)

    def forward(self, x, r, rows):
        return (*self.fusions(x, r, rows), self.swiglu(x), self.geglu(x))


@pytest.fixture
def launched(monkeypatch):
    calls = []
    for cls in (tuned_op.Site, tuned_op.GatedSite, tuned_op.WideSite, tuned_op.AttentionSite):
        original = cls.__call__
        monkeypatch.setattr(cls, "__call__", lambda self, *a, _o=original: calls.append(self.expr) or _o(self, *a))
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_backend_replays_every_fusion_and_matches_eager(tmp_path, launched, dtype):
    model, inputs = Everything().to(dtype), fusions_inputs(dtype)
    tasks = tritune.extract_tasks(model, inputs)
    assert Counter(t.expr.op for t in tasks) == {"matmul": 6, "gated": 2}
    backend = tritune.compiler(store(tmp_path / "t.db", [t.expr for t in tasks]), fallback="eager")
    with torch.no_grad():
        outs = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
        refs = model(*inputs)
    errors = [((o.double() - r.double()).norm() / r.double().norm()).item() for o, r in zip(outs, refs)]
    assert max(errors) < TOLERANCE[dtype]
    assert Counter(e.key for e in launched) == {t.expr.key: t.count for t in tasks}
    assert {kind for _, kind in backend.sites} == {"tuned"}


def test_a_gated_pair_the_library_won_runs_its_contractions_as_sites(tmp_path, launched):
    model, x = GatedMLP(), torch.randn(2, 33, 29)
    site, down = graph.find(graph.aten_graph(model, (x,)), allow_tf32=False)
    gate, up = site.projections  # the gate's epilogue reads the other product as an input
    assert gate.expr.epilogue == (Unary("silu"), Binary("mul", Input("mn", "fp32"))) and up.expr.epilogue == ()
    db = store(tmp_path / "t.db", [site.expr, gate.expr, down.expr], library=[site.expr])
    backend = tritune.compiler(db, fallback="eager")
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
        assert torch.allclose(y, model(x), atol=1e-5)
    # up has no record: left to the fallback, and not reported as a miss (the pair's record covers it)
    assert backend.sites == [(site.expr.describe(), "library"), (gate.expr.describe(), "tuned"),
                             (down.expr.describe(), "tuned")]
    assert launched == [gate.expr, down.expr]


def test_the_call_time_op_takes_extra_inputs(tmp_path):
    # sizes no other test's call has: ops caches its entries per call signature for the session
    a, b, res, row = torch.randn(23, 19), torch.randn(19, 14), torch.randn(23, 14), torch.randn(23).half()
    steps = (Binary("add", Input("mn", "fp32")), Binary("mul", Input("m", "fp16")), Relu())
    y = ops.matmul(a, b, epilogue=steps, inputs=(res, row), config=FAST, allow_tf32=False)
    assert torch.allclose(y, torch.relu((a @ b + res) * row.float()[:, None]), atol=1e-5)
    with pytest.raises(ValueError, match=r"^epilogue input 1 must be fp16 of shape \(23,\), got fp32 \(23,\)$"):
        ops.matmul(a, b, epilogue=steps, inputs=(res, row.float()), config=FAST)


def test_tune_model_tunes_a_gated_pair_as_one_task(monkeypatch, tmp_path, capsys):
    from functools import partial

    import fake_worker
    from fakes import FakeBuilder
    from tritune.records.dispatch import HistoryBest
    from tritune.tuner.gpus import start
    from tritune.tuner.cli import main
    from tritune.tuner.worker.local import LocalRunner

    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    db = tmp_path / "t.db"
    main(["tune-model", "--model", str(Path(__file__).parents[1] / "helpers" / "models.py:swiglu"), "--input-shape", "2,20,64",
          "--dtype", "fp32", "--trials", "40", "--strategy", "random", "--no-check", "--db", str(db)])
    out = capsys.readouterr().out
    assert "gated silu 40x96x64 fp32" in out and "matmul 40x64x96 fp32 NT" in out
    gated = Gated(40, 96, 64, "fp32", allow_tf32=False)
    fake = {"gpu": "Fake H100", "capability": "9.0", "triton": "3.x", "torch": "2.x"}
    best = HistoryBest(db).best(gated.key, device_key(fake, "gated"))
    assert best is not None and "FUSE" in best  # a kernel of the gated space won (the fake library is slower)


class InPlace(nn.Module):
    """Tensors written in place between two reads: a kernel that runs where its epilogue ends must
    not read them there."""

    def forward(self, x, w, r):
        r, x2 = r.clone(), x.clone()
        a = x @ w + r
        r.mul_(2)
        b = x2 @ w
        x2.t().mul_(2)  # through a view
        return torch.relu(a * r), r, torch.relu(b), x2


def test_tensors_written_in_place_are_no_epilogue_inputs_nor_operands(tmp_path):
    x, w, r = torch.randn(9, 13), torch.randn(13, 11), torch.randn(9, 11)
    (task,) = tritune.extract_tasks(InPlace(), (x, w, r))  # b, whose input is written, is no site
    assert task.expr.epilogue == () and task.unfused == ("add",)


@pytest.mark.parametrize("name, rows", [("llama", 12), ("gpt2", 12), ("qwen2", 12), ("gpt2", 2), ("neox", 2)])
@pytest.mark.system
def test_zoo_models_compile_with_their_fused_sites_replayed(tmp_path, launched, name, rows):
    # 12 rows: RMSNorms in the prologues; 2 sequences of one token: LayerNorms too
    from tritune.tuner.model import zoo

    torch.manual_seed(0)
    shape = (1, 12, 64) if rows == 12 else (rows, 1, 64)
    model, x = getattr(zoo, name)(hidden=64, layers=1).eval(), torch.randn(*shape)
    tasks = [t for t in tritune.extract_tasks(model, (x,)) if getattr(t.expr, "n", 0) < 1000]  # the LM head: a miss
    backend = tritune.compiler(store(tmp_path / "t.db", [t.expr for t in tasks]), fallback="eager")
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
        ref = model(x)
    assert ((y - ref).norm() / ref.norm()).item() < 1e-5
    # Dynamo's graph holds the sites export found: each replayed, the gated pair and residuals included
    assert Counter(e.key for e in launched) == {t.expr.key: t.count for t in tasks}
    assert Counter(kind for _, kind in backend.sites) == {"tuned": sum(t.count for t in tasks), "miss": 1}


def test_projections_of_one_input_are_one_wide_site_and_the_rest_stay_apart():
    x = torch.randn(2, 11, 29)
    tasks = tritune.extract_tasks(Projections(bias=True), (x,))
    # q, k, v; a projection with a ReLU after, a product of two outputs, k of q: contractions of their own
    assert [t.expr.describe() for t in tasks] == ["wide 22x(29+13+13)x29 fp32 +bias", "matmul 2x13x13x11 fp32 TN",
                                                  "matmul 22x13x29 fp32 NT+bias+relu", "matmul 22x13x29 fp32 NT+bias"]
    assert tasks[0].expr == Wide(22, (29, 13, 13), 29, "fp32", bias=True, allow_tf32=False)
    hyper = epilogues(HyperProjections(), (torch.randn(6, 6),))  # w2 computed from x @ w1: no group
    assert [(d, n) for d, _, n in hyper] == [("matmul 6x6x6 fp32 NN", 2)]


class HyperProjections(nn.Module):
    """Two products of x, the second's weight computed from the first's output."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 6))

    def forward(self, x):
        y = x @ self.w
        return y, x @ (y + self.w)


@pytest.mark.parametrize("dtype,bias", [(torch.float32, True), (torch.float16, False)])
def test_the_backend_replays_a_wide_group_in_one_launch(tmp_path, launched, dtype, bias):
    model, x = Projections(bias=bias).to(dtype), torch.randn(2, 11, 29).to(dtype)
    tasks = tritune.extract_tasks(model, (x,))
    backend = tritune.compiler(store(tmp_path / "t.db", [t.expr for t in tasks]), fallback="eager")
    with torch.no_grad():
        outs = torch.compile(model, backend=backend, fullgraph=True)(x)
        refs = model(x)
    assert max(((o.double() - r.double()).norm() / r.double().norm()).item() for o, r in zip(outs, refs)) < \
        TOLERANCE[dtype]
    assert Counter(e.key for e in launched) == {t.expr.key: 1 for t in tasks}
    assert [kind for _, kind in backend.sites] == ["tuned"] * 4


def test_a_wide_group_the_library_won_runs_its_projections_as_sites(tmp_path, launched):
    model, x = Projections(), torch.randn(2, 11, 29)
    site = graph.find(graph.aten_graph(model, (x,)), allow_tf32=False)[0]
    q, k, v = site.projections
    db = store(tmp_path / "t.db", [site.expr, q.expr, k.expr], library=[site.expr])
    backend = tritune.compiler(db, fallback="eager")
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(y, model(x)))
    # q and k (one workload) run their own kernels; v has no record of its own: the group's covers it
    assert backend.sites[:3] == [(site.expr.describe(), "library"), (q.expr.describe(), "tuned"),
                                 (k.expr.describe(), "tuned")]
    assert launched[:2] == [q.expr, k.expr] and site.expr not in launched
