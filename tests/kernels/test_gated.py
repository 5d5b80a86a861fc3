"""The gated dual GEMM (--op gated): kernels against float64 under the interpreter at awkward
shapes (both activations, both weight layouts, biases, both ways of feeding the MMA), its space,
its library candidates, its command line; and sm_90 builds of the new kernels (the general
epilogue's too) without a GPU."""
import numpy as np
import pytest
import torch

from cases import run_case
from test_codegen_sm90 import build_sm90
from test_cli import cli

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import Binary, BiasAdd, Gelu, Input, Unary
from tritune.kernels.expr import ExprError
from tritune.kernels.gated import launch
from tritune.kernels.gated.expr import Gated
from tritune.kernels.gated.family import GATED
from tritune.kernels.gated.features import FEATURE_NAMES
from tritune.schedules.config import Config
from tritune.schedules.contraction import shared_estimate
from tritune.schedules.space import Limits
from tritune.tuner.worker.candidate import rel_error

H100 = Limits(232448, 132)
SMALL = Config.of(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2, UNROLL=2, FUSE=0)


@pytest.mark.parametrize("fuse", [0, 1])
@pytest.mark.parametrize("expr", [
    Gated(37, 29, 53), Gated(1, 45, 70, activation="gelu", trans_b=False),
    Gated(50, 1, 33, activation="gelu_tanh", bias=True), Gated(33, 47, 29, dtype="fp32", activation="gelu", bias=True),
    Gated(19, 70, 41, dtype="fp32", allow_tf32=False, trans_b=False), Gated(40, 24, 64, activation="gelu_tanh"),
], ids=lambda e: e.describe().replace(" ", "-"))
def test_dual_gemm_matches_the_reference(expr, fuse):
    err, tol = run_case(expr, SMALL.replace(FUSE=fuse))  # K = 64: the unmasked (EVEN_K) loop too
    assert err <= tol


@pytest.mark.parametrize("expr,fuse", [
    (Gated(37, 29, 56), 0), (Gated(37, 29, 56), 1), (Gated(19, 40, 72, activation="gelu", trans_b=False, bias=True), 0),
    (Gated(19, 40, 72, activation="gelu", trans_b=False, bias=True), 1),
    (Gated(33, 24, 48, dtype="fp32", activation="gelu_tanh", bias=True), 0),  # FUSE joins 16-bit tiles only
], ids=str)
def test_tensor_descriptor_loads_match_the_reference(expr, fuse):
    """TMA=1: whole tiles through descriptors, zero-filled past M, N and K (no tile divides them)."""
    err, tol = run_case(expr, SMALL.replace(FUSE=fuse, TMA=1, UNROLL=1))
    assert err <= tol


def test_tensor_descriptors_only_where_rows_are_16_byte_aligned():
    """fp16 rows of K = 56 are 112 bytes (aligned), of K = 53 not; [K, N] weights need N aligned too."""
    aligned = GATED.space(Gated(2048, 8192, 2048), H100)
    assert {c["TMA"] for c in aligned.sample(np.random.default_rng(0), 300)} == {0, 1}
    for unaligned in (Gated(64, 64, 53), Gated(64, 60, 64, trans_b=False), Gated(64, 64, 50, dtype="fp32")):
        space = GATED.space(unaligned, H100)
        valid = space.sample(np.random.default_rng(0), 100)
        assert not any(c["TMA"] for c in valid) and "16-byte" in space.why_invalid(valid[0].replace(TMA=1))
    x = torch.randn(20, 56)[:, :53]  # padded rows: 112 bytes apart, but 53 wide
    expr = Gated(20, 24, 53)
    with pytest.raises(ValueError, match="config uses TMA but"):
        problem = launch.problem_of(expr, x.half(), *GATED.inputs(expr, 0, "cpu").args[1:4])
        GATED.kernel(expr, SMALL.replace(TMA=1), problem)


@pytest.mark.parametrize("expr,split,fuse", [
    (Gated(5, 40, 300, bias=True), 4, 1), (Gated(7, 33, 200, dtype="fp32", allow_tf32=False, trans_b=False, bias=True), 3, 0),
    (Gated(5, 40, 300, bias=True, norm_eps=1e-5), 3, 0), (Gated(16, 40, 256, norm_eps=1e-6), 2, 1),
    (Gated(16, 40, 256, dtype="fp32", allow_tf32=False, norm_eps=1e-6), 4, 0),
], ids=lambda e: e.describe().replace(" ", "-") if isinstance(e, Gated) else str(e))
def test_split_k_matches_the_reference_launch_after_launch(expr, split, fuse):
    """K slices of both products finished by the in-kernel fixup (with a row norm: the slices'
    sums of squares added there too); a second launch finds the counters re-armed."""
    x = GATED.inputs(expr, 0, "cpu")
    kernel = GATED.kernel(expr, SMALL.replace(SPLIT_K=split, FUSE=fuse, UNROLL=1), GATED.problem_of(expr, x.args))
    for _ in range(2):
        x.out.fill_(float("nan"))
        kernel(*x.args)
        assert rel_error(x.out, GATED.reference(expr, x.args)) <= GATED.tolerance(expr)


