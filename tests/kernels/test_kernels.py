"""Generated contraction kernels against a float64 torch reference, under the Triton interpreter."""
import pytest

from cases import run_case as run_family_case

from tritune.kernels.contraction.family import MATMUL
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Gelu, Relu, Scale
from tritune.kernels.expr import ExprError
from tritune.schedules.config import Config
from tritune.tuner.worker.candidate import rel_error

SMALL = Config.of(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2, UNROLL=2)
EPILOGUES = {
    "none": (),
    "bias": (BiasAdd(),),
    "scale": (Scale(0.25),),
    "relu": (Relu(),),
    "gelu": (Gelu(),),
    "gelu_tanh": (Gelu("tanh"),),
    "scale+bias+gelu": (Scale(0.5), BiasAdd(), Gelu()),
}
SHAPES = [  # (batch, m, n, k): none a multiple of the tiles; M or N = 1; batched
    (1, 37, 29, 53), (1, 1, 45, 70), (1, 50, 1, 33), (3, 19, 23, 41), (2, 64, 48, 17),
]


def run_case(expr: Matmul, config: Config = SMALL, seed: int = 0) -> float:
    return run_family_case(expr, config, seed)[0]


def tolerance(expr: Matmul) -> float:
    return MATMUL.tolerance(expr)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_matmul_matches_reference(dtype, shape, layout):
    b, m, n, k = shape
    expr = Matmul(m, n, k, batch=b, dtype=dtype, trans_a=layout[0] == "t", trans_b=layout[1] == "t")
    assert run_case(expr) <= tolerance(expr)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_epilogues_match_reference(dtype, name):
    expr = Matmul(33, 47, 29, batch=2, dtype=dtype, epilogue=EPILOGUES[name])
    assert run_case(expr) <= tolerance(expr)


@pytest.mark.parametrize("knobs", [
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=2, num_stages=3, UNROLL=1),
    dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64, GROUP_M=4, num_warps=8, num_stages=4, UNROLL=4),
])
def test_other_configs_and_even_k(knobs):
    expr = Matmul(70, 50, 128, dtype="fp16", epilogue=(BiasAdd(), Relu()))  # K multiple of BLOCK_K
    assert run_case(expr, Config.of(knobs)) <= tolerance(expr)


def test_check_catches_a_wrong_kernel():
    """The checker must be able to fail: a wrong scale in the kernel is caught."""
    expr = Matmul(20, 20, 20, dtype="fp32", epilogue=(Scale(2.0),))
    wrong = Matmul(20, 20, 20, dtype="fp32", epilogue=(Scale(2.02),))  # 1% off: above any tolerance
    err, tol = run_family_case(expr, SMALL, kernel_expr=wrong)
    assert err > tol


def test_unwritten_output_is_infinite_error():
    expr = Matmul(8, 8, 8, dtype="fp32")
    x = MATMUL.inputs(expr, 0, "cpu")
    assert rel_error(x.out, MATMUL.reference(expr, x.args)) == float("inf")  # poisoned with NaN, never written


@pytest.mark.parametrize("bad", [dict(m=0), dict(dtype="fp8"), dict(k=-3), dict(m=1.5)])
def test_bad_expressions_are_rejected(bad):
    args = dict(m=4, n=4, k=4) | bad
    with pytest.raises(ExprError):
        Matmul(**args)


def test_workload_json_round_trip():
    expr = Matmul(3, 5, 7, batch=2, dtype="fp32", trans_b=True, epilogue=(Scale(0.5), BiasAdd(), Gelu("tanh")))
    assert Matmul.from_dict(expr.to_dict()) == expr
    assert Matmul.from_dict(expr.to_dict()).key == expr.key
    assert Matmul(3, 5, 7).key != Matmul(3, 5, 8).key


SPLIT = SMALL.replace(SPLIT_K=3, UNROLL=1)


@pytest.mark.parametrize("name", list(EPILOGUES))
def test_split_k_applies_each_epilogue_once_after_the_full_sum(name):
    expr = Matmul(37, 29, 150, batch=2, dtype="fp32", epilogue=EPILOGUES[name])  # 10 K steps in 3 slices
    assert run_case(expr, SPLIT) <= tolerance(expr)


@pytest.mark.parametrize("extra", [dict(TMA=1), dict(TMA=2), dict(PERSISTENT=1), dict(TMA=2, PERSISTENT=1),
                                   dict(TMA=1, PERSISTENT=2), dict(PERSISTENT=2), dict(TMA=2, SPLIT_K=2)])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_tma_and_persistent_paths_match_reference(extra, layout):
    # every stride a multiple of 16 bytes (TMA's condition); edges of M, N and K are partial tiles
    expr = Matmul(40, 24, 56, dtype="fp16", trans_a=layout[0] == "t", trans_b=layout[1] == "t",
                  epilogue=(BiasAdd(), Relu()))
    assert run_case(expr, SMALL.replace(**extra)) <= tolerance(expr)


def test_split_k_kernel_rearms_its_counters_for_the_next_launch():
    expr = Matmul(20, 20, 96, dtype="fp32")
    x = MATMUL.inputs(expr, 0, "cpu")
    kernel = MATMUL.kernel(expr, SPLIT, MATMUL.problem_of(expr, x.args))
    for _ in range(2):  # a stale counter would make the second launch skip the fix-up
        x.out.fill_(float("nan"))
        kernel(*x.args)
        assert rel_error(x.out, MATMUL.reference(expr, x.args)) <= tolerance(expr)


def test_tma_config_on_unaligned_rows_is_refused_not_run():
    expr = Matmul(20, 20, 37, dtype="fp16")  # rows of A are 74 bytes
    x = MATMUL.inputs(expr, 0, "cpu")
    with pytest.raises(ValueError, match="16 bytes"):
        MATMUL.kernel(expr, SMALL.replace(TMA=1), MATMUL.problem_of(expr, x.args))
