"""softmax / layernorm: the row-reduction kernels against float64 torch under the interpreter in both
modes (one block per row, two passes over chunks); expression, CLI, space, features; sm_90 builds."""
import json
import math

import numpy as np
import pytest
import torch

from cases import run_case
from fakes import fake_gpu_session
from test_codegen_sm90 import build_sm90

from tritune.kernels.rows.features import FEATURE_NAMES
from tritune.kernels.expr import ExprError
from tritune.kernels.family import family
from tritune.kernels.rows.expr import AWKWARD, LayerNorm, Softmax
from tritune.kernels.rows.template import single_pass
from tritune.schedules.config import Config
from tritune.schedules.rows import MAX_PER_THREAD, MIN_CHUNK_BYTES
from tritune.schedules.space import Limits
from tritune.tuner.cli import main
from tritune.tuner.worker.candidate import rel_error

H100 = Limits.for_capability(9, 0)
BENCH = (Softmax(4096, 4096), Softmax(8192, 1024), Softmax(2048, 50257), LayerNorm(8192, 4096), LayerNorm(4096, 1024))


def whole(expr, rows=4, warps=4) -> Config:
    """A config holding each row in one block."""
    return Config.of(ROWS=rows, BLOCK_N=max(16, 1 << (expr.n - 1).bit_length()), num_warps=warps)


