"""The attention site: torch's SDPA in each of its ATen forms found by its signature (and left alone
where a kernel of few query rows does not compute it), extracted as tasks from the zoo's decoders at
decode shape (none at prefill), and replayed by the backend on CPU (interpreter kernels) matching
eager; a call whose operands were not tuned runs torch; the replayed kernel builds for sm_90."""
import copy
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import real_jit
import tritune
from test_codegen_sm90 import build_sm90

from tritune.kernels.attention.expr import Attention
from tritune.kernels.device import device_info
from tritune.kernels.family import device_key, family
from tritune.kernels.backend import graph, sites, tuned_op
from tritune.kernels.backend.attention_match import AttentionMatch
from tritune.kernels.backend.compiler import rewrite
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner.model import zoo

A = torch.ops.aten
H = 64  # hidden: 16 heads of 4
CONFIG = Config.of(BLOCK_N=16, DOT=0, num_warps=2, num_stages=1)
MMA = Config.of(BLOCK_N=16, DOT=1, num_warps=4, num_stages=2)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def attention_calls(monkeypatch):
    calls = []
    original = tuned_op.AttentionSite.__call__

    def counting(self, *args):
        calls.append(self.expr.describe())
        return original(self, *args)
    monkeypatch.setattr(tuned_op.AttentionSite, "__call__", counting)
    return calls


def store(path, exprs, config=CONFIG):
    db = Database(path)
    for expr in exprs:
        db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        db.save(expr.key, device_key(device_info(), expr.op), [MeasureResult(config, Status.OK, 1.0, 1.0, 1.0, 1.0)])
    db.close()
    return path


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def efficient(q, k, v, m):  # as torch's CUDA dispatch calls it: the mask padded, sliced back, expanded
    bias = A.constant_pad_nd(m, [0, 7])[..., :m.shape[-1]].expand(*q.shape[:3], k.shape[2])
    return A._scaled_dot_product_efficient_attention(q, k, v, bias, False, scale=0.3)[0]


VARIANTS = {
    "efficient": (efficient, dict(scale=0.3)),
    "flash": (lambda q, k, v, m: A._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0], dict(is_causal=True)),
    "cudnn": (lambda q, k, v, m: A._scaled_dot_product_cudnn_attention(q, k, v, m, False)[0], dict(mask=True)),
    "cpu": (lambda q, k, v, m: A._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)[0],
            dict(mask=True)),
    "overrideable": (lambda q, k, v, m: A._scaled_dot_product_fused_attention_overrideable(q, k, v, m)[0],
                     dict(mask=True)),
}


def operands(dtype=torch.float16, lq=3, lk=37):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, lq, 16), torch.randn(2, 3, lk, 16), torch.randn(2, 3, lk, 16)
    mask = torch.randn(2, 1, 1, lk).masked_fill(torch.rand(2, 1, 1, lk) < 0.2, float("-inf"))
    mask[..., 0] = 0
    return [t.to(dtype) for t in (q, k, v, mask)]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_sdpa_form_is_found_by_its_signature_and_replayed(name):
    fn, semantics = VARIANTS[name]
    args = operands()
    gm = graph.aten_graph(fn, args)
    site, = graph.find(gm)
    assert isinstance(site, AttentionMatch) and (site.expr.lq, site.expr.lk, site.expr.d) == (3, 37, 16)
    assert site.expr.causal == semantics.get("is_causal", False)
    assert site.expr.scale == semantics.get("scale", 0.25)
    with_mask = "scale" in semantics or semantics.get("mask")
    # the kernel reads the mask as the model made it: no padded, sliced, expanded copy
    assert (site.mask is not None and site.mask.op == "placeholder") if with_mask else site.mask is None
    assert site.expr.mask_dims == ("bk" if with_mask else "")
    rewrite(gm, [(site, tuned_op.spec_of(site.expr, MMA))])
    assert not any("scaled_dot_product" in str(n.target) for n in gm.graph.nodes)
    q, k, v, m = args
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=site.expr.causal,
                                         attn_mask=m.double() if with_mask else None, scale=site.expr.scale)
    assert rel(gm(*args), ref) <= 2e-3


def test_what_the_kernel_does_not_compute_stays_torchs():
    q, k, v, m = operands()
    cases = {
        "dropout": lambda q, k, v, m: A._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.1, attn_mask=m)[0],
        "log-sum-exp read": lambda q, k, v, m: A._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)[1],
        "a mask and is_causal": lambda q, k, v, m: A._scaled_dot_product_efficient_attention(q, k, v, m, False,
                                                                                            is_causal=True)[0],
    }
    for why, fn in cases.items():
        assert graph.find(graph.aten_graph(fn, (q, k, v, m))) == [], why
    cpu = VARIANTS["cpu"][0]
    assert graph.find(graph.aten_graph(cpu, operands(lq=65))) == []  # prefill
    assert graph.find(graph.aten_graph(cpu, operands(lq=64)))  # the most rows a kernel takes


