"""The GEMV path of the GEMM families (GEMV=1: a few rows without tensor cores): where the spaces
offer it and what its tiles may be, its results against float64 under the interpreter at awkward
shapes (fp16 and fp32; bf16 and the compiled kernels are proven in tests/gpu), and its sm_90
code: no MMA instruction, where the tensor-core path has them; and the search's first round
trying the path however its model rates it."""
import numpy as np
import pytest

from cases import run_case
from test_codegen_sm90 import build_sm90
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Binary, Input, Unary
from tritune.kernels.family import family
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.cost_model.dataset import Prior
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.schedules.contraction import GEMV_COLUMNS, contraction_space
from tritune.schedules.gated import gated_space
from tritune.schedules.space import Limits
from tritune.schedules.wide import wide_space
from tritune.search import make_strategy

HOPPER = Limits(232448, 132, pdl=True)
TILE = Config.of(BLOCK_M=1, BLOCK_N=4, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1, GEMV=1)


def _valid(space) -> list[Config]:
    return [space.config(int(i)) for i in space.valid_indices]


@pytest.mark.parametrize("m", (1, 3, 4, 5, 16))
def test_offered_for_a_few_rows_with_its_own_tiles(m):
    for space in (contraction_space(m, 2048, 2048, 2, HOPPER), wide_space(m, (2048, 512, 512), 2048, 2, HOPPER),
                  gated_space(m, 5632, 2048, 2, HOPPER, tma=True)):
        configs = _valid(space)
        gemv = [c for c in configs if c.get("GEMV", 0)]
        assert bool(gemv) == (m <= 4) and ("GEMV" in {k.name for k in space.knobs}) == (m <= 4)
        rows = 1 << (m - 1).bit_length()
        for c in gemv:
            assert c["BLOCK_M"] == rows and c["BLOCK_N"] in GEMV_COLUMNS and c["GROUP_M"] == 1
            assert not any(c.get(k, 0) for k in ("TMA", "PERSISTENT", "WARP_SPEC", "FUSE"))
        mma = [c for c in configs if not c.get("GEMV", 0)]
        assert all(min(c["BLOCK_M"], c["BLOCK_N"]) >= 16 and c["BLOCK_K"] <= 256 for c in mma)
        assert m > 4 or any(c["BLOCK_K"] == 512 for c in gemv)


def test_kn_weights_get_tiles_of_whole_lines():
    space = contraction_space(1, 4096, 1024, 2, HOPPER, k_last=False)
    gemv = [c for c in _valid(space) if c["GEMV"]]
    assert gemv and all(c["BLOCK_N"] >= 16 for c in gemv) and {c["BLOCK_N"] for c in gemv} >= {64, 128}
    assert not set(GEMV_COLUMNS) & set(dict((k.name, k.values) for k in space.knobs)["BLOCK_N"])


def test_spaces_of_more_rows_are_unchanged():
    # the recorded spaces and every stored trial of 16 rows and more index the same knobs
    space = contraction_space(16, 2048, 2048, 2, HOPPER)
    assert [k.name for k in space.knobs][:3] == ["BLOCK_M", "BLOCK_N", "BLOCK_K"]
    assert space.knobs[0].values == (16, 32, 64, 128, 256) and space.knobs[1].values == (16, 32, 64, 128, 256)


CASES = [
    (Matmul(1, 45, 70, trans_b=True), TILE),
    # [K, N] weights: tiles as wide as an MMA's, the products ordered [rows, K, N]
    (Matmul(3, 37, 300, dtype="fp32", epilogue=(BiasAdd(), Unary("silu"))),
     TILE.replace(BLOCK_M=4, BLOCK_N=16, BLOCK_K=32, UNROLL=2)),
    (Matmul(1, 300, 77, epilogue=(BiasAdd(), Unary("tanh"))), TILE.replace(BLOCK_N=64, BLOCK_K=32)),
    (Matmul(1, 50, 130, dtype="fp32", trans_b=True, norm_eps=1e-5,
            epilogue=(Binary("add", Input("mn", "fp32")),)), TILE.replace(BLOCK_N=8, BLOCK_K=32)),
    (Matmul(2, 70, 256, dtype="fp32"), TILE.replace(BLOCK_M=2, BLOCK_N=32, BLOCK_K=16, SPLIT_K=4)),
    (Wide(1, (45, 70, 9), 70, norm_eps=1e-6), TILE.replace(BLOCK_N=8)),
    (Wide(3, (33, 20), 130, dtype="fp32", bias=True, trans_b=False), TILE.replace(BLOCK_M=4, BLOCK_N=16, SPLIT_K=2)),
    (Gated(1, 45, 70, "fp16", "silu", norm_eps=1e-6), TILE.replace(FUSE=0)),
    (Gated(2, 37, 130, "fp32", "gelu_tanh", bias=True, trans_b=False), TILE.replace(BLOCK_M=2, BLOCK_N=32, BLOCK_K=32,
                                                                                      SPLIT_K=2, FUSE=0)),
]


