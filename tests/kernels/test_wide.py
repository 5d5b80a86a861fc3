"""The wide GEMM (--op wide): projections sharing an input (q, k, v) in one launch, against float64
under the interpreter at awkward shapes (two and three weights, both layouts, biases, fp16 and
fp32, separate strided outputs); its space, features, library candidates and command line."""
import json

import pytest
import torch

from cases import run_case
from fakes import fake_gpu_session
from test_cli import cli

from tritune.kernels.expr import ExprError
from tritune.kernels.wide import launch
from tritune.kernels.wide.expr import Wide
from tritune.kernels.wide.family import WIDE
from tritune.kernels.wide.features import FEATURE_NAMES
from tritune.schedules.config import Config
from tritune.schedules.gated import TILING
from tritune.schedules.space import Limits
from tritune.tuner.cli import main
from tritune.tuner.worker.candidate import rel_error

H100 = Limits(232448, 132)
SMALL = Config.of(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2, UNROLL=2)


@pytest.mark.parametrize("expr", [
    Wide(37, (29, 13, 13), 53), Wide(1, (45, 70), 70, trans_b=False), Wide(50, (1, 33, 17), 33, bias=True),
    Wide(33, (47, 20), 29, dtype="fp32", allow_tf32=False, bias=True, trans_b=False),
    Wide(19, (70, 24, 24), 41, dtype="fp32", allow_tf32=False), Wide(40, (24, 40, 8), 64, trans_b=False, bias=True),
], ids=lambda e: e.describe().replace(" ", "-"))
def test_every_output_matches_the_reference(expr):
    err, tol = run_case(expr, SMALL)  # K = 64: the unmasked (EVEN_K) loop too
    assert err <= tol


@pytest.mark.parametrize("expr", [
    Wide(37, (29, 13, 13), 56), Wide(19, (40, 24), 72, trans_b=False, bias=True),
    Wide(33, (48, 20), 40, dtype="fp32", allow_tf32=False, bias=True),
], ids=lambda e: e.describe().replace(" ", "-"))
def test_tensor_descriptor_loads_match_the_reference(expr):
    """TMA=1: each segment's weight through its own descriptor, zero-filled past M, N and K."""
    err, tol = run_case(expr, SMALL.replace(TMA=1, UNROLL=1))
    assert err <= tol


@pytest.mark.parametrize("expr,split", [
    (Wide(37, (29, 13, 13), 150), 2), (Wide(5, (40, 24, 24), 300, bias=True), 4),
    (Wide(16, (40, 24), 96, dtype="fp32", allow_tf32=False, trans_b=False), 3),
    (Wide(5, (40, 24, 24), 300, bias=True, norm_eps=1e-5), 4),
    (Wide(16, (64, 16, 16), 256, dtype="fp32", allow_tf32=False, norm_eps=1e-6), 2),
], ids=lambda e: e.describe().replace(" ", "-") if isinstance(e, Wide) else f"split{e}")
def test_split_k_matches_the_reference_launch_after_launch(expr, split):
    """K slices finished by the in-kernel fixup (with a row norm: its partial sums of squares added
    there too); a second launch finds the counters re-armed."""
    x = WIDE.inputs(expr, 0, "cpu")
    kernel = WIDE.kernel(expr, SMALL.replace(SPLIT_K=split, UNROLL=1), WIDE.problem_of(expr, x.args))
    for _ in range(2):
        x.out.fill_(float("nan"))
        kernel(*x.args)
        assert rel_error(x.out, WIDE.reference(expr, x.args)) <= WIDE.tolerance(expr)


def test_split_k_without_the_sums_of_squares_of_the_other_slices_is_caught(monkeypatch):
    from tritune.kernels.wide import template

    plain = template._fixup(None)  # the fixup of an expression without a norm: tiles only
    monkeypatch.setattr(template, "_fixup", lambda eps: {**plain, "fixup_out": "last"} if eps is None else
                        {"fixup_out": "last", "fixup_call": plain["fixup_call"]})
    err, tol = run_case(Wide(16, (64, 16, 16), 256, dtype="fp32", allow_tf32=False, norm_eps=1e-6),
                        SMALL.replace(SPLIT_K=2, UNROLL=1))
    assert err > tol


