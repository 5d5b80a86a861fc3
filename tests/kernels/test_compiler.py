"""tritune.compiler: the backend's graph rewrite on CPU (interpreter kernels) matches eager; misses fall back."""
import logging
from collections import Counter

import pytest
import torch
from torch import nn

import real_jit
import tritune
from models import Awkward, awkward_inputs
from tritune.kernels.backend import ops, sites, tuned_op
from tritune.kernels.device import device_info
from tritune.kernels.family import device_key
from tritune.kernels.backend.ops import contraction_expr
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config

FAST = Config.of(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=1, num_warps=2, num_stages=2, UNROLL=1)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # compiled code is cached per function: each test compiles anew
    yield
    torch._dynamo.reset()


def store(path, exprs, config=FAST):
    db = Database(path)
    for expr in exprs:
        db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        db.save(expr.key, device_key(device_info(), "matmul"), [MeasureResult(config, Status.OK, 1.0, 1.0, 1.0, 1.0)])
    db.close()
    return path


def rel_errors(outs, refs):
    return [((o.double() - r.double()).norm() / r.double().norm()).item() for o, r in zip(outs, refs)]


@pytest.fixture
def tuned_calls(monkeypatch):
    calls = []
    original = tuned_op.Site.__call__

    def counting(self, *args):
        calls.append(self.expr.describe())
        return original(self, *args)
    monkeypatch.setattr(tuned_op.Site, "__call__", counting)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rewrite_runs_tuned_kernels_and_matches_eager(tmp_path, tuned_calls, dtype):
    model, inputs = Awkward().to(dtype), awkward_inputs(dtype)
    tasks = tritune.extract_tasks(model, inputs)
    db = store(tmp_path / "t.db", [t.expr for t in tasks[:-1]])  # the baddbmm workload stays untuned
    backend = tritune.compiler(db, fallback="eager")
    with torch.no_grad():
        outs = torch.compile(model, backend=backend, fullgraph=True)(*inputs)
        refs = model(*inputs)
    assert max(rel_errors(outs, refs)) < TOLERANCE[dtype]
    # the backend looked up exactly the extracted workloads, and ran a kernel for each tuned one
    assert Counter(d for d, _ in backend.sites) == Counter({t.expr.describe(): t.count for t in tasks[:-2]}) + \
        Counter([tasks[-1].expr.describe()] * 2)
    assert [s for _, s in backend.sites].count("miss") == 1
    assert Counter(tuned_calls) == Counter(d for d, s in backend.sites if s == "tuned")


def test_misses_fall_back_and_are_logged_once(tmp_path, caplog, tuned_calls):
    model, x = nn.Linear(23, 19), torch.randn(17, 23)
    backend = tritune.compiler(store(tmp_path / "t.db", []), fallback="eager")
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        for _ in range(2):
            torch._dynamo.reset()
            y = torch.compile(model, backend=backend)(x)
    assert [r.getMessage() for r in caplog.records] == [
        "tritune: no tuned record on triton-interpreter for 1 of 1 contractions, left to the fallback: "
        "matmul 17x19x23 fp32 NT+bias"]
    assert tuned_calls == [] and backend.sites == [("matmul 17x19x23 fp32 NT+bias", "miss")] * 2
    assert torch.allclose(y, model(x))


def test_grad_mode_leaves_the_graph_to_the_fallback(tmp_path, caplog, tuned_calls):
    model, x = nn.Linear(23, 21), torch.randn(17, 23)
    expr = tritune.extract_tasks(model, (x,))[0].expr
    backend = tritune.compiler(store(tmp_path / "t.db", [expr]), fallback="eager")
    with caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        y = torch.compile(model, backend=backend)(x)
    assert y.requires_grad and tuned_calls == [] and backend.sites == []
    assert "no backward" in caplog.text


