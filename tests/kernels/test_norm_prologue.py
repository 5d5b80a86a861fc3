"""The row-norm prologue: a projection, a gated pair or a wide group reads its input through an
RMSNorm inside its kernel, a projection through a LayerNorm. Found in the ATen graph only where the norm's output has no other reader;
checked against float64 under the interpreter at awkward shapes, in every plain-contraction
variant (pointer and tensor-descriptor loads, the persistent loop); built for sm_90 as tuned and as
a compiled model replays it; kept out of split-K and warp specialisation; and workloads without a
norm keep their keys."""
import json

import pytest
import torch
from torch import nn

from cases import run_case
from test_codegen_sm90 import build_sm90

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd
from tritune.kernels.expr import ExprError
from tritune.kernels.family import expr_from_dict, family
from tritune.kernels.backend import graph
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.schedules.config import Config
from tritune.schedules.space import Limits
from tritune.tuner.worker.candidate import rel_error

TILE = Config.of(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1)
DECODE = Config.of(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4, UNROLL=1)
GEMV_NK = Config.of(BLOCK_M=1, BLOCK_N=4, BLOCK_K=512, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1, GEMV=1)
GEMV_KN = GEMV_NK.replace(BLOCK_N=64, BLOCK_K=32)


class RMSNorm(nn.Module):
    """As Llama writes it."""

    def __init__(self, k: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.rand(k) + 0.5), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Normed(nn.Module):
    """A norm before a projection; `leak`: the normed rows are returned too (another reader)."""

    def __init__(self, k=48, n=40, leak=False, layer=False):
        super().__init__()
        self.norm = nn.LayerNorm(k) if layer else RMSNorm(k)
        self.proj, self.leak = nn.Linear(k, n, bias=False), leak

    def forward(self, x):
        y = self.norm(x)
        return (self.proj(y), y) if self.leak else self.proj(y)


