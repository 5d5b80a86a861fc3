"""Programmatic dependent launch (the PDL knob of the GEMM families): where the space offers it,
what a config's binary carries, the sm_90 code it compiles to, and which op a compiled graph
calls for it. Its correctness on a GPU (single launches and a chain of dependent early launches
in one CUDA graph) is in tests/gpu."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import real_jit
from test_codegen_sm90 import build_sm90
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.contraction.launch import launch_options, pdl_constexprs
from tritune.kernels.backend import graph, sites, tuned_op
from tritune.kernels.backend.compiler import rewrite
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.schedules.config import Config
from tritune.schedules.contraction import contraction_space
from tritune.schedules.gated import gated_space
from tritune.schedules.space import Limits
from tritune.schedules.wide import wide_space
from tritune.tuner import task
from tritune.tuner.task import device_limits

SKINNY = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1)
HOPPER = Limits(232448, 132, pdl=True)


def _knobs(space) -> set[str]:
    return {k.name for k in space.knobs}


def test_the_knob_is_offered_only_where_the_device_launches_early():
    plain = Limits(232448, 132)
    assert "PDL" not in _knobs(contraction_space(16, 2048, 2048, 2, plain))
    for space in (contraction_space(16, 2048, 2048, 2, HOPPER), wide_space(16, (2048, 512, 512), 2048, 2, HOPPER),
                  gated_space(16, 5632, 2048, 2, HOPPER)):
        assert "PDL" in _knobs(space)


def test_the_device_offers_it_where_asked_for_and_it_exists(monkeypatch):
    info = {"shared_bytes": 0, "sms": 0}
    assert not device_limits({**info, "capability": "9.0"}).pdl  # off unless asked for
    monkeypatch.setattr(task, "SETTINGS", dataclasses.replace(task.SETTINGS, pdl=True))
    assert device_limits({**info, "capability": "9.0"}).pdl and device_limits({**info, "capability": "10.0"}).pdl
    assert not device_limits({**info, "capability": "8.0"}).pdl
    assert not device_limits({**info, "capability": "0.0"}).pdl  # the interpreter


@pytest.mark.parametrize("m", (16, 4096))
def test_early_launch_only_for_kernels_of_one_wave(m):
    space = contraction_space(m, 4096, 4096, 2, HOPPER)
    configs = [space.config(i) for i in space.valid_indices[::7]]
    early = [c for c in configs if c["PDL"]]
    programs = [-(-m // c["BLOCK_M"]) * -(-4096 // c["BLOCK_N"]) * c.get("SPLIT_K", 1) for c in early]
    assert all(p <= HOPPER.sms for p in programs) and not any(c.get("PERSISTENT", 0) for c in early)
    assert bool(early) == (m == 16)  # decode's grid fits one wave; 4096 rows never do


def test_binary_options_and_prefetch_reach():
    tile = Config.of(SKINNY)
    assert dict(launch_options(tile)) == {"num_warps": 4, "num_stages": 3}
    assert dict(launch_options(tile.replace(PDL=1)))["launch_pdl"] is True
    assert pdl_constexprs(tile) == {"PDL": 0, "PDL_K": 0} and pdl_constexprs(tile.replace(PDL=1))["PDL_K"] == 0
    assert pdl_constexprs(tile.replace(PDL=2))["PDL_K"] == 1024  # 3 stages of 256, rounded up to a power of two
    assert pdl_constexprs(tile.replace(PDL=2, BLOCK_K=16, num_stages=2))["PDL_K"] == 128  # at least a few lines


@pytest.mark.system
def test_sm90_builds_wait_trigger_and_prefetch_as_asked():
    cases = []
    for pdl in (0, 1, 2):
        cases += [(Matmul(16, 2048, 2048, trans_b=True), Config.of(SKINNY, PDL=pdl, TMA=1)),
                  (Matmul(16, 2048, 5632, dtype="fp32"), Config.of(SKINNY, BLOCK_K=64, PDL=pdl, SPLIT_K=2)),
                  (Wide(16, (2048, 512, 512), 2048, norm_eps=1e-6), Config.of(SKINNY, PDL=pdl, TMA=1)),
                  (Gated(16, 5632, 2048, "bf16", "silu", norm_eps=1e-6, trans_b=False),
                   Config.of(SKINNY, BLOCK_N=64, PDL=pdl, FUSE=1))]
    for (expr, config), got in zip(cases, build_sm90(cases, ptx=True)):
        ptx, pdl = got["ptx"], config["PDL"]
        assert got["launch_pdl"] == bool(pdl)
        assert ptx.count("griddepcontrol.wait") == ptx.count("griddepcontrol.launch_dependents") == (pdl > 0)
        assert ("prefetch.global.L2" in ptx) == (pdl == 2), (expr.describe(), pdl)


@pytest.mark.system
def test_replayed_sites_with_early_launch_compile():
    cases = [(Wide(16, (2048, 512, 512), 2048, norm_eps=1e-6), Config.of(SKINNY, PDL=2, TMA=1)),
             (Gated(16, 5632, 2048, "fp16", "silu", norm_eps=1e-6), Config.of(SKINNY, BLOCK_N=64, PDL=2, FUSE=0)),
             (Matmul(16, 2048, 5632, trans_b=True), Config.of(SKINNY, PDL=1))]
    assert len(build_sm90(cases, replay=True)) == len(cases)


def _mlp_graph():
    def mlp(x, wg, wu, wd):
        return x + F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)

    with FakeTensorMode() as mode:
        shapes = ((16, 96), (160, 96), (160, 96), (96, 160))
        args = [torch.empty(s, dtype=torch.float16, device="cuda") for s in shapes]
    return graph.aten_graph(mlp, args, mode), args, mode


@pytest.mark.parametrize("captured, pdl, twins", [(True, 2, True), (True, 0, False), (False, 2, False)])
def test_sites_that_launch_early_call_the_twin_only_in_one_cuda_graph(captured, pdl, twins):
    aten, _, _ = _mlp_graph()
    tile = Config.of(SKINNY, BLOCK_K=32, PDL=pdl)
    hits = [(s, tuned_op.spec_of(s.expr, tile.replace(FUSE=0) if s.expr.op == "gated" else tile))
            for s in graph.find(aten)]
    assert {s.expr.op for s, _ in hits} == {"gated", "matmul"}
    rewrite(aten, hits, captured, early=True)
    targets = {str(n.target) for n in aten.graph.nodes if str(n.target).startswith("tritune.")}
    assert targets == ({"tritune.gated_graphed.default", "tritune.matmul_graphed.default"} if twins
                       else {"tritune.gated.default", "tritune.matmul.default"})


def test_only_the_twin_launches_with_the_attribute(monkeypatch):
    launched = []

    class Capture:  # stands in for wrap_triton(fn)[grid]
        def __init__(self, fn):
            pass

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((kwargs.get("launch_pdl", False), kwargs["PDL"]))

    monkeypatch.setattr(sites, "wrap_triton", Capture)
    expr = Matmul(16, 160, 96, trans_b=True)
    with FakeTensorMode():
        a, w = torch.empty(16, 96, dtype=torch.float16, device="cuda"), torch.empty(160, 96, dtype=torch.float16,
                                                                                      device="cuda")
        for pdl in (0, 2):
            spec = tuned_op.spec_of(expr, Config.of(SKINNY, BLOCK_K=32, PDL=pdl))
            site = tuned_op.site(spec)
            site(a, w.t(), None, [])
            tuned_op._graphed(lambda: site(a, w.t(), None, []))()
    # traced (Inductor launches it, without the attribute): the kernel built without PDL
    assert launched == [(False, 0), (False, 0), (False, 0), (True, 2)]


TRACED = """
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.kernels.contraction.expr import Matmul

