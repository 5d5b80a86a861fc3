"""Projections fused into one weight, as Phi-3 writes them: gate/up in one Linear whose output is
split into act(gate) * up is one gated site whose weights are the two row ranges of the one weight
(views: nothing copied at run time), found with a norm prologue in front too; q/k/v in one Linear
sliced into q, k and v stays one GEMM whose output the attention site reads through views, its
rotary embeddings taken into the attention kernel. Checked on the zoo's Phi-3 at a small width:
the sites found, and the compiled model (interpreter kernels) against eager."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tritune
from test_compiler import fresh_dynamo  # noqa: F401 - a fixture
from test_generate import site_calls, store_every_task  # noqa: F401 - a fixture
from test_norm_prologue import RMSNorm

from tritune.kernels.backend import graph, sites
from tritune.kernels.backend.attention_match import AttentionMatch
from tritune.kernels.gated import launch
from tritune.kernels.gated.expr import Gated
from tritune.kernels.gated.family import GATED
from tritune.schedules.config import Config
from tritune.tuner.model import zoo
from tritune.tuner.worker.candidate import rel_error

H = 64  # the zoo's Phi-3: 16 query heads of 4 over 4 key/value heads
INTER = H * 8 // 3
SMALL = Config.of(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=2, num_stages=1, UNROLL=1, FUSE=0)
ACTS = {"silu": F.silu, "sigmoid": lambda g: g * torch.sigmoid(g), "gelu": F.gelu}


class FusedMLP(nn.Module):
    """act(gate) * up from one projection: `split` how its output is cut (chunk, slices, split
    sizes), `gate_first` whether the gate is the first half; `leak`: the projection's output is
    returned too (another reader); `norm`: an RMSNorm in front."""

    def __init__(self, k=48, n=40, bias=False, split="chunk", gate_first=True, act="silu", leak=False, norm=False):
        super().__init__()
        self.proj, self.n, self.split, self.gate_first = nn.Linear(k, 2 * n, bias=bias), n, split, gate_first
        self.act, self.leak, self.norm = ACTS[act], leak, RMSNorm(k) if norm else nn.Identity()

    def forward(self, x):
        y = self.proj(self.norm(x))
        if self.split == "chunk":
            first, second = y.chunk(2, dim=-1)
        elif self.split == "slices":
            first, second = y[..., :self.n], y[..., self.n:]
        else:
            first, second = y.split([self.n, self.n], dim=-1)
        gate, up = (first, second) if self.gate_first else (second, first)
        out = up * self.act(gate)
        return (out, y) if self.leak else out


def found(model, x):
    return graph.find(graph.aten_graph(model, (x,)), allow_tf32=False)


@pytest.mark.parametrize("split,gate_first,bias,act", [
    ("chunk", True, False, "silu"), ("slices", False, True, "sigmoid"), ("sizes", True, True, "gelu"),
], ids=str)
@pytest.mark.parametrize("shape", [(5, 48), (5, 1, 48)], ids=["2-D", "3-D"])
def test_a_gate_up_projection_in_one_weight_is_one_gated_site(split, gate_first, bias, act, shape):
    model = FusedMLP(bias=bias, split=split, gate_first=gate_first, act=act)
    site, = found(model, torch.randn(*shape))
    assert type(site) is graph.GatedMatch and site.node is site.up and site.w1 is site.w2
    assert site.expr == Gated(5, 40, 48, "fp32", "gelu" if act == "gelu" else "silu", bias=bias, allow_tf32=False)
    assert site.columns == ((0, 40) if gate_first else (40, 0))
    # where the gated kernel does not run, the one GEMM runs as a site of its own
    plain, = site.projections
    assert plain.node is site.node and plain.expr.n == 80


def test_what_is_not_a_gated_pair_over_one_weight_stays_a_gemm():
    x = torch.randn(5, 1, 48)
    for model in (FusedMLP(leak=True), FusedUneven(), NoActivation(), PerHead(), Broadcast()):
        kinds = [type(s).__name__ for s in found(model, x)]
        assert kinds == ["Match"], type(model).__name__


class FusedUneven(nn.Module):
    """Parts of different widths: no pair of products."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(48, 72, bias=False)

    def forward(self, x):
        gate, up = self.proj(x).split([40, 32], dim=-1)
        return F.silu(gate)[..., :32] * up