def test_decode_splits_k_with_and_without_a_norm():
    for expr in (Wide(16, (2048, 512, 512), 2048), Wide(16, (2048, 512, 512), 2048, norm_eps=1e-6)):
        space = WIDE.space(expr, H100)
        assert {space.config(int(i))["SPLIT_K"] for i in space.valid_indices} >= {1, 2, 4}


@pytest.mark.parametrize("built", [Wide(20, (24, 24), 24, dtype="fp32", allow_tf32=False),  # no bias
                                   Wide(20, (24, 24), 24, dtype="fp32", allow_tf32=False, bias=True, trans_b=False)])
def test_a_wrong_kernel_is_caught(built):
    expr = Wide(20, (24, 24), 24, dtype="fp32", allow_tf32=False, bias=True)
    err, tol = run_case(expr, SMALL, kernel_expr=built)
    assert err > tol


def test_separate_outputs_and_operands_of_their_own_strides():
    """What replay launches: each output a tensor of its own, x with padded rows, [K, N] weights."""
    expr = Wide(21, (30, 12, 12), 40, dtype="fp32", allow_tf32=False, trans_b=False, bias=True)
    x = torch.randn(21, 48)[:, :40]  # rows padded: stride 48
    ws = [torch.randn(40, n) for n in expr.ns]  # [K, N_i]: a row stride of N_i each
    cs = [torch.full((21, n), float("nan")) for n in expr.ns]
    bs = [torch.randn(n) for n in expr.ns]
    WIDE.kernel(expr, SMALL, launch.problem_of(expr, x, *ws, *cs, *bs))(x, *ws, *cs, *bs)
    for c, w, b in zip(cs, ws, bs):
        assert rel_error(c, x.double() @ w.double() + b.double()) <= 1e-5


def test_the_concatenated_weight_follows_changes_to_the_weights():
    expr = Wide(16, (24, 8, 8), 32, dtype="fp32", allow_tf32=False, bias=True)
    x = WIDE.inputs(expr, 0, "cpu")
    cat = WIDE.library(expr, "mm_cat")
    first = cat(*x.args).clone()
    assert rel_error(first, WIDE.reference(expr, x.args)) <= 1e-6
    x.args[2].mul_(-1)  # in place: the same tensor, a new version
    x.args[-1].add_(1)
    again = cat(*x.args)
    assert again.data_ptr() == x.out.data_ptr()  # written in place, no copy
    assert rel_error(again, WIDE.reference(expr, x.args)) <= 1e-6 and rel_error(again, first) > 0.1


@pytest.mark.system
def test_the_space_has_the_plain_tiling_knobs_sized_by_the_widest_weight():
    space = WIDE.space(Wide(2048, (2048, 512, 512), 2048), H100)
    assert [k.name for k in space.knobs] == [*TILING, "SPLIT_K", "TMA"] and space.size > 0
    configs = [space.config(int(i)) for i in space.valid_indices]
    assert {c["BLOCK_N"] for c in configs} >= {64, 128, 256} and {c["TMA"] for c in configs} == {0, 1}
    # tensor descriptors only where every row is 16-byte aligned: here one weight's [K, N] rows are not
    odd = WIDE.space(Wide(256, (256, 60), 256, trans_b=False), H100)
    assert not any(odd.config(int(i))["TMA"] for i in odd.valid_indices)
    narrow = WIDE.space(Wide(16, (40, 24), 64), H100)
    assert {narrow.config(int(i))["BLOCK_N"] for i in narrow.valid_indices} == {16, 32, 64}  # 40 wide at most
    x = WIDE.features(Wide(2048, (2048, 512, 512), 2048, bias=True), H100, [Config.of(SMALL, BLOCK_N=128)])
    assert x.shape == (1, len(FEATURE_NAMES))
    # three segments: 16 + 4 + 4 tiles of 128; no tile padded; a bias
    assert list(x[0, -4:]) == [3, 24, 0, 1]
    assert launch.ends(Wide(8, (130, 33), 8), 64) == (3, 4)  # each width rounds up on its own


