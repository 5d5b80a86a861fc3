"""Every registered op family honours one contract, with no per-family code here: a new family
(one folder under tritune/kernels, one schedule module, one registry line) is held to it at once.

Its expressions round-trip through their stored form; bad input is an ExprError; under the
interpreter its default config computes the float64 reference and a wrong kernel is caught; its
eager PyTorch version agrees with the reference; its fault hook refuses unknown faults and accepts
every known one (they misbehave on a GPU: see `TRITUNE_GPU_TESTS=1 pytest tests/gpu -k faults`).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cases import run_case

from tritune.kernels.expr import DTYPES, ExprError
from tritune.kernels.family import REGISTRY, expr_from_dict, family
from tritune.kernels.faults import FAULTS
from tritune.schedules.config import Config
from tritune.tuner.worker.candidate import rel_error

OPS = sorted(REGISTRY)


def cpu_examples(op: str) -> list:
    """The family's examples the interpreter can check (it computes bf16 dots wrongly: bf16 is proven on a GPU)."""
    return [e for e in family(op).examples() if e.dtype != "bf16"]


@pytest.mark.parametrize("op", OPS)
def test_examples_cover_every_dtype_and_round_trip(op):
    examples = family(op).examples()
    assert {e.dtype for e in examples} == set(DTYPES)
    for expr in examples:
        again = expr_from_dict(json.loads(expr.to_json()))
        assert again == expr and again.key == expr.key and family(op).from_dict(expr.to_dict()) == expr
    assert len({e.key for e in examples}) == len(examples)


@pytest.mark.parametrize("op", OPS)
def test_a_prior_lifted_from_another_op_has_this_ops_features(op):
    """A family that learns from other ops (`prior_from`) lifts their feature rows to the width of
    its own, for each of its examples; one that names none refuses to lift."""
    from tritune.schedules.space import Limits

    fam, limits = family(op), Limits.for_capability(9, 0)
    if not fam.prior_from:
        with pytest.raises(NotImplementedError):
            fam.lift_prior(fam.examples()[0], None)
        return
    for source in fam.prior_from:
        other = family(source).examples()[0]
        configs = family(source).space(other, limits).sample(np.random.default_rng(0), 4)
        rows = family(source).features(other, limits, configs)
        for expr in fam.examples():
            own = fam.features(expr, limits, fam.space(expr, limits).sample(np.random.default_rng(0), 2))
            lifted = fam.lift_prior(expr, rows)
            assert lifted.shape == (len(rows), own.shape[1]) and np.isfinite(lifted).all()


@pytest.mark.parametrize("op", OPS)
def test_bad_input_is_one_expr_error(op):
    fam = family(op)
    spec = fam.examples()[0].to_dict()
    with pytest.raises(ExprError, match="--shape"):
        fam.from_cli("not-a-shape", "fp16", {})
    with pytest.raises(ExprError, match="--bogus"):
        fam.from_cli("4", "fp16", {"bogus": "1"})  # an option the op does not take is never ignored
    with pytest.raises(ExprError, match="dtype"):
        fam.from_dict({**spec, "dtype": "fp8"})
    for name in (k for k, v in spec.items() if type(v) is int and v):  # (a field whose 0 means "none" stays valid)
        with pytest.raises(ExprError, match=name):
            fam.from_dict({**spec, name: 0})
    with pytest.raises(ExprError):
        fam.from_dict({"op": spec["op"]})
    with pytest.raises(ExprError, match="unknown op"):
        expr_from_dict({**spec, "op": "no-such-op"})


@pytest.mark.parametrize("op", OPS)
def test_the_default_config_computes_the_reference_and_a_wrong_kernel_is_caught(op):
    fam = family(op)
    for expr in cpu_examples(op):
        err, tol = run_case(expr, fam.default_config(expr))
        assert err <= tol, expr.describe()
    expr = cpu_examples(op)[0]
    err, tol = run_case(expr, fam.default_config(expr).replace(fault="wrong"))
    assert err > tol


@pytest.mark.parametrize("op", OPS)
def test_eager_torch_agrees_with_the_reference(op):
    fam = family(op)
    for expr in cpu_examples(op):
        x = fam.inputs(expr, 0, "cpu")
        got = fam.eager(expr, x)()
        assert rel_error(got, fam.reference(expr, x.args)) <= fam.tolerance(expr), expr.describe()


@pytest.mark.parametrize("op", OPS)
def test_every_library_candidate_computes_the_reference(op):
    fam = family(op)
    for expr in cpu_examples(op):
        assert fam.libraries(expr), expr.describe()  # the library is always a candidate
        for name in fam.libraries(expr):
            x = fam.inputs(expr, 0, "cpu")
            kernel = fam.kernel(expr, Config.of(library=name), fam.problem_of(expr, x.args))
            got = kernel(*x.args)
            assert rel_error(got, fam.reference(expr, x.args)) <= fam.tolerance(expr), (expr.describe(), name)
    with pytest.raises(ExprError, match="no library implementation 'nope'"):
        fam.library(expr, "nope")


@pytest.mark.parametrize("op", OPS)
def test_the_fault_hook_refuses_unknown_faults_and_builds_known_ones(op):
    fam = family(op)
    expr = cpu_examples(op)[0]
    config, problem = fam.default_config(expr), fam.canonical_problem(expr)
    with pytest.raises(ValueError, match="unknown fault"):
        fam.kernel(expr, config.replace(fault="segfault-please"), problem)
    assert all(callable(fam.kernel(expr, config.replace(fault=f), problem)) for f in FAULTS)


@pytest.mark.system
def test_the_fault_kernels_build_for_sm90():
    code = ("from triton.backends.compiler import GPUTarget\nfrom triton.compiler import ASTSource\n"
            "import triton\nfrom tritune.kernels import faults\nfrom tritune.kernels.codegen import load_source\n"
            "for f in ('oob', 'hang'):\n"
            "    fn = load_source(faults._SOURCE, 'tritune_fault_' + f)\n"
            "    k = triton.compile(ASTSource(fn, {'P': '*fp16'}, {}), target=GPUTarget('cuda', 90, 32))\n"
            "    print(f, len(k.asm['ptx']) > 0)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["oob", "True", "hang", "True"]


def test_cublaslt_epilogues_are_candidates_where_they_apply():
    from tritune.kernels.contraction.expr import Matmul
    from tritune.kernels.epilogue import BiasAdd, Gelu, Relu, Scale

    fam = family("matmul")
    relu = Matmul(37, 29, 53, dtype="fp32", epilogue=(BiasAdd(), Relu()))
    assert fam.libraries(relu) == ("mm", "addmm", "addmm_activation")
    assert "addmm_activation" in fam.libraries(Matmul(8, 8, 8, epilogue=(BiasAdd(), Gelu("tanh"))))
    # erf GELU, a batch, or a step after the activation: cuBLASLt's epilogue does not compute it
    for expr in (Matmul(8, 8, 8, epilogue=(BiasAdd(), Gelu())), Matmul(8, 8, 8, batch=2, epilogue=(BiasAdd(), Relu())),
                 Matmul(8, 8, 8, epilogue=(BiasAdd(), Relu(), Scale(2.0)))):
        assert "addmm_activation" not in fam.libraries(expr), expr.describe()
    x = fam.inputs(relu, 0, "cpu")
    got = fam.library(relu, "addmm_activation")(*x.args)
    assert rel_error(got, fam.reference(relu, x.args)) <= fam.tolerance(relu)