class NoActivation(FusedMLP):
    def forward(self, x):
        gate, up = self.proj(x).chunk(2, dim=-1)
        return gate * up


class Broadcast(FusedMLP):
    """Each row's gate times every row's up: no elementwise product."""

    def forward(self, x):
        gate, up = self.proj(x.view(-1, 48)).chunk(2, dim=-1)
        return F.silu(gate).view(-1, 1, 40) * up


class PerHead(FusedMLP):
    """Halves of each head's columns (GPT-NeoX's interleaving): no column ranges of the weight."""

    def forward(self, x):
        gate, up = self.proj(x).view(*x.shape[:-1], 4, 20).chunk(2, dim=-1)
        return F.silu(gate) * up


@pytest.mark.parametrize("trans_b", [True, False], ids=["[2N, K]", "[K, 2N]"])
def test_the_gated_kernel_reads_its_weights_as_row_ranges_of_one_weight(trans_b):
    expr = Gated(7, 24, 40, dtype="fp32", allow_tf32=False, trans_b=trans_b, bias=True)
    w, b = torch.randn(48, 40) if trans_b else torch.randn(40, 48), torch.randn(48)
    w1, w2 = (w[:24], w[24:]) if trans_b else (w[:, :24], w[:, 24:])
    x, out = torch.randn(7, 40), torch.empty(7, 24)
    args = (x, w1, w2, out, b[:24], b[24:])
    GATED.kernel(expr, SMALL, launch.problem_of(expr, *args))(*args)
    assert rel_error(out, GATED.reference(expr, args)) <= 1e-5


@pytest.fixture
def gated_operands(monkeypatch):
    """The weights and biases each gated site was called with."""
    seen = []
    original = sites.GatedSite.__call__

    def recording(self, x, w1, w2, b1, b2, norm=None):
        seen.append((w1, w2, b1, b2))
        return original(self, x, w1, w2, b1, b2, norm)
    monkeypatch.setattr(sites.GatedSite, "__call__", recording)
    return seen


@pytest.mark.parametrize("bias,fallback", [(False, "eager"), (True, "inductor")])
def test_a_compiled_gate_up_projection_runs_the_gated_kernel_on_views_of_its_weight(tmp_path, gated_operands,
                                                                                   bias, fallback):
    torch.manual_seed(0)
    model, x = FusedMLP(bias=bias, norm=True).eval(), torch.randn(3, 48)
    tasks = tritune.extract_tasks(model, (x,), allow_tf32=False)
    assert [t.expr.describe() for t in tasks] == [f"gated silu 3x40x48 fp32 rmsnorm{' +bias' * bias}"]
    # Inductor too passes the op the slices of the parameters as they are, not copies
    backend = tritune.compiler(store_every_task(tmp_path / "t.db", tasks), fallback=fallback)
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
        ref = model(x)
    assert rel_error(y, ref.double()) < 1e-5 and [k for _, k in backend.sites] == ["tuned"]
    (w1, w2, b1, b2), = gated_operands
    weight = model.proj.weight  # [80, 48]: the gate's rows, then up's; the kernel's operands are its [K, N] views
    assert w1.data_ptr() == weight.data_ptr() and w2.data_ptr() == weight[40:].data_ptr()
    assert w1.t().stride() == w2.t().stride() == weight.stride()
    if bias:
        assert b1.data_ptr() == model.proj.bias.data_ptr() and b2.data_ptr() == model.proj.bias[40:].data_ptr()


def small_phi3() -> nn.Module:
    torch.manual_seed(0)
    return zoo.phi3(hidden=H, layers=1).eval()