tile = Config.of(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1, PDL=2)
with FakeTensorMode():
    x = torch.empty(16, 96, dtype=torch.float16, device="cuda")
    w, g = torch.empty(160, 96, dtype=torch.float16, device="cuda"), torch.empty(96, dtype=torch.float16, device="cuda")
specs = [tuned_op.spec_of(Matmul(16, 160, 96, trans_b=True), tile),
         tuned_op.spec_of(Gated(16, 160, 96, "fp16", "silu", norm_eps=1e-6), tile.replace(FUSE=0)),
         tuned_op.spec_of(Wide(16, (160, 160), 96), tile)]
calls = [lambda x, w, g: torch.ops.tritune.matmul(x, w.t(), None, [], specs[0]),
         lambda x, w, g: torch.ops.tritune.gated(x, w.t(), w.t(), None, None, specs[1], g),
         lambda x, w, g: torch.ops.tritune.wide(x, [w.t(), w.t()], [], specs[2])]
for call in calls:
    print(make_fx(dispatch_functionalize(call))(x, w, g).code)
"""


@pytest.mark.system
def test_traced_sites_never_make_inductor_copy_their_weights(tmp_path):
    """Inductor reads from a kernel's TTIR which tensors it writes, and copies each of them on every
    call: a traced PDL=2 site (whose kernel would prefetch through an inline-asm instruction on the
    weight) writes only its outputs. Real JIT functions, fake CUDA tensors."""
    matmul, gated, wide = real_jit.run(TRACED, tmp_path).split("def forward")[1:]
    assert "tensors_to_clone = ['C']" in matmul and "tensors_to_clone = ['C']" in gated
    assert "tensors_to_clone = ['C0', 'C1']" in wide and "'PDL': 0" in matmul


@pytest.mark.parametrize("early", [True, False])
def test_the_backend_launches_early_only_in_one_cuda_graph_and_when_let(monkeypatch, tmp_path, early):
    """The backend in CUDA-graph mode, a site stored with a PDL config: the graph it hands Inductor's
    default lowering calls the twin (launching early) unless `early_launch=False`; the default mode
    never does."""
    import tritune
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key
    from tritune.kernels.backend import compiler
    from tritune.records.database import Database
    from tritune.records.result import MeasureResult, Status

    lowered = []
    monkeypatch.setattr(compiler, "inductor",
                        lambda mode=None, combo=False, early=False, options=None: lambda gm, inputs: lowered.append((mode, gm)) or gm)

    def fn(x, w):
        return F.linear(x, w)
    x, w = torch.randn(16, 96), torch.nn.Parameter(torch.randn(160, 96))
    (site,) = graph.find(graph.aten_graph(fn, (x, w)), graph.tf32_allowed())
    with Database(tmp_path / "t.db") as db:
        db.add_workload(site.expr.key, "matmul", site.expr.dtype, site.expr.to_json())
        config = Config.of(SKINNY, BLOCK_K=32, PDL=2)
        db.save(site.expr.key, device_key(device_info(), "matmul"), [MeasureResult(config, Status.OK, *[1.0] * 4)])
    for mode in ("reduce-overhead", None):
        backend = tritune.compiler(tmp_path / "t.db", mode=mode, early_launch=early, graph_verdicts=False)
        with torch.no_grad():
            backend(torch.fx.symbolic_trace(fn), [x, w])
    (ro, ro_graph), (default, default_graph) = lowered
    targets = [{str(n.target) for n in g.graph.nodes if str(n.target).startswith("tritune.")}
               for g in (ro_graph, default_graph)]
    assert ro is None and default is None  # the CUDA-graph mode lowers through Inductor's default
    assert targets == [{"tritune.matmul_graphed.default" if early else "tritune.matmul.default"},
                       {"tritune.matmul.default"}]