def looping(expr, rows=2, warps=2) -> Config:
    """A config walking each row in about four chunks, the last one partial unless N is a power of two."""
    return Config.of(ROWS=rows, BLOCK_N=max(16, (1 << (expr.n - 1).bit_length()) // 4), num_warps=warps)


def check(expr, config, seed=0) -> None:
    err, tol = run_case(expr, config, seed)
    assert err <= tol, f"{expr.describe()} {dict(config)}: relative error {err:.3g} > {tol:.1g}"


def launch(expr, config, args) -> None:
    fam = family(expr.op)
    fam.kernel(expr, config, fam.problem_of(expr, args))(*args)


@pytest.mark.parametrize("expr", AWKWARD, ids=lambda e: e.describe())
@pytest.mark.parametrize("make", [whole, looping], ids=["whole", "looping"])
def test_awkward_rows_match_reference(expr, make):
    if make is looping and expr.n > 16:
        assert not single_pass(expr, make(expr))
    check(expr, make(expr))


@pytest.mark.parametrize("op", [Softmax, LayerNorm])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_every_dtype_in_both_modes_with_more_rows_per_program_than_rows(op, dtype):
    """bf16 is stored as bf16 and computed in fp32, which the interpreter gets right."""
    expr = op(3, 700, dtype)
    check(expr, whole(expr, rows=8))
    check(expr, looping(expr, rows=8), seed=1)


@pytest.mark.parametrize("op", [Softmax, LayerNorm])
def test_chunks_that_divide_rows_exactly_take_the_unmasked_path(op):
    expr = op(5, 512, "fp32")
    check(expr, Config.of(ROWS=2, BLOCK_N=512, num_warps=4))
    check(expr, Config.of(ROWS=1, BLOCK_N=128, num_warps=1))


def test_layernorm_of_one_column_is_the_bias():
    expr = LayerNorm(4, 1, "fp32")
    check(expr, Config.of(ROWS=4, BLOCK_N=16, num_warps=1))


@pytest.mark.parametrize("make", [whole, looping], ids=["whole", "looping"])
def test_strided_rows_and_columns_leave_the_gaps_alone(make):
    """x rows 40 elements apart, y rows 48 apart and transposed-stored: the gaps keep their sentinel."""
    for expr in (Softmax(6, 33, "fp32"), LayerNorm(6, 33, "fp32")):
        x = torch.randn(6, 40)[:, :33]
        y_store = torch.full((48, 6), -7.0)  # y[m, n] = y_store[n, m]
        y = y_store[:33].t()
        args = (x, torch.randn(33), torch.randn(66)[::2], y) if expr.op == "layernorm" else (x, y)
        launch(expr, make(expr), args)
        assert rel_error(y, family(expr.op).reference(expr, args)) <= 1e-5
        assert bool((y_store[33:] == -7.0).all())


FAR = [  # (expression, how its input is moved away from zero, tolerance)
    # softmax of logits in the hundreds must subtract the row max: exp overflows otherwise
    (Softmax(4, 300, "fp32"), lambda x: x.mul_(100), 1e-5),
    # the fp32 mean of rows near 1e4 is good to ~1e-3 (its ulp) whatever the algorithm; the variance
    # from E[x^2] - E[x]^2 would be off by whole units (the ulp of 1e8 is 8)
    (LayerNorm(4, 300, "fp32"), lambda x: x.add_(1e4), 1e-2),
]


@pytest.mark.parametrize("make", [whole, looping], ids=["whole", "looping"])
@pytest.mark.parametrize("expr,move,tol", FAR, ids=["softmax", "layernorm"])
def test_rows_far_from_zero(make, expr, move, tol):
    fam = family(expr.op)
    x = fam.inputs(expr, 0, "cpu")
    move(x.args[0])
    launch(expr, make(expr), x.args)
    assert rel_error(x.out, fam.reference(expr, x.args)) <= tol


def test_check_catches_wrong_kernels():
    """The check must be able to fail: a layernorm built with another eps, a softmax that skips the
    last column (left NaN), and a softmax over the transposed rows."""
    err, tol = run_case(LayerNorm(8, 64, "fp32"), whole(LayerNorm(8, 64)), kernel_expr=LayerNorm(8, 64, "fp32", eps=0.5))
    assert err > 10 * tol
    err, _ = run_case(Softmax(8, 64, "fp32"), whole(Softmax(8, 64)), kernel_expr=Softmax(8, 63, "fp32"))
    assert math.isinf(err)
    expr = Softmax(8, 8, "fp32")
    x = family("softmax").inputs(expr, 0, "cpu")
    launch(expr, whole(expr), (x.args[0].t(), x.out))
    assert rel_error(x.out, family("softmax").reference(expr, x.args)) > 0.1


@pytest.mark.parametrize("expr", [Softmax(5, 77, "fp32"), LayerNorm(5, 77, "fp32", eps=1e-3)], ids=lambda e: e.op)
def test_eager_is_the_same_op(expr):
    fam = family(expr.op)
    x = fam.inputs(expr, 3, "cpu")
    out = fam.eager(expr, x)()
    torch.testing.assert_close(out.double(), fam.reference(expr, x.args), rtol=1e-5, atol=1e-6)


def test_rate_is_bandwidth():
    value, unit = family("layernorm").rate(LayerNorm(1000, 500, "fp32"), 1.0)
    assert unit == "TB/s" and value == pytest.approx((2 * 1000 + 2) * 500 * 4 / 1e-3 / 1e12)
    assert Softmax(10, 20).bytes == 2 * 10 * 20 * 2


def test_workload_json_round_trip():
    for expr in (Softmax(3, 4099, "bf16"), LayerNorm(8, 1000, "fp32", eps=1e-6), LayerNorm(2, 3, eps=0)):
        back = family(expr.op).from_dict(json.loads(expr.to_json()))
        assert back == expr and back.key == expr.key and back.describe() == expr.describe()
    assert LayerNorm(8, 16).key != LayerNorm(8, 16, eps=1e-6).key != Softmax(8, 16).key
    assert LayerNorm(8, 16, eps=0).key == LayerNorm(8, 16, eps=0.0).key


@pytest.mark.parametrize("bad", [dict(m=0), dict(n=1.5), dict(dtype="fp8"), dict(m=True), dict(m=65536, n=65536)])
@pytest.mark.parametrize("op", [Softmax, LayerNorm])
def test_bad_expressions_are_rejected(op, bad):
    with pytest.raises(ExprError):
        op(**(dict(m=4, n=8) | bad))


@pytest.mark.parametrize("eps", [-1e-5, float("nan"), float("inf"), "1e-5", True])
def test_bad_eps_is_rejected(eps):
    with pytest.raises(ExprError, match="eps"):
        LayerNorm(4, 8, eps=eps)


@pytest.mark.parametrize("spec", [{"op": "matmul", "m": 4, "n": 4, "dtype": "fp16"},
                                  {"op": "softmax", "m": 4, "dtype": "fp16"},
                                  {"op": "softmax", "m": 4, "n": 4, "dtype": "fp16", "eps": 1.0}])
def test_bad_specs_are_expr_errors(spec):
    with pytest.raises(ExprError):
        family("softmax").from_dict(spec)


def test_cli():
    assert family("layernorm").from_cli("8192,4096", "bf16", {"eps": "1e-6"}) == LayerNorm(8192, 4096, "bf16", 1e-6)
    assert family("softmax").from_cli("2048x50257", "fp16", {}) == Softmax(2048, 50257)
    assert "M,N" in family("softmax").cli_help and "--eps" in family("layernorm").cli_help


@pytest.mark.parametrize("op,shape,dtype,options", [
    ("softmax", "4096", "fp16", {}), ("softmax", "4,a", "fp16", {}), ("softmax", "4,0", "fp16", {}),
    ("softmax", "4,8", "fp64", {}), ("softmax", "4,8", "fp16", {"eps": "1e-5"}),
    ("layernorm", "4,8", "fp16", {"layout": "nt"}), ("layernorm", "4,8", "fp16", {"eps": "small"}),
])
def test_bad_cli_input_is_one_expr_error(op, shape, dtype, options):
    with pytest.raises(ExprError):
        family(op).from_cli(shape, dtype, options)


@pytest.mark.parametrize("expr", BENCH, ids=lambda e: e.describe())
def test_space_keeps_only_configs_that_fit_and_fill(expr):
    space = family(expr.op).space(expr, H100)
    configs = [space.config(int(i)) for i in space.valid_indices]
    assert 30 <= len(configs) <= 120
    eb = 2
    for c in configs:
        per_thread = c["ROWS"] * c["BLOCK_N"] // (32 * c["num_warps"])
        assert per_thread <= MAX_PER_THREAD and (per_thread * eb >= 16 or c["num_warps"] == 1)
        assert c["BLOCK_N"] < 2 * expr.n
        assert -(-expr.m // c["ROWS"]) >= H100.sms or c["ROWS"] == 1
        assert single_pass(expr, c) or c["BLOCK_N"] * eb >= MIN_CHUNK_BYTES
    modes = {single_pass(expr, c) for c in configs}
    assert modes == {True, False}  # both modes are open to the search at every benchmark shape


def test_space_of_extreme_shapes():
    one = family("softmax").space(Softmax(1, 1), H100)
    assert [dict(one.config(int(i))) for i in one.valid_indices] == [dict(ROWS=1, BLOCK_N=16, num_warps=1)]
    long = family("layernorm").space(LayerNorm(1, 1_000_000, "fp32"), H100)
    assert len(long.valid_indices) and all(long.config(int(i))["BLOCK_N"] < 1_000_000 for i in long.valid_indices)
    narrow = family("softmax").space(Softmax(100_000, 8), H100)
    assert max(narrow.config(int(i))["ROWS"] for i in narrow.valid_indices) == 64
    assert family("softmax").space(Softmax(4096, 4096), H100).why_invalid(
        Config.of(ROWS=1, BLOCK_N=8192, num_warps=4)) == "BLOCK_N=8192 far longer than a row (4096)"


def test_features_are_finite_and_say_what_the_config_does():
    expr = Softmax(2048, 50257)
    configs = [Config.of(ROWS=1, BLOCK_N=65536, num_warps=32), Config.of(ROWS=4, BLOCK_N=4096, num_warps=8)]
    x = family("softmax").features(expr, H100, configs)
    assert x.shape == (2, len(FEATURE_NAMES)) and np.isfinite(x).all()
    col = {name: x[:, i] for i, name in enumerate(FEATURE_NAMES)}
    assert list(col["single_pass"]) == [1, 0] and list(col["chunks"]) == [0, math.log2(13)]
    assert list(col["programs"]) == [11, 9] and list(col["per_thread"]) == [64, 64]
    space = family("layernorm").space(LayerNorm(7, 3), H100)
    small = family("layernorm").features(LayerNorm(7, 3), H100, [space.config(int(i)) for i in space.valid_indices])
    assert np.isfinite(small).all()


@pytest.mark.system
def test_sm90_builds_load_full_vectors_where_rows_are_aligned():
    """Row strides of multiples of 8 fp16 elements get 16-byte loads in both modes; N = 4099 cannot."""
    cases = [(Softmax(4096, 4096), Config.of(ROWS=1, BLOCK_N=4096, num_warps=8)),
             (Softmax(8192, 1000), Config.of(ROWS=2, BLOCK_N=256, num_warps=2)),
             (LayerNorm(8192, 4096, "bf16"), Config.of(ROWS=1, BLOCK_N=1024, num_warps=4)),
             (Softmax(4096, 4099), Config.of(ROWS=1, BLOCK_N=8192, num_warps=16)),
             (LayerNorm(2048, 50257, "fp32", eps=1e-6), Config.of(ROWS=1, BLOCK_N=2048, num_warps=8))]
    ptx = [r["ptx"] for r in build_sm90(cases, ptx=True)]
    assert len(ptx) == len(cases)
    wide = [any("ld.global" in line and ".v4." in line for line in p.splitlines()) for p in ptx]
    assert wide == [True, True, True, False, False]


@pytest.mark.system
def test_tune_cli_runs_softmax_end_to_end(monkeypatch, tmp_path):
    """The tuner's wiring with a fake GPU worker: the sa search proposes from this space and features,
    and the summary is rated in TB/s."""
    fake_gpu_session(monkeypatch)
    summary = tmp_path / "s.json"
    main(["run", "--op", "softmax", "--shape", "4096,4096", "--trials", "20", "--batch-size", "8",
          "--db", str(tmp_path / "t.db"), "--summary-json", str(summary)])
    out = json.loads(summary.read_text())
    assert out["workload"] == Softmax(4096, 4096).to_dict() and out["trials"] == 20
    assert out["space_valid"] == len(family("softmax").space(Softmax(4096, 4096), H100).valid_indices)
    assert out["ours_rate"].endswith("TB/s") and set(out["best_config"]) == {"ROWS", "BLOCK_N", "num_warps"}
