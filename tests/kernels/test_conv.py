"""conv2d: the implicit-GEMM kernel against float64 torch under the interpreter; expression, CLI,
space, features; sm_90 builds."""
import json

import pytest
import torch

from cases import run_case
from test_codegen_sm90 import build_sm90

from tritune.kernels.conv.expr import AWKWARD, Conv2d
from tritune.kernels.conv.template import rs_outer
from tritune.kernels.epilogue import BiasAdd, Gelu, Relu, Scale
from tritune.kernels.expr import ExprError
from tritune.kernels.family import family
from tritune.schedules.config import Config
from tritune.schedules.contraction import shared_estimate
from tritune.schedules.space import Limits

CONV = family("conv2d")
H100 = Limits.for_capability(9, 0)
K16 = Config.of(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2, UNROLL=2)
K32 = Config.of(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=2, num_stages=3, UNROLL=1)


def check(expr: Conv2d, config: Config) -> None:
    err, tol = run_case(expr, config)
    assert err <= tol, f"{expr.describe()}: relative error {err:.3g} > {tol:.1g}"


# the interpreter computes bf16 dots wrongly (errors of 1e10); bf16 is checked on the GPU only
@pytest.mark.parametrize("expr", [e for e in AWKWARD if e.dtype != "bf16"], ids=lambda e: e.describe())
@pytest.mark.parametrize("config", [K16, K32], ids=["k16", "k32"])
def test_awkward_convolutions_match_reference(expr, config):
    check(expr, config)


@pytest.mark.parametrize("c", [16, 24, 48])
def test_both_loop_modes_handle_every_channel_count(c):
    """C = 48 walks taps x C chunks at BLOCK_K=16 and gathers at 32; C = 24 always gathers."""
    expr = Conv2d(2, 5, 7, c, 20, 3, 3, stride=(2, 1), padding=1)
    assert rs_outer(expr, K16) == (c % 16 == 0) and rs_outer(expr, K32) == (c % 32 == 0)
    check(expr, K16)
    check(expr, K32)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("epilogue", [(Scale(0.5), BiasAdd(), Gelu("tanh")), (BiasAdd(), Relu()), (Gelu(),)],
                         ids=lambda e: "+".join(s.name for s in e))
def test_epilogues_match_reference(dtype, epilogue):
    check(Conv2d(2, 6, 5, 8, 19, 3, 3, padding=1, dtype=dtype, epilogue=epilogue), K16)


def test_check_catches_a_transposed_filter():
    """The check must be able to fail: a kernel reading the 3x1 filter as 1x3 is caught."""
    expr = Conv2d(1, 6, 6, 4, 8, 3, 1, padding=(1, 0), dtype="fp32")
    wrong = Conv2d(1, 6, 6, 4, 8, 1, 3, padding=(0, 1), dtype="fp32")  # same output shape
    err, tol = run_case(expr, K16, kernel_expr=wrong)
    assert err > 10 * tol


def test_eager_is_the_same_convolution():
    expr = Conv2d(2, 7, 6, 5, 4, 3, 3, stride=2, padding=1, dtype="fp32", allow_tf32=False,
                  epilogue=(BiasAdd(), Scale(2.0), Relu()))
    x = CONV.inputs(expr, 1, "cpu")
    out = CONV.eager(expr, x)()
    assert out.shape == (2, 4, 3, 4)
    torch.testing.assert_close(out.double(), CONV.reference(expr, x.args), rtol=1e-5, atol=1e-5)


def test_workload_json_round_trip():
    expr = Conv2d(2, 9, 7, 3, 5, 3, 2, stride=(2, 1), padding=1, dilation=(1, 2), dtype="fp32",
                  epilogue=(Scale(0.5), BiasAdd()), allow_tf32=False)
    back = CONV.from_dict(json.loads(expr.to_json()))
    assert back == expr and back.key == expr.key
    assert back.padding == (1, 1) and back.p == 5 and back.q == 7
    assert Conv2d(1, 8, 8, 4, 4, 3, 3).key != Conv2d(1, 8, 8, 4, 4, 3, 3, padding=1).key