@pytest.mark.parametrize("expr, config", CASES, ids=[e.describe() for e, _ in CASES])
def test_against_float64(expr, config):
    assert family(expr.op).space(expr, HOPPER).valid(config), family(expr.op).space(expr, HOPPER).why_invalid(config)
    err, tol = run_case(expr, config)
    assert err <= tol, (err, tol)


@pytest.mark.system
def test_sm90_builds_without_mma_and_pipelines_its_loads():
    mma = Config.of(TILE, BLOCK_M=16, BLOCK_N=32, GEMV=0)
    cases = [(Matmul(1, 2048, 2048, trans_b=True), TILE.replace(BLOCK_K=512)),
             (Matmul(1, 2048, 2048, trans_b=True), TILE.replace(BLOCK_K=512, num_stages=1)),
             (Matmul(1, 2048, 2048, trans_b=True), mma),
             (Matmul(1, 4096, 1024), TILE.replace(BLOCK_N=64, BLOCK_K=64)),
             (Wide(1, (2048, 512, 512), 2048, norm_eps=1e-6), TILE.replace(BLOCK_K=256, BLOCK_N=8)),
             (Gated(1, 5632, 2048, "bf16", "silu", norm_eps=1e-6), TILE.replace(BLOCK_K=256, FUSE=0, SPLIT_K=2))]
    for (expr, config), got in zip(cases, build_sm90(cases, ptx=True)):
        assert ("mma" in got["ptx"]) == (not config.get("GEMV", 0)), expr.describe()
        # a GEMV's K loop has no tl.dot: it is pipelined (cp.async) only because it names its stages
        assert ("cp.async" in got["ptx"]) == (config["num_stages"] > 1), (expr.describe(), config)


class _Rater:
    """A stand-in cost model that rates every GEMV config below every MMA one (a prior learnt where
    no GEMV was ever measured may), and counts its fits."""

    def __init__(self):
        self.fits = 0

    def fit(self, X, y, groups=None, base_margin=None):
        self.fits += 1
        return self

    def predict(self, X, base_margin=None):
        return -np.asarray(X)[:, 0] + (0 if base_margin is None else base_margin)


def _first_column_gemv(configs):
    return np.array([[c.get("GEMV", 0), c["BLOCK_N"]] for c in configs], dtype=np.float32)


@pytest.mark.parametrize("with_prior", (True, False))
def test_the_first_round_tries_the_gemv_path_the_model_rates_last(with_prior):
    space = contraction_space(1, 2048, 5632, 2, HOPPER)
    prior = Prior(np.array([[0, 64], [0, 128]], np.float32), np.array([1.0, 0.5]), np.zeros(2, np.int64))
    s = make_strategy("sa", space, seed=5, features=_first_column_gemv, model=_Rater(), prior_model=_Rater(),
                      prior=prior if with_prior else None, plan_size=8, eps=0.0)
    first = s.propose(8)
    gemv = [c for c in first if c["GEMV"]]
    assert len(first) == 8 and len(set(first)) == 8 and len(gemv) == 2 and all(space.valid(c) for c in first)
    s.update([MeasureResult(c, Status.OK, t_median=1.0) for c in first])
    # covered once: later rounds go where the model (which rates GEMV last) points
    assert not any(c["GEMV"] for c in s.propose(8)) or not with_prior


def test_spaces_without_a_path_knob_propose_as_before():
    space = contraction_space(16, 2048, 2048, 2, HOPPER)
    assert not any(k.path for k in space.knobs)
    plain = make_strategy("sa", space, seed=1, features=_first_column_gemv, model=_Rater(), prior_model=_Rater(),
                          plan_size=8, eps=0.0)
    seeds = list(space.seeds)  # decode's weight-streaming guesses come first
    assert seeds and plain.propose(8) == seeds + space.sample(np.random.default_rng(1), 8 - len(seeds), exclude=seeds)


def test_sample_where_draws_only_that_value():
    space = contraction_space(2, 2048, 2048, 2, HOPPER)
    picks = space.sample_where(np.random.default_rng(0), 20, "GEMV", 1)
    assert len(picks) == 20 and all(c["GEMV"] == 1 and space.valid(c) for c in picks)
    again = space.sample_where(np.random.default_rng(0), 10_000, "GEMV", 1, exclude=picks)
    assert not set(again) & set(picks) and len(again) + 20 == len([c for c in _valid(space) if c["GEMV"]])