def test_inductor_compiles_the_rest(tmp_path, tuned_calls):
    from torch._inductor.utils import run_and_get_code

    model = nn.Sequential(nn.Linear(29, 47), nn.GELU(), nn.Linear(47, 13))
    x = torch.randn(33, 29)
    first = tritune.extract_tasks(model, (x,))[0].expr  # only the first layer is tuned
    compiled = torch.compile(model, backend=tritune.compiler(store(tmp_path / "t.db", [first])))
    # a graph loaded from Inductor's cache shows no generated code
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        y, code = run_and_get_code(compiled, x)
        ref = model(x)
    assert rel_errors([y], [ref])[0] < 1e-5
    assert tuned_calls == [first.describe()]
    assert "torch.ops.tritune.matmul.default" in code[0] and "extern_kernels.addmm" in code[0]


def test_a_call_site_runs_its_kernel_only_on_the_layout_it_was_tuned_for(monkeypatch, caplog):
    a, b = torch.randn(33, 29), torch.randn(29, 47)
    spec = tuned_op.spec_of(contraction_expr(a, b, ()), FAST)
    launched = []
    original = sites.wrap_triton
    monkeypatch.setattr(sites, "wrap_triton", lambda fn: launched.append(1) or original(fn))
    assert torch.allclose(tuned_op.OP(a, b, None, [], spec), a @ b, atol=1e-5) and launched == [1]
    transposed = a.t().contiguous().t()  # the same values stored column-major: torch ops compute it
    with caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        for _ in range(2):
            assert torch.allclose(tuned_op.OP(transposed, b, None, [], spec), a @ b, atol=1e-5) and launched == [1]
    assert [r.getMessage() for r in caplog.records] == [
        "tritune: matmul 33x47x29 fp32 NN was tuned for other operand layouts, dtypes or alignment than this "
        "call's: it runs as torch ops"]


def test_operands_that_start_unaligned_run_as_torch_ops(monkeypatch):
    """A view starting 2 elements into its storage (8 bytes in fp32) is no operand the kernels were
    tuned and compiled for: each kind of site computes it with torch ops, and launches nothing."""
    from tritune.kernels.gated.expr import Gated
    from tritune.kernels.wide.expr import Wide

    launched = []
    original = sites.wrap_triton
    monkeypatch.setattr(sites, "wrap_triton", lambda fn: launched.append(1) or original(fn))
    x, w1, w2 = torch.randn(33, 29), torch.randn(47, 29), torch.randn(47, 29)
    shifted = torch.randn(33 * 29 + 2)[2:].view(33, 29)
    shifted.copy_(x)
    gated = tuned_op.spec_of(Gated(33, 47, 29, "fp32", "silu"), FAST.replace(FUSE=0))
    wide = tuned_op.spec_of(Wide(33, (47, 47), 29, "fp32"), FAST)
    matmul = tuned_op.spec_of(contraction_expr(x, w1.t(), ()), FAST)
    refs = [x @ w1.t(), torch.nn.functional.silu(x @ w1.t()) * (x @ w2.t()), [x @ w1.t(), x @ w2.t()]]
    for operands in ((x, w1.t(), w2.t()), (shifted, w1.t(), w2.t())):
        x_, w1_, w2_ = operands
        outs = [tuned_op.OP(x_, w1_, None, [], matmul), tuned_op.GATED_OP(x_, w1_, w2_, None, None, gated),
                tuned_op.WIDE_OP(x_, [w1_, w2_], [], wide)]
        assert all(torch.allclose(o, r, atol=1e-4) for o, r in zip([outs[0], outs[1], *outs[2]], [*refs[:2], *refs[2]]))
    assert launched == [1, 1, 1]  # the aligned operands only


def test_bad_database_is_reported_when_the_backend_is_made(tmp_path):
    from tritune.records.database import DatabaseError

    with pytest.raises(DatabaseError):
        tritune.compiler(tmp_path / "missing.db")