def found(model, x):
    return graph.find(graph.aten_graph(model, (x,)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_norm_read_only_by_its_projection_goes_into_the_prologue(dtype):
    model, x = Normed().to(dtype), torch.randn(3, 1, 48, dtype=dtype)
    site, = found(model, x)
    assert site.norm is not None and site.expr.norm_eps == 1e-6
    assert graph.val(site.norm.x).shape == (3, 1, 48) and site.expr.describe().endswith("NT rmsnorm")


def test_a_layernorm_read_only_by_its_projection_goes_into_the_prologue():
    model, x = Normed(layer=True).half(), torch.randn(3, 1, 48, dtype=torch.float16)
    site, = found(model, x)
    assert site.expr.norm_eps == 1e-5 and site.expr.layer_norm and site.norm.b is not None
    assert [graph.val(t).shape for t in site.norm.tensors] == [(48,), (48,)]
    assert site.expr.describe().endswith("NT layernorm")


class TwoProjections(nn.Module):
    """A LayerNorm read by two projections of one input: a wide group, which has no LayerNorm prologue."""

    def __init__(self, k=48):
        super().__init__()
        self.norm, self.q, self.k = nn.LayerNorm(k), nn.Linear(k, 32, bias=False), nn.Linear(k, 16, bias=False)

    def forward(self, x):
        y = self.norm(x)
        return self.q(y), self.k(y)


def test_a_norm_with_another_reader_or_a_layernorm_before_a_group_or_over_many_rows_stays_a_kernel():
    from tritune.kernels.backend.norm_match import MAX_ROWS

    x = torch.randn(3, 1, 48)
    assert [s.norm for s in found(Normed(leak=True), x)] == [None]
    assert [s.norm for s in found(Normed(layer=True, leak=True), x)] == [None]
    assert [(s.expr.op, s.norm) for s in found(TwoProjections(), x)] == [("wide", None)]
    # a LayerNorm goes into a few rows' projections only, not an LM head's nor 5 rows'
    from tritune.kernels.backend.norm_match import LAYER_NORM_MAX_ROWS, LAYER_NORM_MAX_WIDTH

    assert [s.norm is None for s in found(Normed(layer=True, n=LAYER_NORM_MAX_WIDTH * 48), x)] == [False]
    assert [s.norm for s in found(Normed(layer=True, n=LAYER_NORM_MAX_WIDTH * 48 + 1), x)] == [None]
    assert [s.norm for s in found(Normed(layer=True), torch.randn(LAYER_NORM_MAX_ROWS + 1, 1, 48))] == [None]
    assert [s.norm for s in found(LayerNormThenKN(), x)] == [None]  # a [K, N] weight
    assert [s.norm is None for s in found(Normed(), torch.randn(1, MAX_ROWS + 1, 48))] == [True]  # prefill
    assert [s.norm is None for s in found(Normed(), torch.randn(1, MAX_ROWS, 48))] == [False]


class LayerNormThenKN(nn.Module):
    """A LayerNorm before a weight stored [K, N], as GPT-2's Conv1D stores it."""

    def __init__(self, k=48, n=40):
        super().__init__()
        self.norm, self.w = nn.LayerNorm(k), nn.Parameter(torch.randn(k, n))

    def forward(self, x):
        return self.norm(x) @ self.w


def test_normed_workloads_round_trip_and_others_keep_their_keys():
    plain = Matmul(16, 32, 64, trans_b=True)
    assert "norm_eps" not in plain.to_dict()  # a stored workload without a norm keeps its key
    for expr in (Matmul(16, 32, 64, trans_b=True, norm_eps=1e-5), Wide(16, (32, 8, 8), 64, norm_eps=1e-6),
                 Gated(16, 32, 64, norm_eps=1e-6)):
        assert expr_from_dict(json.loads(expr.to_json())) == expr and expr.key != plain.key
    layer = Matmul(16, 32, 64, trans_b=True, norm_eps=1e-5, layer_norm=True)
    assert expr_from_dict(json.loads(layer.to_json())) == layer and layer.key != Matmul(16, 32, 64, trans_b=True,
                                                                                         norm_eps=1e-5).key
    for bad in (dict(norm_eps=0.0), dict(norm_eps=-1e-6), dict(norm_eps=float("nan")), dict(norm_eps="1e-6"),
                dict(norm_eps=1e-6, batch=2), dict(norm_eps=1e-6, trans_a=True), dict(layer_norm=True),
                dict(norm_eps=1e-5, layer_norm=1)):
        with pytest.raises(ExprError):
            Matmul(16, 32, 64, **bad)


@pytest.mark.parametrize("extra", [{}, dict(TMA=1), dict(TMA=2), dict(PERSISTENT=1), dict(PERSISTENT=2, TMA=1)])
def test_the_plain_prologue_matches_float64_in_every_loop_variant(extra):
    err, tol = run_case(Matmul(16, 40, 64, trans_b=True, norm_eps=1e-6), TILE.replace(**extra))
    assert err <= tol
    if not extra.get("TMA"):  # rows of 70 halves are no 16-byte multiple: no tensor descriptors
        err, tol = run_case(Matmul(5, 70, 48, norm_eps=1e-5), TILE.replace(**extra))
        assert err <= tol


@pytest.mark.parametrize("extra", [{}, dict(TMA=1), dict(PERSISTENT=2, TMA=1), dict(GEMV=1, BLOCK_M=1)])
def test_the_layernorm_prologue_matches_float64_in_every_loop_variant(extra):
    for expr in (Matmul(16, 40, 64, trans_b=True, norm_eps=1e-5, layer_norm=True),
                 Matmul(3, 40, 64, norm_eps=1e-5, layer_norm=True, epilogue=(BiasAdd(),))):
        err, tol = run_case(expr, TILE.replace(**extra))
        assert err <= tol


def test_layernorm_rows_far_from_zero_keep_their_spread():
    # rows of mean 1000 and spread 1: statistics from E[x²] - E[x]² would lose the spread in fp32
    expr = Matmul(5, 24, 200, dtype="fp32", allow_tf32=False, norm_eps=1e-5, layer_norm=True)
    fam = family("matmul")
    x = fam.inputs(expr, 0, "cpu")
    x.args[0].add_(1000.0)
    fam.kernel(expr, TILE, fam.problem_of(expr, x.args))(*x.args)
    assert rel_error(x.out, fam.reference(expr, x.args)) <= 1e-4


def test_a_layernorm_kernel_without_the_rows_mean_is_caught(monkeypatch):
    from tritune.kernels import norm

    monkeypatch.setattr(norm, "_ROW_STATS", norm._ROW_STATS.replace("return pivot + shift", "return 0.0 * shift"))
    err, tol = run_case(Matmul(16, 40, 64, trans_b=True, norm_eps=1e-5, layer_norm=True), TILE)
    assert err > tol


def test_a_kernel_that_forgets_the_row_scale_is_caught(monkeypatch):
    from tritune.kernels import norm

    monkeypatch.setattr(norm, "scale", lambda eps, accumulators, indent, layer=False: "")
    err, tol = run_case(Matmul(16, 40, 64, trans_b=True, norm_eps=1e-6), TILE)
    assert err > tol


def test_sixteen_bit_tiles_of_a_few_rows_sum_their_squares_on_the_tensor_cores(monkeypatch):
    # the rows' sums of squares of an fp16 tile of 16 rows are the diagonal of x @ x^T: a kernel that
    # misreads that diagonal is caught in every GEMM family; fp32 tiles, taller tiles and GEMV steps
    # reduce across the tile instead, so they do not read it
    from tritune.kernels import norm

    monkeypatch.setattr(norm, "_DIAGONAL", norm._DIAGONAL.replace("return tl.sum(", "return 2.0 * tl.sum("))
    tile = TILE.replace(BLOCK_K=32)
    for expr, config in ((Matmul(16, 40, 64, trans_b=True, norm_eps=1e-6), tile),
                         (Wide(16, (24, 16), 64, norm_eps=1e-6), tile.replace(SPLIT_K=2)),
                         (Gated(16, 24, 64, norm_eps=1e-6), tile.replace(FUSE=0))):
        err, tol = run_case(expr, config)
        assert err > tol, expr.describe()
    for expr, config in ((Matmul(16, 40, 64, trans_b=True, norm_eps=1e-6, dtype="fp32", allow_tf32=False), tile),
                         (Matmul(40, 40, 64, trans_b=True, norm_eps=1e-6), tile.replace(BLOCK_M=64)),
                         (Matmul(1, 40, 64, trans_b=True, norm_eps=1e-6), GEMV_NK.replace(BLOCK_K=64))):
        err, tol = run_case(expr, config)
        assert err <= tol, expr.describe()


def test_the_space_keeps_the_prologue_out_of_split_k_and_warp_specialisation():
    fam = family("matmul")
    limits = Limits(*Limits.KNOWN[(9, 0)])
    expr = Matmul(16, 2048, 2048, trans_b=True, norm_eps=1e-6)
    space = fam.space(expr, limits)
    sample = space.sample(__import__("numpy").random.default_rng(0), 400)
    assert sample and all(c.get("SPLIT_K", 1) == 1 and not c.get("WARP_SPEC", 0) for c in sample)
    assert any(c.get("SPLIT_K", 1) > 1 for c in fam.space(Matmul(16, 2048, 2048, trans_b=True), limits).sample(
        __import__("numpy").random.default_rng(0), 400))  # the same problem without a norm splits
    with pytest.raises(ValueError, match="split-K"):
        x = fam.inputs(expr, 0, "cpu")
        fam.kernel(expr, DECODE.replace(SPLIT_K=2), fam.problem_of(expr, x.args))


def test_a_layernorm_prologue_may_split_along_k_but_is_never_warp_specialised():
    # its statistics come before the main loop, so each K slice normalises its own tiles
    fam, limits = family("matmul"), Limits(*Limits.KNOWN[(9, 0)])
    expr = Matmul(16, 2048, 2048, trans_b=True, norm_eps=1e-5, layer_norm=True)
    sample = fam.space(expr, limits).sample(__import__("numpy").random.default_rng(0), 400)
    assert any(c.get("SPLIT_K", 1) > 1 for c in sample) and not any(c.get("WARP_SPEC", 0) for c in sample)
    for extra in (dict(SPLIT_K=3), dict(SPLIT_K=2, TMA=1), dict(SPLIT_K=2, GEMV=1, BLOCK_M=1)):
        err, tol = run_case(Matmul(3, 40, 200, norm_eps=1e-5, layer_norm=True, epilogue=(BiasAdd(),)), TILE.replace(**extra))
        assert err <= tol


@pytest.mark.system
def test_the_prologue_builds_for_sm90_tuned_and_replayed():
    cases = [(Matmul(16, 32000, 2048, trans_b=True, norm_eps=1e-6), DECODE),
             (Matmul(16, 32000, 2048, trans_b=True, norm_eps=1e-6), DECODE.replace(TMA=1)),
             (Matmul(16, 32000, 2048, trans_b=True, norm_eps=1e-6, dtype="bf16"), DECODE.replace(PERSISTENT=1)),
             (Wide(16, (2048, 512, 512), 2048, norm_eps=1e-6, bias=True), DECODE.replace(TMA=1)),
             (Wide(16, (2048, 512, 512), 2048, norm_eps=1e-6), DECODE.replace(SPLIT_K=4)),
             (Wide(16, (2048, 512, 512), 2048, norm_eps=1e-6, dtype="bf16"), DECODE.replace(SPLIT_K=2, TMA=1)),
             (Gated(16, 5632, 2048, norm_eps=1e-6, dtype="bf16"), DECODE.replace(FUSE=1)),
             (Gated(16, 5632, 2048, norm_eps=1e-6), DECODE.replace(FUSE=0, TMA=1)),
             (Gated(16, 5632, 2048, norm_eps=1e-6), DECODE.replace(FUSE=1, SPLIT_K=4)),
             (Gated(16, 5632, 2048, norm_eps=1e-6, dtype="bf16"), DECODE.replace(FUSE=0, TMA=1, SPLIT_K=2)),
             (Matmul(16, 2304, 768, norm_eps=1e-5, layer_norm=True, epilogue=(BiasAdd(),)), DECODE.replace(SPLIT_K=3)),
             (Matmul(1, 3072, 768, norm_eps=1e-5, layer_norm=True), GEMV_KN.replace(SPLIT_K=4)),
             (Matmul(1, 50257, 768, trans_b=True, norm_eps=1e-5, layer_norm=True, dtype="bf16"), GEMV_NK),
             (Matmul(16, 50257, 768, trans_b=True, norm_eps=1e-5, layer_norm=True), DECODE.replace(TMA=1))]
    tuned = build_sm90(cases)
    # (a replayed persistent grid asks the GPU for its SM count: left out here)
    replayed = build_sm90([(e, c) for e, c in cases if not c.get("PERSISTENT", 0)], replay=True)
    assert len(tuned) == len(cases) and len(replayed) == len(cases) - 1
    # the replayed kernels take the norm weight (a LayerNorm's bias too): no pointer they leave out
    assert all("G" not in (r["nones"] or []) and "GB" not in (r["nones"] or []) for r in replayed)
    # a split wide or gated kernel's replay passes its scratch; an unsplit one leaves it out
    split = [(r, c) for r, (e, c) in zip(replayed, [(e, c) for e, c in cases if not c.get("PERSISTENT", 0)])
             if e.op in ("wide", "gated")]
    assert len(split) == 7 and all(("WS" in r["nones"]) == (c.get("SPLIT_K", 1) == 1) for r, c in split)