def test_phi3_is_the_architecture_it_names():
    layer = small_phi3().model.model.layers[0]
    assert layer.self_attn.qkv_proj.out_features == H + 2 * (H // 4) and layer.self_attn.qkv_proj.bias is None
    assert layer.mlp.gate_up_proj.out_features == 2 * INTER and layer.mlp.down_proj.in_features == INTER


def phi3_sites() -> list:
    """The sites of a one-layer Phi-3's decode graph (2 sequences, 1 token each)."""
    return graph.find(graph.aten_graph(small_phi3(), (torch.randn(2, 1, H),)), allow_tf32=False)


def test_phi3_decode_sites_are_one_qkv_gemm_attention_and_one_gated_mlp():
    found_ = phi3_sites()
    assert [type(s).__name__ for s in found_] == ["Match", "AttentionMatch", "Match", "GatedMatch", "Match", "Match"]
    qkv, _, o, mlp, down, head = found_
    eps = small_phi3().model.config.rms_norm_eps
    # q, k and v: one GEMM, the layer's norm in its prologue
    assert (qkv.expr.n, qkv.expr.k, qkv.expr.epilogue, qkv.expr.norm_eps) == (H + 2 * (H // 4), H, (), eps)
    # gate and up: one gated site over the two row ranges of gate_up_proj, the norm in its prologue
    assert mlp.expr == Gated(2, INTER, H, "fp32", "silu", allow_tf32=False, norm_eps=eps) and mlp.columns == (0, INTER)
    assert head.expr.norm_eps == eps and o.norm is None and down.norm is None


def test_phi3s_attention_reads_q_k_v_as_slices_of_the_qkv_gemm_before_their_rotation():
    qkv, attention = phi3_sites()[:2]
    assert qkv.expr.n == H + 2 * (H // 4) and isinstance(attention, AttentionMatch)
    # transformers folds the 4 query heads of each key/value head into its query rows
    assert (attention.expr.heads, attention.expr.lq, attention.expr.lk) == (4, 4, 1)
    # Phi-3 writes its whole-head rotation as a partial one (the pass-through lanes empty): both
    # rotations go into the kernel, which reads q and k before them
    assert attention.expr.rope_q == attention.expr.rope_k == 4
    for operand in (attention.q, attention.k, attention.v):
        assert _sliced_from(operand) is qkv.node


def _sliced_from(node):
    """The node reached going back from `node` through views and slices."""
    while node.op == "call_function" and node.target in (*graph.ALIASES, torch.ops.aten._unsafe_view.default):
        node = node.args[0]
    return node


@pytest.fixture
def attention_operands(monkeypatch):
    """The q, k and v each attention site was called with."""
    seen = []
    original = sites.AttentionSite.__call__

    def recording(self, q, k, v, *rest):
        seen.append((q, k, v))
        return original(self, q, k, v, *rest)
    monkeypatch.setattr(sites.AttentionSite, "__call__", recording)
    return seen


@pytest.mark.system
def test_compiled_phi3_matches_eager_with_its_fused_projections_tuned(tmp_path, site_calls, gated_operands,
                                                                      attention_operands):
    model, x = small_phi3(), torch.randn(2, 1, H)
    tasks = tritune.extract_tasks(model, (x,), allow_tf32=False)
    head = tasks[-1]
    assert head.expr.n == 32064
    # the LM head is left untuned: under the interpreter its kernel alone takes seconds
    backend = tritune.compiler(store_every_task(tmp_path / "t.db", tasks[:-1]), fallback="eager")
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
        ref = model(x)
    assert rel_error(y, ref.double()) < 1e-5
    assert [k for _, k in backend.sites] == ["tuned"] * 5 + ["miss"] and len(site_calls) == 5
    assert any(d.startswith("gated silu") for d in site_calls)
    (w1, w2, _, _), = gated_operands
    weight = model.model.model.layers[0].mlp.gate_up_proj.weight
    assert w1.data_ptr() == weight.data_ptr() and w2.data_ptr() == weight[INTER:].data_ptr()
    (q, k, v), = attention_operands  # views of the q/k/v GEMM's one output: nothing copied
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()


def tiny_phi3() -> nn.Module:
    """The zoo's Phi-3 at a small width (a factory generate()'s decode step is captured from)."""
    return zoo.phi3(hidden=H, layers=1)


def test_phi3s_decode_step_under_generate_with_a_static_cache_has_the_same_sites():
    from tritune.tuner.model.subject import subject_tasks

    tasks = subject_tasks(f"{__file__}:tiny_phi3", (), "fp32", "cpu", decode="2,5,4")
    assert [t.expr.op for t in tasks] == ["matmul", "attention", "matmul", "gated", "matmul", "matmul"]
    qkv, attention, _, mlp, _, _ = (t.expr for t in tasks)
    assert qkv.n == H + 2 * (H // 4) and qkv.norm_eps and mlp.n == INTER and mlp.norm_eps
    # k is rotated before the cache update writes it: the kernel rotates q alone, reading it from
    # the q/k/v GEMM's output, and reads keys and values from the cache
    assert (attention.rope_q, attention.rope_k, attention.group) == (4, 0, 4)