def small(name):
    torch.manual_seed(0)
    return getattr(zoo, name)(hidden=H, layers=2).eval()


@pytest.mark.parametrize("name", ["llama", "gpt2", "neox"])
@pytest.mark.system
def test_zoo_decoders_have_two_attention_sites_at_decode_and_none_at_prefill(name):
    model = small(name)
    decode = [s for s in graph.find(graph.aten_graph(model, (torch.randn(16, 1, H),))) if isinstance(s, AttentionMatch)]
    assert len(decode) == 2 and all(s.expr.lk == 1 and s.expr.mask == "fp32" for s in decode)
    if name == "llama":  # rotary embeddings on whole heads, four query heads per key/value head
        assert all(s.expr.rope_q == s.expr.rope_k == 4 and s.expr.heads * s.expr.lq == 16 for s in decode)
    tasks = [t for t in tritune.extract_tasks(model, (torch.randn(16, 1, H),)) if t.expr.op == "attention"]
    assert [t.count for t in tasks] == [2] and tasks[0].expr.batch == 16
    assert not any(t.expr.op == "attention" for t in tritune.extract_tasks(model, (torch.randn(1, 80, H),)))


@pytest.mark.parametrize("name", ["llama", "gpt2", "neox"])
@pytest.mark.system
def test_the_backend_replays_the_zoo_decoders_attention(tmp_path, attention_calls, name):
    model, x = small(name), torch.randn(16, 1, H)
    tasks = [t.expr for t in tritune.extract_tasks(model, (x,)) if t.expr.op == "attention"]
    backend = tritune.compiler(store(tmp_path / "t.db", tasks), fallback="eager")
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
        ref = model(x)
    assert rel(y, ref) < 1e-5
    assert Counter(s for _, s in backend.sites)["tuned"] == 2 and len(attention_calls) == 2