@pytest.mark.parametrize("bad", [
    dict(n=0), dict(c=1.5), dict(dtype="fp8"), dict(stride=0), dict(padding=-1), dict(dilation=(1, 0)),
    dict(stride=(1, 2, 3)), dict(h=2, r=5), dict(w=4, s=3, dilation=2), dict(epilogue=(BiasAdd(), BiasAdd())),
])
def test_bad_expressions_are_rejected(bad):
    args = dict(n=1, h=8, w=8, c=4, k=4, r=3, s=3) | bad
    with pytest.raises(ExprError):
        Conv2d(**args)


def test_output_size_error_says_why():
    with pytest.raises(ExprError, match=r"output size -2x7 <= 0"):
        Conv2d(1, 2, 9, 4, 4, 5, 3)


def test_cli_parses_shape_and_geometry():
    expr = CONV.from_cli("32,56,56,64,128,3,1", "bf16", {"stride": "2,1", "padding": "1", "epilogue": "bias,relu"})
    assert (expr.k, expr.r, expr.s, expr.stride, expr.padding, expr.dilation) == (128, 3, 1, (2, 1), (1, 1), (1, 1))
    assert [e.name for e in expr.epilogue] == ["bias", "relu"]
    assert CONV.from_cli("1,8,8,3,4,5", "fp16", {}).s == 5  # six dims: square filter


@pytest.mark.parametrize("shape,dtype,options", [
    ("1,8,8,3,4", "fp16", {}), ("1,8,8,3,4,3,3", "fp64", {}), ("1,8,8,3,4,3,3", "fp16", {"layout": "nt"}),
    ("1,8,8,3,4,3,3", "fp16", {"stride": "a"}), ("1,8,8,3,4,3,3", "fp16", {"dilation": "1,2,3"}),
    ("1,8,8,3,4,3,3", "fp16", {"padding": "-1"}),
])
def test_bad_cli_input_is_one_expr_error(shape, dtype, options):
    with pytest.raises(ExprError):
        CONV.from_cli(shape, dtype, options)


def test_space_keeps_k_steps_that_divide_c_and_prunes_useless_stages():
    space = CONV.space(Conv2d(8, 28, 28, 96, 128, 3, 3, padding=1), H100)
    configs = [space.config(int(i)) for i in space.valid_indices]
    assert configs and {c["BLOCK_K"] for c in configs} <= {16, 32}  # 64 does not divide 96
    assert set(configs[0]) == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "UNROLL"}
    odd = CONV.space(Conv2d(8, 64, 64, 3, 128, 7, 7, stride=2, padding=3), H100)
    assert len(odd.valid_indices) and {odd.config(int(i))["num_stages"] for i in odd.valid_indices} == {2}


def test_features_extend_the_gemm_views():
    from tritune.kernels.contraction.features import FEATURE_NAMES

    expr = Conv2d(8, 28, 28, 48, 64, 3, 3, padding=1)
    x = CONV.features(expr, H100, [K16, K32])
    assert x.shape == (2, len(FEATURE_NAMES) + 6)
    assert list(x[:, len(FEATURE_NAMES)]) == [1.0, 0.0]  # taps x chunks at 16, gather at 32
    assert x[0, -3] > x[1, -3]  # 9 taps x 3 chunks = 27 trips; the gather: 432 / 32 -> 14


@pytest.mark.system
def test_sm90_builds_use_wgmma_and_the_shared_estimate_holds_for_channel_chunks():
    fast = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3, UNROLL=1)
    cases = [
        (Conv2d(32, 56, 56, 64, 64, 3, 3, padding=1), Config.of(fast)),
        (Conv2d(8, 14, 14, 256, 256, 3, 3, padding=1, dtype="bf16", epilogue=(BiasAdd(), Relu())),
         Config.of(fast, BLOCK_N=128, num_stages=4)),
        (Conv2d(32, 224, 224, 3, 64, 7, 7, stride=2, padding=3), Config.of(fast, BLOCK_K=32, num_stages=2)),
    ]
    results = build_sm90(cases)
    assert [r["wgmma"] for r in results] == [True] * 3
    assert results[0]["shared"] == shared_estimate(cases[0][1], 2)
    assert results[1]["shared"] == shared_estimate(cases[1][1], 2)
    # the premise of the odd-C stage pruning: a gather of lone fp16 channels keeps one stage
    assert results[2]["shared"] == shared_estimate(cases[2][1].replace(num_stages=1), 2)