def test_split_k_without_the_sums_of_squares_of_the_other_slices_is_caught(monkeypatch):
    from tritune.kernels.gated import template

    real = template._fixup
    monkeypatch.setattr(template, "_fixup", lambda eps: {**real(eps), "fixup_ss_add": ""})
    err, tol = run_case(Gated(16, 40, 256, dtype="fp32", allow_tf32=False, norm_eps=1e-6),
                        SMALL.replace(SPLIT_K=2, UNROLL=1))
    assert err > tol


def test_a_wrong_activation_is_caught():
    expr = Gated(20, 24, 20, dtype="fp32", activation="silu")
    err, tol = run_case(expr, SMALL, kernel_expr=Gated(20, 24, 20, dtype="fp32", activation="gelu"))
    assert err > tol


def test_strided_operands_and_weights_of_different_strides():
    expr = Gated(21, 30, 40, dtype="fp32", allow_tf32=False, activation="gelu")
    x = torch.randn(21, 48)[:, :40]  # rows padded: stride 48
    w1, w2 = torch.randn(30, 40), torch.randn(30, 40)
    out = torch.empty(21, 30)
    GATED.kernel(expr, SMALL, launch.problem_of(expr, x, w1, w2, out))(x, w1, w2, out)
    want = torch.nn.functional.gelu(x.double() @ w1.double().t()) * (x.double() @ w2.double().t())
    assert rel_error(out, want) <= 1e-5
    with pytest.raises(ValueError, match="same strides"):
        launch.problem_of(expr, x, w1, torch.randn(40, 30).t(), out)


def test_the_concatenated_weight_follows_changes_to_the_weights():
    expr = Gated(16, 24, 32, dtype="fp32", allow_tf32=False, bias=True)
    x = GATED.inputs(expr, 0, "cpu")
    cat = GATED.library(expr, "mm_cat")
    first = cat(*x.args).clone()
    assert rel_error(first, GATED.reference(expr, x.args)) <= 1e-6
    x.args[1].mul_(-1)  # in place: the same tensor, a new version
    x.args[5].add_(1)
    again = cat(*x.args)
    assert rel_error(again, GATED.reference(expr, x.args)) <= 1e-6 and rel_error(again, first) > 0.1


