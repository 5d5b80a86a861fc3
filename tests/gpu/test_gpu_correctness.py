"""Compiled kernels on the GPU against a float64 reference (the cases are in gpu_cases.py), the
replay route under Inductor (default mode and CUDA graphs), zoo models compiled by the tritune
backend, and every family's fault hook through the crash-isolated runner.

    TRITUNE_GPU_TESTS=1 python -m pytest -q tests/gpu [-k kernels|libraries|route|frontend|attention_site|faults]

A test's id names its op and dtype: `-k "gated or wide"` picks ops, as `-k "kernels and bf16"` does
a dtype of one kind of case."""
import itertools
from collections import Counter
from functools import partial

import pytest
import torch

import gpu_cases
from tritune.kernels.epilogue import BiasAdd, Gelu
from tritune.kernels.expr import torch_dtype
from tritune.kernels.family import REGISTRY, family
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.schedules.space import Limits
from tritune.tuner.timing import Timing
from tritune.tuner.worker.candidate import match_precision, rel_error


def _limits() -> Limits:
    """This GPU's limits (the families' random configs are sampled within them); off a GPU, an H100's."""
    if not torch.cuda.is_available():
        return Limits.for_capability(9, 0)
    props = torch.cuda.get_device_properties(0)
    return Limits(props.shared_memory_per_block_optin, props.multi_processor_count)


def _cases(pairs: list) -> list:
    """pytest params of (expr, config, seed): the seed is the case's place in its list, so that any
    subset (-k) checks each case on the same inputs."""
    return [pytest.param(e, c, i, id=f"{e.op}-{e.dtype}-{i}" + ("-gemv" if c.get("GEMV", 0) else "")
                         + ("-layernorm" if getattr(e, "layer_norm", False) else
                            "-rmsnorm" if getattr(e, "norm_eps", None) is not None else ""))
            for i, (e, c) in enumerate(pairs)]


KERNELS = gpu_cases.matmul_cases() + gpu_cases.general_cases() + gpu_cases.family_cases(_limits())


def check(expr, config, seed: int, precompiled: dict) -> None:
    """Run one case once and compare with float64."""
    assert (expr.key, config) not in precompiled, precompiled.get((expr.key, config))
    fam = family(expr.op)
    x = fam.inputs(expr, seed, "cuda")
    match_precision(expr)
    out = fam.kernel(expr, config, fam.problem_of(expr, x.args))(*x.args)
    torch.cuda.synchronize()
    err, tol = rel_error(x.out if out is None else out, fam.reference(expr, x.args)), fam.tolerance(expr)
    assert err <= tol, f"{expr.describe()} {dict(config)}: relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("expr, config, seed", _cases(KERNELS))
def test_kernels(expr, config, seed, precompiled):
    check(expr, config, seed, precompiled)


@pytest.mark.parametrize("expr, config, seed", _cases(gpu_cases.library_cases()))
def test_libraries(expr, config, seed, precompiled):
    check(expr, config, seed, precompiled)


def _route_id(knobs: dict, mode: str | None) -> str:
    return f"{mode or 'default'}-" + (",".join(f"{k}={v}" for k, v in knobs.items()) or "plain")


@pytest.mark.parametrize("seed, knobs, mode", [pytest.param(i, k, m, id=_route_id(k, m))
                                               for i, (k, m) in enumerate(gpu_cases.route_cases())])
def test_route(seed, knobs, mode):
    """The tuned op under torch.compile (Inductor launching the kernel, as the tritune backend
    configures it: static launches of tuned kernels), against float64."""
    from tritune.kernels.backend import tuned_op
    from tritune.kernels.backend.compiler import inductor
    from tritune.kernels.backend.helpers import contraction_expr

    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, w = (torch.randn(s, generator=gen, device="cuda").half() for s in ((1000, 1576), (520, 1576)))
    bias = torch.randn(520, generator=gen, device="cuda").half()
    spec = tuned_op.spec_of(contraction_expr(a, w.t(), (BiasAdd(), Gelu("tanh"))), gpu_cases.knob_config(knobs))
    torch._dynamo.reset()
    f = torch.compile(lambda a, w, bias: torch.ops.tritune.matmul(a, w.t(), bias, [], spec) * 2, backend=inductor(mode))
    ref = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double(), approximate="tanh") * 2
    for _ in range(3):  # CUDA graphs: warm-up, record, replay
        out = f(a, w, bias)
    torch.cuda.synchronize()
    assert rel_error(out, ref) <= 2e-3


# (2, 64): prefill-like rows; (16, 1): decode, where the RMSNorms go into the projections'
# prologues; (2, 1): decode of a few sequences, where GPT-NeoX's LayerNorms do too (but the LM head's)
FRONTEND = [pytest.param(name, dtype, mode, shape, id=f"{name}-{dtype}-{mode or 'default'}-{shape[0]}x{shape[1]}")
            for name, (dtype, mode), shape in
            [*itertools.product(("llama", "gpt2", "qwen2", "neox"), (("fp16", None), ("bf16", "reduce-overhead")),
                                ((2, 64), (16, 1))),
             *itertools.product(("gpt2", "neox"), (("fp16", None), ("bf16", "reduce-overhead")), ((2, 1),))]]