class Speculative(nn.Module):
    """A few new tokens per sequence attending to a cache of keys (prefilled elsewhere), with a
    mask per sequence (or per head) and token."""

    def __init__(self, heads=4, d=16):
        super().__init__()
        self.heads, self.d = heads, d
        self.q, self.out = nn.Linear(heads * d, heads * d), nn.Linear(heads * d, heads * d)

    def forward(self, x, k, v, mask):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(o.transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("mask_shape", [(3, 1, 5, 37), (1, 4, 5, 37), (5, 37)], ids=["per-sequence", "per-head", "2-D"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_backend_replays_attention_over_many_keys(tmp_path, attention_calls, mask_shape, dtype):
    model = Speculative().to(dtype)
    x, k, v = torch.randn(3, 5, 64, dtype=dtype), torch.randn(3, 4, 37, 16, dtype=dtype), torch.randn(3, 4, 37, 16,
                                                                                                      dtype=dtype)
    mask = torch.randn(mask_shape).to(dtype)
    args = (x, k, v, mask)
    tasks = [t.expr for t in tritune.extract_tasks(model, args) if t.expr.op == "attention"]
    assert len(tasks) == 1 and (tasks[0].lq, tasks[0].lk) == (5, 37)
    backend = tritune.compiler(store(tmp_path / "t.db", tasks, MMA), fallback="eager")
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(*args)
        ref = copy.deepcopy(model).double()(*(a.double() for a in args))
    assert rel(y, ref) <= (2e-3 if dtype == torch.float16 else 1e-5) and len(attention_calls) == 1


def test_a_call_the_kernel_was_not_tuned_for_runs_torch_in_the_traced_layout(monkeypatch):
    launched = []
    original = sites.wrap_triton
    monkeypatch.setattr(sites, "wrap_triton", lambda fn: launched.append(1) or original(fn))
    expr = Attention(2, 3, 3, 37, 16, mask="fp16", mask_dims="bk", out_order="bqhd")
    spec = tuned_op.spec_of(expr, CONFIG)
    q, k, v, m = operands()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m.double())
    for mask in (m, m.expand(2, 3, 3, 37).contiguous(), m.float()):  # tuned; varying along more dims; fp32
        out = tuned_op.ATTENTION_OP(q, k, v, mask, spec)
        assert rel(out, ref) <= 2e-3 and out.stride() == (144, 16, 48, 1)  # [B, Lq, H, D] in memory
    assert launched == [1]


@pytest.mark.system
def test_the_replayed_kernel_builds_for_sm90():
    cases = [(Attention(16, 4, 4, 1, 128, mask="fp16", mask_dims="b"), CONFIG),
             (Attention(16, 16, 1, 1024, 128, "bf16", out_order="bqhd"), MMA.replace(BLOCK_N=64, num_stages=3)),
             (Attention(1, 16, 4, 4096, 64, mask="bool", mask_dims="bqk"), MMA.replace(SPLIT=8)),
             (Attention(16, 16, 1, 1, 128, mask="fp16", mask_dims="b", group=4, rope_q=128, rope_k=128), MMA),
             (Attention(16, 16, 1, 1, 64, group=4, rope_q=16), MMA.replace(SPLIT=2)),
             (Attention(16, 16, 1, 1, 128, "bf16", mask="bf16", mask_dims="b", group=4, rope_q=128, rope_k=128,
                        rope_pos="i64", rope_freq="fp32"), CONFIG)]  # the tables computed from positions
    results = build_sm90(cases, replay=True)
    # no mask, no table, no split: None for their pointers (specialised away, nothing passed per launch)
    tables = ["CosQ", "SinQ", "CosK", "SinK"]
    assert [r["nones"] for r in results] == [[*tables, "WS", "LOCKS"], ["Mask", *tables, "WS", "LOCKS"], tables,
                                             ["WS", "LOCKS"], ["Mask", "CosK", "SinK"], ["WS", "LOCKS"]]


ROUTE = """
from tritune.kernels.attention.expr import Attention

config = Config.of(BLOCK_N=64, DOT=1, num_warps=4, num_stages=3)
with FakeTensorMode():  # CUDA tensors that need no GPU
    q = torch.empty(16, 4, 4, 128, dtype=torch.float16, device="cuda")
    k = torch.empty(16, 4, 1024, 128, dtype=torch.float16, device="cuda")
    mask = torch.empty(16, 1, 1, 1024, dtype=torch.float16, device="cuda")
for m, expr, split in ((mask, Attention(16, 4, 4, 1024, 128, mask="fp16", mask_dims="bk", out_order="bqhd"), 1),
                       (None, Attention(16, 4, 4, 1024, 128), 1), (mask, Attention(16, 4, 4, 1024, 128, mask="fp16",
                                                                                     mask_dims="bk"), 4)):
    spec = tuned_op.spec_of(expr, config.replace(SPLIT=split))
    f = dispatch_functionalize(lambda q, k, v, m: torch.ops.tritune.attention(q, k, v, m, spec))
    print(make_fx(f)(q, k, k, m).code)
"""


@pytest.mark.system
def test_a_compiled_graph_launches_the_attention_kernel_itself(tmp_path):
    """What AOT autograd hands Inductor holds the kernel's launch, writing only its output, the
    sizes and strides as constants, None for an absent mask. Real JIT functions, fake CUDA tensors."""
    masked, plain, split = real_jit.run(ROUTE, tmp_path).split("def forward")[1:]
    for code in (masked, plain):
        assert code.count("triton_kernel_wrapper_functional(") == 1 and "tensors_to_clone = ['Out']" in code
        assert "'LK': 1024" in code and "'DOT': 1" in code and "scaled_dot_product" not in code
    assert "'stride_mb': 1024, 'stride_mh': 0, 'stride_mq': 0, 'stride_mk': 1" in masked
    assert "new_empty.default(arg0_1, [16, 4, 4, 128]" in masked and "permute" in masked  # [B, Lq, H, D] in memory
    assert "'Mask'" not in plain and "'MASK': 0" in plain and "permute" not in plain
    assert "'WS'" not in masked + plain and "new_zeros" not in masked + plain  # unsplit: no scratch
    # split over 4 programs a head: the grid's second axis, its scratch and zeroed counters
    assert "grid = [(64, 4, 1)]" in split and "tensors_to_clone = ['Out', 'WS', 'LOCKS']" in split
    assert "new_zeros" in split and "'SPLIT': 4" in split


def rotate_half(x, sign=1):
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([-second, first], -1) if sign > 0 else torch.cat([second, -first], -1)


class Grouped(nn.Module):
    """Decode attention as Llama writes it for SDPA with a mask: q and k rotated (on `lanes` lanes,
    NeoX-style when fewer than the head's), k and v repeated over `group` query heads each."""

    def __init__(self, heads=8, group=4, d=16, lanes=16, sign=1):
        super().__init__()
        self.heads, self.group, self.d, self.lanes, self.sign = heads, group, d, lanes, sign
        self.q = nn.Linear(64, heads * d)
        self.kv = nn.Linear(64, 2 * heads // group * d)

    def rotated(self, x, cos, sin):
        part, rest = x[..., :self.lanes], x[..., self.lanes:]
        part = part * cos + rotate_half(part, self.sign) * sin
        return part if self.lanes == self.d else torch.cat([part, rest], -1)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2 * self.heads // self.group, self.d).transpose(1, 2).chunk(2, 1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = self.rotated(q, cos, sin), self.rotated(k, cos, sin)
        k, v = (y[:, :, None].expand(b, y.shape[1], self.group, t, self.d).reshape(b, self.heads, t, self.d)
                for y in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, -1)


def grouped_args(lanes=16, batch=3, tokens=2):
    torch.manual_seed(1)
    angles = torch.randn(batch, tokens, lanes)  # a position per sequence and token
    return torch.randn(batch, tokens, 64), angles.cos(), angles.sin(), torch.randn(batch, 1, tokens, tokens)


@pytest.mark.parametrize("lanes", [16, 4], ids=["whole heads", "a quarter of each head"])
def test_rotary_embeddings_and_the_kv_repeat_run_in_the_attention_kernel(tmp_path, attention_calls, lanes):
    model, args = Grouped(lanes=lanes).eval(), grouped_args(lanes)
    gm = graph.aten_graph(model, args)
    site, = [s for s in graph.find(gm) if isinstance(s, AttentionMatch)]
    e = site.expr
    assert (e.heads, e.group, e.lq, e.rope_q, e.rope_k, e.rope_dims) == (8, 4, 2, lanes, lanes, "bn")
    rewrite(gm, [(site, tuned_op.spec_of(e, CONFIG))])
    gm.graph.eliminate_dead_code()
    left = Counter(str(n.target) for n in gm.graph.nodes)
    assert not any(op in left for op in ("aten.neg.default", "aten.cat.default", "aten.expand.default"))
    ref = copy.deepcopy(model).double()(*(a.double() for a in args))
    assert rel(gm(*args), ref) <= 1e-5
    tasks = [t.expr for t in tritune.extract_tasks(model.float(), args) if t.expr.op == "attention"]
    backend = tritune.compiler(store(tmp_path / "t.db", tasks), fallback="eager")
    attention_calls.clear()  # the rewritten graph's call above
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(*args)
    assert rel(y, ref) <= 1e-5 and len(attention_calls) == 1


def test_what_is_not_a_rotation_or_a_repeat_stays_in_the_graph():
    model, args = Grouped(sign=-1).eval(), grouped_args()  # halves swapped with the wrong sign: not rotary
    gm = graph.aten_graph(model, args)
    site, = [s for s in graph.find(gm) if isinstance(s, AttentionMatch)]
    assert (site.expr.group, site.expr.rope_q, site.expr.rope_k) == (4, 0, 0)
    rewrite(gm, [(site, tuned_op.spec_of(site.expr, CONFIG))])
    assert rel(gm(*args), copy.deepcopy(model).double()(*(a.double() for a in args))) <= 1e-5


def test_torchs_own_grouped_query_attention_is_one_site():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.manual_seed(0)
    args = (torch.randn(2, 6, 1, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16))
    gm = graph.aten_graph(fn, args)
    site, = [s for s in graph.find(gm) if isinstance(s, AttentionMatch)]
    assert site.expr.group == 3 and site.expr.lq == 1
    rewrite(gm, [(site, tuned_op.spec_of(site.expr, CONFIG))])
    ref = fn(*(a.double() for a in args))
    assert rel(gm(*args), ref) <= 1e-5


def test_a_call_whose_tables_were_not_tuned_runs_torch(monkeypatch):
    launched = []
    original = sites.wrap_triton
    monkeypatch.setattr(sites, "wrap_triton", lambda fn: launched.append(1) or original(fn))
    expr = Attention(3, 8, 2, 2, 16, "fp32", group=4, rope_q=16, rope_k=16, rope_dims="bn")
    spec, fam = tuned_op.spec_of(expr, CONFIG), family("attention")
    args = fam.inputs(expr, 0, "cpu").args
    q, k, v, out, mask, *tables = args
    assert rel(tuned_op.ATTENTION_OP(q, k, v, mask, spec, *tables), fam.reference(expr, args)) <= 1e-5
    per_head = [t.expand(3, 8, 2, 16).contiguous() for t in tables[:2]]  # q's tables varying by head
    ref = fam.reference(expr, (q, k, v, out, mask, *per_head, *tables[2:]))
    assert rel(tuned_op.ATTENTION_OP(q, k, v, mask, spec, *per_head, *tables[2:]), ref) <= 1e-5
    assert launched == [1]