def test_a_kernel_that_cannot_be_loaded_is_left_to_the_fallback(tmp_path, caplog, monkeypatch, tuned_calls):
    model, x = nn.Linear(23, 11), torch.randn(17, 23)
    db = store(tmp_path / "t.db", [tritune.extract_tasks(model, (x,))[0].expr])

    def broken(spec):
        raise RuntimeError("template failed\nfull log")
    monkeypatch.setattr(tuned_op, "site", broken)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        y = torch.compile(model, backend=tritune.compiler(db, fallback="eager"))(x)
    assert tuned_calls == [] and torch.allclose(y, model(x))
    assert "matmul 17x11x23 fp32 NT+bias cannot be loaded (RuntimeError: template failed); left" in caplog.text


@pytest.mark.system
def test_the_backend_is_registered_by_name_and_replays_the_active_database(tmp_path, tuned_calls):
    assert "tritune" in torch._dynamo.list_backends(exclude_tags=())  # the package's entry point
    model, inputs = Awkward(), awkward_inputs(torch.float32)
    db = store(tmp_path / "t.db", [t.expr for t in tritune.extract_tasks(model, inputs)])
    with torch.no_grad(), tritune.apply_history_best(db):
        outs = torch.compile(model, backend="tritune")(*inputs)
        refs = model(*inputs)
    assert max(rel_errors(outs, refs)) < TOLERANCE[torch.float32]
    assert tuned_calls  # the registered name ran tuned kernels, not just Inductor


ROUTE = """
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Gelu

config = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3, UNROLL=1, SPLIT_K=2)
spec = tuned_op.spec_of(Matmul(96, 80, 64, dtype="fp16", trans_b=True, epilogue=(BiasAdd(), Gelu("tanh"))), config)
with FakeTensorMode():  # CUDA tensors that need no GPU
    a = torch.empty(96, 64, dtype=torch.float16, device="cuda")
    b = torch.empty(80, 64, dtype=torch.float16, device="cuda").t()
    bias = torch.empty(80, dtype=torch.float16, device="cuda")
    moved = torch.empty(64, 96, dtype=torch.float16, device="cuda").t()  # A stored transposed: not tuned
unsplit = tuned_op.spec_of(Matmul(96, 80, 64, dtype="fp16", trans_b=True, epilogue=(BiasAdd(), Gelu("tanh"))),
                          config.replace(SPLIT_K=1))
for x, s in ((a, spec), (moved, spec), (a, unsplit)):
    f = dispatch_functionalize(lambda a, b, bias: torch.ops.tritune.matmul(a, b, bias, [], s))
    print(make_fx(f)(x, b, bias).code)

# a model's graph rewritten by the backend: a gated pair, then a contraction with two extra inputs
import torch.nn.functional as F
from tritune.kernels.backend import graph
from tritune.kernels.backend.compiler import rewrite


def mlp(x, wg, wu, wd, rows):  # Llama's MLP, its residual, a scale per row (weights as AOT lifts them)
    return (x + F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)) * rows


with FakeTensorMode() as mode:
    shapes = ((2, 40, 96), (160, 96), (160, 96), (96, 160), (2, 40, 1))
    args = [torch.empty(s, dtype=torch.float16, device="cuda") for s in shapes]
aten = graph.aten_graph(mlp, args, mode)
sites = graph.find(aten)
rewrite(aten, [(s, tuned_op.spec_of(s.expr, config.replace(SPLIT_K=1, FUSE=1) if s.expr.op == "gated" else config))
               for s in sites])
with mode:
    print(make_fx(dispatch_functionalize(aten))(*args).code)


def qkv(x, wq, wk, wv, bq, bk, bv):  # attention's projections of one input, with biases
    return F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)


from tritune.kernels.wide.launch import DEFAULT
with FakeTensorMode() as mode:
    shapes = ((40, 96), (96, 96), (32, 96), (32, 96), (96,), (32,), (32,))
    args = [torch.empty(s, dtype=torch.float16, device="cuda") for s in shapes]
aten = graph.aten_graph(qkv, args, mode)
rewrite(aten, [(s, tuned_op.spec_of(s.expr, DEFAULT)) for s in graph.find(aten)])
with mode:
    print(make_fx(dispatch_functionalize(aten))(*args).code)
"""