@pytest.mark.parametrize("name, dtype, mode, shape", FRONTEND)
def test_frontend(name, dtype, mode, shape, tmp_path):
    """A zoo model (one layer, hidden 256, `shape` = sequences x tokens) compiled by the tritune
    backend with every extracted site's default config stored as its best (no tuning): each site
    (matmuls with their fused epilogues and residuals, gated pairs, normed prologues, ...) replayed
    by Inductor. The output against float64 may be off by at most twice what the eager model in
    the same dtype is, plus 1e-3."""
    pytest.importorskip("transformers")
    import tritune
    from tritune.tuner.model import zoo
    from tritune.tuner.model.load import build

    model, (x,) = build(partial(getattr(zoo, name), hidden=256, layers=1), [(*shape, 256)], "fp32", "cuda", "random")
    with torch.no_grad():
        ref = model.double()(x.double())
        model, x = model.to(torch_dtype(dtype)), x.to(torch_dtype(dtype))
        eager_err = rel_error(model(x), ref)
    db = gpu_cases.store_defaults(tritune.extract_tasks(model, (x,)), tmp_path / "t.db")
    torch._dynamo.reset()
    backend = tritune.compiler(db, mode=mode)
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        for _ in range(3):  # CUDA graphs: warm-up, record, replay
            out = compiled(x)
        torch.cuda.synchronize()
    kinds = Counter(kind for _, kind in backend.sites)
    assert kinds.get("tuned", 0) > 0, f"no site replayed a tuned kernel: {dict(kinds)}"
    if shape[1] == 1:  # at decode the RMSNorms run in prologues (two a layer and the head's), and the
        # LayerNorms of a few rows (two a layer, not the head's)
        norm, count = ("rmsnorm", 3) if name in ("llama", "qwen2") else ("layernorm", 2 if shape[0] <= 4 and name == "neox"
                                                                         else 0)  # GPT-2's weights are [K, N]
        assert sum(norm in what for what, kind in backend.sites if kind == "tuned") == count, backend.sites
    assert rel_error(out, ref) <= 2 * eager_err + 1e-3


@pytest.mark.parametrize("name", ("llama", "gpt2"))
def test_frontend_launches_early_under_cuda_graphs(name, tmp_path, monkeypatch):
    """A zoo model at decode whose GEMM sites launch early with their weights prefetched (PDL=2),
    in the backend's CUDA-graph mode: the sites go through the ops that launch with the attribute,
    the replayed graph (kernels overlapping their predecessors) against float64."""
    pytest.importorskip("transformers")
    import tritune
    from tritune.kernels.backend import sites
    from tritune.tuner.model import zoo
    from tritune.tuner.model.load import build

    early = []
    options = sites._launch_options

    def spy(config):
        got = options(config)
        early.append(bool(got))
        return got
    monkeypatch.setattr(sites, "_launch_options", spy)
    model, (x,) = build(partial(getattr(zoo, name), hidden=256, layers=2), [(16, 1, 256)], "fp32", "cuda", "random")
    with torch.no_grad():
        ref = model.double()(x.double())
        model, x = model.half(), x.half()
        eager_err = rel_error(model(x), ref)
    db = gpu_cases.store_defaults(tritune.extract_tasks(model, (x,)), tmp_path / "t.db", gemm_knobs=dict(PDL=2))
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, backend=tritune.compiler(db, mode="reduce-overhead"), fullgraph=True)
        outs = [compiled(x).clone() for _ in range(4)]  # warm-up, capture, replays (kept: cloned)
        torch.cuda.synchronize()
    assert any(early), "no site launched with the programmatic-dependence attribute"
    assert all(rel_error(out, ref) <= 2 * eager_err + 1e-3 for out in outs)


def test_dependent_early_launches_in_one_graph_wait_for_their_inputs():
    """Twelve projections, each reading the previous one's output, launched early (PDL=1 and 2)
    back to back inside one CUDA graph: each must still see its input complete."""
    from tritune.kernels.contraction.expr import Matmul
    from tritune.tuner.timing import capture

    fam, d = family("matmul"), 1024
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(d, d, generator=gen, device="cuda").half() / d ** 0.5 for _ in range(12)]
    expr = Matmul(16, d, d, trans_b=True)
    for pdl in (1, 2):
        config = gpu_cases.SMALL.replace(UNROLL=1, BLOCK_K=128, PDL=pdl)
        xs = [torch.randn(16, d, generator=gen, device="cuda").half() for _ in range(13)]
        kernel = fam.kernel(expr, config, fam.problem_of(expr, (xs[0], ws[0].t(), xs[1])))
        calls = [lambda i=i: kernel(xs[i], ws[i].t(), xs[i + 1]) for i in range(12)]
        graph = capture(calls, 1)
        for x in xs[1:]:
            x.zero_()
        graph.replay()
        torch.cuda.synchronize()
        ref = xs[0].double()
        for w in ws:
            ref = (ref @ w.double().t()).half().double()
        assert rel_error(xs[-1], ref) <= 2e-2, pdl