@pytest.mark.system
def test_the_space_pairs_tiles_with_two_accumulators_and_fuses_16_bit_tiles_only():
    space = GATED.space(Gated(2048, 8192, 2048), H100)
    configs = [space.config(int(i)) for i in space.valid_indices]
    assert {c["FUSE"] for c in configs} == {0, 1}
    decode = GATED.space(Gated(16, 5632, 2048, norm_eps=1e-6), H100)
    assert {decode.config(int(i))["SPLIT_K"] for i in decode.valid_indices} >= {1, 2, 4}  # a short grid splits K
    assert all(shared_estimate(c, 2, 2) <= H100.shared_bytes for c in configs)
    assert all(2 * c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"]) <= 128 for c in configs)
    assert not any(c["FUSE"] and c["BLOCK_N"] > 128 for c in configs)
    assert all(c["FUSE"] == 0 for c in GATED.space(Gated(512, 512, 512, dtype="fp32"), H100).sample(
        np.random.default_rng(0), 200))
    x = GATED.features(Gated(2048, 8192, 2048, bias=True), H100, configs[:3])
    assert x.shape == (3, len(FEATURE_NAMES)) and list(x[:, -2]) == [1, 1, 1]


@pytest.mark.parametrize("options,message", [
    ({"activation": "relu"}, "bad --activation 'relu'"), ({"layout": "tn"}, "bad --layout 'tn'"),
    ({"epilogue": "relu"}, "only 'bias'"), ({"stride": "2"}, "--stride does not apply to --op gated"),
])
def test_bad_options_are_one_expr_error(options, message):
    with pytest.raises(ExprError, match=message):
        GATED.from_cli("64,128,32", "fp16", options)
    assert GATED.from_cli("64,128,32", "bf16", {"activation": "gelu_tanh", "layout": "nn", "epilogue": "bias"}) == \
        Gated(64, 128, 32, "bf16", "gelu_tanh", trans_b=False, bias=True)


@pytest.mark.parametrize("args,needle", [
    (["--shape", "64,64", "--activation", "silu"], "bad --shape"),
    (["--shape", "8,8,8", "--activation", "tanh"], "bad --activation"),
    (["--op", "matmul", "--shape", "8", "--activation", "silu"], "--activation does not apply to --op matmul"),
])
def test_the_command_line_refuses_bad_gated_options_in_one_line(capsys, tmp_path, args, needle):
    args = args if "--op" in args else ["--op", "gated", *args]
    code, _, err = cli(capsys, "run", *args, "--db", str(tmp_path / "t.db"))
    assert code == 2 and needle in err and err.count("\n") == 1


@pytest.mark.system
def test_the_new_kernels_build_for_sm90_with_warp_group_mmas():
    """The dual GEMM both ways (its shared memory as estimated, the fused mma.sync fallback staging the
    joined tile once more), and general epilogues with every knob of the contraction template."""
    tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, UNROLL=1)
    epilogue = (BiasAdd(), Gelu("tanh"), Binary("add", Input("mn", "fp16")), Binary("mul", Input("m", "fp32")),
                Binary("mul", (Unary("sigmoid"),)))
    gated = [(Gated(4096, 4096, 4096, activation="gelu", bias=True), Config.of(tile, FUSE=0)),
             (Gated(4096, 4096, 4096, dtype="bf16", activation="gelu_tanh"), Config.of(tile, FUSE=1)),
             (Gated(4096, 4096, 4096, trans_b=False), Config.of(tile, BLOCK_M=32, num_warps=4, FUSE=1))]
    # tensor-descriptor loads: both weight layouts, both ways of feeding the MMA, one 8-byte
    # arrival barrier per stage on top of the tiles
    gated += [(Gated(2048, 8192, 2048), Config.of(tile, FUSE=0, TMA=1)),
              (Gated(2048, 8192, 2048, dtype="bf16", trans_b=False), Config.of(tile, BLOCK_N=64, FUSE=1, TMA=1))]
    matmul = [(Matmul(4096, 4096, 4096, epilogue=epilogue), Config.of(tile, **knobs))
              for knobs in (dict(TMA=2, PERSISTENT=1), dict(TMA=1, num_warps=4, WARP_SPEC=1), dict(SPLIT_K=4))]
    results = build_sm90(gated + matmul)
    assert [r["wgmma"] for r in results] == [True, True, False, True, True, True, True, True]
    assert [r["shared"] for r in results[:3]] == [shared_estimate(c, 2, 2) + (32768 if c["BLOCK_M"] == 32 else 0)
                                                  for _, c in gated[:3]]
    assert all(0 <= shared_estimate(c, 2, 2) - r["shared"] <= 32 for (_, c), r in zip(gated[3:], results[3:5]))
    # what a compiled model launches (specialised, None for the missing biases) builds the same
    replay = build_sm90(gated[3:], replay=True)
    assert [r["shared"] for r in replay] == [r["shared"] for r in results[3:5]] and all(r["wgmma"] for r in replay)


def test_the_replayed_op_loads_through_descriptors_where_the_operands_allow(monkeypatch):
    """torch.ops.tritune.gated with TMA=1: the kernel where rows are 16-byte aligned, torch ops
    (the same values) where x's rows are not."""
    from tritune.kernels.backend import sites, tuned_op

    launched = []
    original = sites.wrap_triton
    monkeypatch.setattr(sites, "wrap_triton", lambda fn: launched.append(1) or original(fn))
    expr = Gated(37, 24, 56, dtype="fp32", allow_tf32=False)
    spec = tuned_op.spec_of(expr, SMALL.replace(TMA=1, UNROLL=1))
    x, w1, w2 = torch.randn(37, 56), torch.randn(24, 56), torch.randn(24, 56)
    padded = torch.randn(37, 61)[:, :56]  # rows 244 bytes apart: no descriptor can read them
    padded.copy_(x)
    want = torch.nn.functional.silu(x.double() @ w1.double().t()) * (x.double() @ w2.double().t())
    for operand in (x, padded):
        assert rel_error(tuned_op.GATED_OP(operand, w1.t(), w2.t(), None, None, spec), want) <= 1e-5
    assert launched == [1]