@pytest.mark.system
def test_compiled_graphs_launch_the_tuned_kernel_itself(tmp_path):
    """What AOT autograd hands Inductor (functionalised ATen) holds the tuned Triton kernel's launch,
    with the config's parameters and the operands' strides, and the split-K scratch as buffers; on
    a layout that was not tuned, torch ops; in a rewritten model, the gated kernel and the extra
    epilogue inputs; q/k/v projections as one wide launch. Real JIT functions (no interpreter), fake
    CUDA tensors."""
    tuned, untuned, unsplit, model, qkv = real_jit.run(ROUTE, tmp_path).split("def forward")[1:]
    assert "triton_kernel_wrapper_functional" in tuned and "'SPLIT_K': 2" in tuned and "'BLOCK_M': 64" in tuned
    assert "'stride_bk': 1, 'stride_bn': 64" in tuned and "new_zeros" in tuned  # B transposed; split-K counters
    assert "triton_kernel_wrapper" not in untuned and "aten.mm" in untuned
    # without split-K: None for its scratch, a constant (no allocation, no pointer to pass per launch)
    assert "triton_kernel_wrapper_functional" in unsplit and "new_zeros" not in unsplit
    assert unsplit.count("aten.new_empty") == 1 and "'WS'" not in unsplit
    # the kernels' TTIR says what they write: the outputs (and split-K's scratch), never an input
    # (Inductor would copy it on every call otherwise)
    assert "tensors_to_clone = ['C', 'WS', 'LOCKS']" in tuned and "tensors_to_clone = ['C']" in unsplit
    # the model: the gated kernel on x and both weights ([N, K] as stored), then the down projection's
    # kernel reading the residual [80, 96] and one scale per row [80] after its scratch; no mm left
    gated, down = model.split("triton_kernel_wrapper_functional(")[1:3]
    assert "tensors_to_clone = ['C']" in gated and "'FUSE': 1" in gated and "'M': 80, 'N': 160, 'K': 96" in gated and "'stride_wk': 1, 'stride_wn': 96" in gated
    assert "'E0': " in down and "'stride_e0b': 0, 'stride_e0m': 96, 'stride_e0n': 1, 'stride_e1m': 1" in down
    assert "aten.mm" not in model and "silu" not in model and "aten.mul" not in model
    # q/k/v: one launch of the wide kernel (a triton_op returning a list) writing three outputs
    assert qkv.count("triton_kernel_wrapper_functional(") == 1 and "addmm" not in qkv
    assert "tensors_to_clone = ['C0', 'C1', 'C2']" in qkv and "'END0': 2, 'END1': 3, 'END2': 4" in qkv


def test_a_site_where_the_library_won_is_left_to_the_fallback(tmp_path, tuned_calls):
    model, x = nn.Linear(23, 19), torch.randn(17, 23)
    expr = tritune.extract_tasks(model, (x,))[0].expr
    db = Database(tmp_path / "t.db")
    db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
    db.save(expr.key, device_key(device_info(), "matmul"), [MeasureResult(FAST, Status.OK, 1.0, 1.0, 1.0, 1.0),
                                                          MeasureResult(Config.of(library="addmm"), Status.OK, *[0.9] * 4)])
    db.close()
    backend = tritune.compiler(tmp_path / "t.db", fallback="eager")
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
        assert torch.allclose(y, model(x))
        with tritune.apply_history_best(tmp_path / "t.db"):  # the call-time op runs the library too
            y = ops.matmul(x, model.weight.t(), model.bias, allow_tf32=expr.allow_tf32)
            choice = next(e.choice for e in ops._entries.values() if e.choice.expr.key == expr.key)
            assert choice.source == "tuned" and choice.config == Config.of(library="addmm")
            assert torch.allclose(y, model(x), atol=1e-5)
    assert backend.sites == [("matmul 17x19x23 fp32 NT+bias", "library")] and tuned_calls == []


def test_modes_and_fallbacks_are_checked_when_the_backend_is_made(tmp_path):
    db = store(tmp_path / "t.db", [])
    assert callable(tritune.compiler(db, mode="reduce-overhead").fallback)
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        tritune.compiler(db, mode="fastest")
    with pytest.raises(ValueError, match="unknown fallback 'nope'"):
        tritune.compiler(db, fallback="nope")