class Decode(torch.nn.Module):
    """Attention of a decode step as a model calls it: F.scaled_dot_product_attention on q
    [B, H, Lq, D] against a cache [B, H, Lk, D], with an additive mask per sequence (or none)."""

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2


ATTENTION_SITES = [pytest.param(dtype, mode, lk, masked,
                                id=f"{dtype}-{mode or 'default'}-k{lk}-{'mask' if masked else 'plain'}")
                   for (dtype, mode), lk, masked in itertools.product((("fp16", None), ("bf16", "reduce-overhead")),
                                                                      (1, 1024, 4096), (True, False))]


@pytest.mark.parametrize("dtype, mode, lk, masked", ATTENTION_SITES)
def test_attention_site(dtype, mode, lk, masked, tmp_path):
    """Llama's decode attention (16 sequences, 4 query heads folded into each of 4 k/v heads' rows,
    head dim 128) over a cache of `lk` keys, as torch dispatches it on this GPU (memory-efficient,
    flash or cuDNN; the mask padded and expanded for it), found, given a config as its best (no
    tuning run: the family's default over one key, the keys split over 4 programs over a cache)
    and replayed by the tritune backend, against float64."""
    import tritune

    gen = torch.Generator(device="cuda").manual_seed(lk)
    dt = torch_dtype(dtype)
    q, k, v = (torch.randn(16, 4, n, 128, generator=gen, device="cuda").to(dt) for n in (4, lk, lk))
    mask = torch.randn(16, 1, 1, lk, generator=gen, device="cuda").to(dt) if masked else None
    args = (q, k, v, mask) if masked else (q, k, v)
    tasks = tritune.extract_tasks(Decode(), args)
    assert [t.expr.op for t in tasks] == ["attention"], [t.describe() for t in tasks]
    assert tasks[0].expr.mask_dims == ("bk" if masked and lk > 1 else "b" if masked else "")
    split = Config.of(BLOCK_N=64, DOT=1, num_warps=4, num_stages=2, SPLIT=4) if lk > 1 else None
    db = gpu_cases.store_defaults(tasks, tmp_path / "t.db", split)
    torch._dynamo.reset()
    backend = tritune.compiler(db, mode=mode)
    with torch.no_grad():
        compiled = torch.compile(Decode(), backend=backend, fullgraph=True)
        for _ in range(3):  # CUDA graphs: warm-up, record, replay
            out = compiled(*args)
        torch.cuda.synchronize()
    assert [kind for _, kind in backend.sites] == ["tuned"]
    ref = Decode()(*(a.double() for a in args))
    assert rel_error(out, ref) <= family("attention").tolerance(tasks[0].expr)


FAULT_STATUS = {"oob": Status.CRASH, "hang": Status.TIMEOUT, "wrong": Status.WRONG_ANSWER, None: Status.OK}
# the first op of each family class (bmm and layernorm share matmul's and softmax's family code)
FAULT_OPS = list({type(family(op)): op for op in reversed(REGISTRY)}.values())


@pytest.fixture(scope="module")
def runner():
    from tritune.tuner.worker.local import LocalRunner

    with LocalRunner(Timing(5.0, 20.0), timeout_s=10.0) as r:
        yield r


@pytest.mark.parametrize("op, fault", [pytest.param(op, f, id=f"{op}-{f}") for op in FAULT_OPS for f in FAULT_STATUS])
def test_faults(op, fault, runner):
    """Each family's fault hook through the crash-isolated runner: "oob" comes back CRASH, "hang"
    TIMEOUT, "wrong" WRONG_ANSWER, and a plain run after each OK."""
    fam = family(op)
    expr = fam.examples()[0]
    config = fam.default_config(expr)
    got = runner.measure(expr, config if fault is None else config.replace(fault=fault))
    assert got.status is FAULT_STATUS[fault], got.message


def test_head_to_head_with_its_alternatives_compiled_ahead():
    """The second worker compiles torch.compile's lowering while the search would run; the
    head-to-head, in that worker, then times it beside the library call."""
    from tritune.kernels.contraction.expr import Matmul
    from tritune.schedules.config import Config
    from tritune.tuner.worker.local import LocalRunner

    expr = Matmul(512, 512, 512)
    with LocalRunner(judge=True) as runner:
        runner.start()
        runner.prepare_head_to_head(expr)
        h2h = runner.head_to_head(expr, Config.of(library="mm"))
        assert runner.watch.spent["alternatives"] > 0  # compiled ahead, and it worked
    assert "torch.compile" in h2h["alternatives"] and not h2h["compile_error"] and h2h["ours_ms"] > 0


def test_torch_compile_warmed_up_as_a_second_worker_does():
    """What the head-to-head's worker runs as its session starts: a tiny torch.compile, compiled and run."""
    from tritune.tuner.worker import candidate

    assert candidate.warm_compiler()["compile_s"] > 0
