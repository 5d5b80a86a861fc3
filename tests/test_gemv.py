"""The GEMV path of the GEMM families (GEMV=1: a few rows without tensor cores): where the spaces
offer it and what its tiles may be, its results against float64 under the interpreter at awkward
shapes (fp16 and fp32; bf16 and the compiled kernels are proven in tests/gpu), and its sm_90
code: no MMA instruction, where the tensor-core path has them."""
import pytest

from cases import run_case
from test_codegen_sm90 import build_sm90
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Binary, Input, Unary
from tritune.kernels.family import family
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.schedules.config import Config
from tritune.schedules.contraction import GEMV_COLUMNS, contraction_space
from tritune.schedules.gated import gated_space
from tritune.schedules.space import Limits
from tritune.schedules.wide import wide_space

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


def test_spaces_of_more_rows_are_unchanged():
    # the recorded spaces and every stored trial of 16 rows and more index the same knobs
    space = contraction_space(16, 2048, 2048, 2, HOPPER)
    assert [k.name for k in space.knobs][:3] == ["BLOCK_M", "BLOCK_N", "BLOCK_K"]
    assert space.knobs[0].values == (16, 32, 64, 128, 256) and space.knobs[1].values == (16, 32, 64, 128, 256)


CASES = [
    (Matmul(1, 45, 70, trans_b=True), TILE),
    (Matmul(3, 37, 300, dtype="fp32", epilogue=(BiasAdd(), Unary("silu"))), TILE.replace(BLOCK_M=4, UNROLL=2)),
    (Matmul(1, 50, 130, dtype="fp32", trans_b=True, norm_eps=1e-5,
            epilogue=(Binary("add", Input("mn", "fp32")),)), TILE.replace(BLOCK_N=8, BLOCK_K=32)),
    (Matmul(2, 70, 256, dtype="fp32"), TILE.replace(BLOCK_M=2, BLOCK_N=2, BLOCK_K=32, SPLIT_K=4)),
    (Wide(1, (45, 70, 9), 70, norm_eps=1e-6), TILE.replace(BLOCK_N=8)),
    (Wide(3, (33, 20), 130, dtype="fp32", bias=True, trans_b=False), TILE.replace(BLOCK_M=4, SPLIT_K=2)),
    (Gated(1, 45, 70, "fp16", "silu", norm_eps=1e-6), TILE.replace(FUSE=0)),
    (Gated(2, 37, 130, "fp32", "gelu_tanh", bias=True, trans_b=False), TILE.replace(BLOCK_M=2, BLOCK_N=2, SPLIT_K=2,
                                                                                      FUSE=0)),
]


@pytest.mark.parametrize("expr, config", CASES, ids=[e.describe() for e, _ in CASES])
def test_against_float64(expr, config):
    assert family(expr.op).space(expr, HOPPER).valid(config), family(expr.op).space(expr, HOPPER).why_invalid(config)
    err, tol = run_case(expr, config)
    assert err <= tol, (err, tol)


def test_sm90_builds_without_mma():
    mma = Config.of(TILE, BLOCK_M=16, BLOCK_N=32, GEMV=0)
    cases = [(Matmul(1, 2048, 2048, trans_b=True), TILE.replace(BLOCK_K=512)),
             (Matmul(1, 2048, 2048, trans_b=True), mma),
             (Wide(1, (2048, 512, 512), 2048, norm_eps=1e-6), TILE.replace(BLOCK_K=256, BLOCK_N=8)),
             (Gated(1, 5632, 2048, "bf16", "silu", norm_eps=1e-6), TILE.replace(BLOCK_K=256, FUSE=0, SPLIT_K=2))]
    for (expr, config), got in zip(cases, build_sm90(cases, ptx=True)):
        assert ("mma" in got["ptx"]) == (not config.get("GEMV", 0)), expr.describe()