@pytest.mark.parametrize("shape,options,message", [
    ("64,32", {}, "bad --shape"), ("64,32,16,8,8,8,32", {}, "bad --shape"), ("64,0,32,16", {}, "bad --shape"),
    ("64,32,16,32", {"layout": "tn"}, "bad --layout 'tn'"), ("64,32,16,32", {"epilogue": "relu"}, "only 'bias'"),
    ("64,32,16,32", {"activation": "silu"}, "--activation does not apply to --op wide"),
])
def test_bad_command_lines_are_one_expr_error(shape, options, message):
    with pytest.raises(ExprError, match=message):
        WIDE.from_cli(shape, "fp16", options)
    assert WIDE.from_cli("64,2048,512,512,32", "bf16", {"layout": "nn", "epilogue": "bias"}) == \
        Wide(64, (2048, 512, 512), 32, "bf16", trans_b=False, bias=True)


def test_bad_specs_are_expr_errors():
    for ns in ((8,), (8, 8, 8, 8), (8, 0), "88", 8, (8, 2.0)):
        with pytest.raises(ExprError, match="ns must be"):
            Wide(8, ns, 8)
    assert Wide(8, [8, 4], 8).ns == (8, 4) and Wide(8, [8, 4], 8).describe() == "wide 8x(8+4)x8 fp16"


def test_the_command_line_refuses_a_bad_wide_shape_in_one_line(capsys, tmp_path):
    code, _, err = cli(capsys, "run", "--op", "wide", "--shape", "64,64,64", "--db", str(tmp_path / "t.db"))
    assert code == 2 and "bad --shape '64,64,64'" in err and err.count("\n") == 1


@pytest.mark.system
def test_tune_cli_runs_wide_end_to_end(monkeypatch, tmp_path):
    """The tuner's wiring with a fake GPU worker: the sa search proposes from this space and features."""
    fake_gpu_session(monkeypatch)
    summary = tmp_path / "s.json"
    main(["run", "--op", "wide", "--shape", "2048,2048,512,512,2048", "--trials", "20", "--batch-size", "8",
          "--db", str(tmp_path / "t.db"), "--summary-json", str(summary)])
    out = json.loads(summary.read_text())
    expr = Wide(2048, (2048, 512, 512), 2048)
    assert out["workload"] == expr.to_dict() and out["trials"] == 20
    assert set(out["best_config"]) == {*TILING, "SPLIT_K", "TMA"} or "library" in out["best_config"]


def test_the_replayed_op_loads_through_descriptors_where_the_operands_allow(monkeypatch):
    """torch.ops.tritune.wide with TMA=1: the kernel where rows are 16-byte aligned, torch ops
    (the same values) where x's rows are not."""
    from tritune.kernels.backend import sites, tuned_op

    launched = []
    original = sites.wrap_triton
    monkeypatch.setattr(sites, "wrap_triton", lambda fn: launched.append(1) or original(fn))
    expr = Wide(37, (24, 8), 56, dtype="fp32", allow_tf32=False)
    spec = tuned_op.spec_of(expr, SMALL.replace(TMA=1, UNROLL=1))
    x, ws = torch.randn(37, 56), [torch.randn(24, 56), torch.randn(8, 56)]
    padded = torch.randn(37, 61)[:, :56]  # rows 244 bytes apart: no descriptor can read them
    padded.copy_(x)
    for operand in (x, padded):
        outs = tuned_op.WIDE_OP(operand, [w.t() for w in ws], [], spec)
        assert all(rel_error(o, x.double() @ w.double().t()) <= 1e-5 for o, w in zip(outs, ws))
    assert launched == [1]