def test_the_rewritten_graph_keeps_what_dynamo_knew_of_its_inputs(tmp_path):
    """AOT autograd finds the parameters among the inputs (CUDA graphs keep them in place) only in
    graphs that carry Dynamo's facts: the rewrite passes them on."""
    model, x = nn.Linear(23, 19), torch.randn(17, 23)
    db = store(tmp_path / "t.db", [tritune.extract_tasks(model, (x,))[0].expr])
    seen = []
    with torch.no_grad():
        torch.compile(model, backend=tritune.compiler(db, fallback=lambda gm, xs: seen.append(gm) or gm.forward),
                      fullgraph=True)(x)
    (gm,) = seen
    placeholders = gm.graph.find_nodes(op="placeholder")
    assert "tritune.matmul" in gm.code and "dynamo_compile_id" in gm.meta
    assert all(p._dynamo_source is not None for p in placeholders)
    static = [p for p in placeholders if p.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")]
    assert len(static) == 2  # weight and bias; x is not


def test_inductor_is_asked_to_launch_tuned_kernels_as_its_own(monkeypatch):
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as config

    from tritune.kernels.backend.compiler import inductor

    seen = []
    monkeypatch.setattr(compile_fx, "compile_fx", lambda gm, xs, config_patches: seen.append(config_patches))
    inductor("reduce-overhead")(None, [])
    inductor()(None, [])
    static = {"static_launch_user_defined_triton_kernels": True} if hasattr(
        config, "static_launch_user_defined_triton_kernels") else {}
    assert seen == [{"triton.cudagraphs": True, **static}, static]


def test_the_cuda_graph_mode_lowers_graphs_with_tuned_sites_with_combo_kernels(monkeypatch):
    # the plain lowering replayed from one CUDA graph asks for combo kernels; the fallback for
    # graphs without tuned sites is Inductor's own mode, unchanged
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as config

    seen = []
    monkeypatch.setattr(compile_fx, "compile_fx", lambda gm, xs, config_patches: seen.append(config_patches))
    backend = tritune.compiler(mode="reduce-overhead")
    backend.plain(None, [])
    backend.fallback(None, [])
    assert seen[0].get("combo_kernels") is (True if hasattr(config, "combo_kernels") else None)
    assert "combo_kernels" not in seen[1] and seen[1].get("triton.cudagraphs") is True


def test_inductor_launches_its_kernels_early_only_when_asked(monkeypatch):
    # Inductor's own early launch (programmatic dependent launch), an alternative a user has: asked
    # for where this torch's Inductor has it, never by default
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as config

    seen = []
    monkeypatch.setattr(compile_fx, "compile_fx", lambda gm, xs, config_patches: seen.append(config_patches))
    from tritune.kernels.backend.compiler import inductor

    inductor("reduce-overhead", early=True)(None, [])
    inductor("reduce-overhead")(None, [])
    assert seen[0].get("triton.enable_pdl") is (True if hasattr(config.triton, "enable_pdl") else None)
    assert "triton.enable_pdl" not in seen[1] and seen[0]["triton.cudagraphs"] is True


def test_a_torch_without_triton_op_leaves_every_graph_to_the_fallback(tmp_path, monkeypatch, caplog):
    import sys

    model, x = nn.Linear(23, 19), torch.randn(17, 23)
    db = store(tmp_path / "t.db", [tritune.extract_tasks(model, (x,))[0].expr])
    import tritune.kernels.backend as package

    monkeypatch.setitem(sys.modules, "tritune.kernels.backend.tuned_op", None)  # import fails, as on old torch
    monkeypatch.delattr(package, "tuned_op", raising=False)
    backend = tritune.compiler(db, fallback="eager")
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tritune.compiler"):
        y = torch.compile(model, backend=backend)(x)
    assert torch.allclose(y, model(x)) and backend.sites == []
    assert "cannot define the replay op" in caplog.text and "the graph goes to the fallback unchanged" in caplog.text
