"""General epilogues on the contraction template: canonical forms and keys, the --epilogue grammar,
and kernels with extra inputs (residual, row and column vectors, constants, nested chains) against
float64 under the interpreter."""
import json

import pytest
import torch

from cases import run_case

from tritune.kernels.contraction import launch
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.contraction.family import MATMUL
from tritune.kernels.conv.expr import Conv2d
from tritune.kernels.epilogue import (BINARY, UNARY, Binary, BiasAdd, Clamp, Gelu, Input, Pow, Relu, Scale, Unary,
                                      epilogue_from_dict)
from tritune.kernels.expr import ExprError
from tritune.kernels.pointwise import binary, parse_epilogue, unary
from tritune.schedules.config import Config
from tritune.tuner.worker.candidate import rel_error

SMALL = Config.of(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2, UNROLL=1)
RES, ROW, COL = Input("mn", "fp16"), Input("m", "fp32"), Input("n", "fp16")


def test_the_keys_of_the_fixed_epilogues_are_what_they_always_were():
    # stored records and the shipped recordings match on these: the JSON form must not move
    assert Matmul(64, 64, 64, epilogue=(Scale(0.5), BiasAdd(), Gelu("tanh"), Relu())).key == "4a672ae1dbb4e23a"
    assert Matmul(19, 23, 41, batch=3, dtype="fp32", trans_a=True, trans_b=True,
                  epilogue=(Scale(0.5), BiasAdd(), Gelu())).key == "5abb46c20ce11d4d"
    assert Matmul(64, 64, 64, epilogue=(Scale(2),)).key == "1f461dbe5ecebc7e"
    assert parse_epilogue("scale=0.5,bias,gelu_tanh,relu") == (Scale(0.5), BiasAdd(), Gelu("tanh"), Relu())


def test_constants_take_one_form_each():
    assert parse_epilogue("mul=2,div=4,neg,sub=1,max=0,min=3,max=-1,square") == (
        Scale(2.0), Scale(0.25), Scale(-1.0), Binary("add", -1.0), Relu(), Clamp(max=3.0), Clamp(min=-1.0), Pow(2))
    assert binary("rsub", 1) == Binary("rsub", 1.0) and unary("gelu_tanh") == Gelu("tanh")
    for fn in ("sub", "mul", "div", "max", "min"):
        with pytest.raises(ExprError, match="by a constant is written"):
            Binary(fn, 2.0)
    with pytest.raises(ExprError, match="relu"):
        Clamp(min=0)


def test_general_epilogues_round_trip_through_their_json_form():
    steps = (BiasAdd(), Binary("add", RES), Binary("mul", (Unary("sigmoid"), Binary("mul", ROW))),
             Clamp(None, 6.0), Binary("rdiv", 1.0), Pow(3))
    expr = Matmul(8, 8, 8, batch=2, epilogue=steps)
    again = Matmul.from_dict(json.loads(expr.to_json()))
    assert again == expr and again.key == expr.key and expr.inputs == (RES, ROW)
    assert json.loads(expr.to_json())["epilogue"][2] == {
        "op": "mul", "other": [{"op": "sigmoid"}, {"op": "mul", "other": {"input": "m", "dtype": "fp32"}}]}
    assert parse_epilogue(json.dumps([s.to_dict() for s in steps])) == steps


@pytest.mark.parametrize("text,message", [
    ("softmax", "unknown epilogue 'softmax'"), ("add=x", "expected a number or an input"),
    ("mul=residual:fp8", "bad input dtype"), ("pow=1.5", "pow takes an integer"), ("pow=9", "from 2 to 8"),
    ("clamp=1", "clamp=LO:HI"), ("clamp=3:1", "min 3.0 > max 1.0"), ("div=0", "division by the constant 0"),
    ("add=nan", "finite"), ("[1]", "step is an object"), ("[{\"op\":\"mul\",\"other\":[]}]", "non-empty"),
    ('{"op": "relu"}', "a JSON --epilogue is a list"), ("[", "bad --epilogue JSON"),
    ('[{"op":"add","other":[{"op":"bias"}]}]', "main chain only"),
])
def test_bad_epilogues_are_one_expr_error(text, message):
    with pytest.raises(ExprError, match=message):
        MATMUL.from_cli("8", "fp16", {"epilogue": text})


def test_the_grammar_names_inputs_and_their_dtypes():
    expr = MATMUL.from_cli("2,8,8,8", "bf16", {"epilogue": "bias,gelu_tanh,residual,mul=row:fp32,rsub=col"})
    assert expr.epilogue[2:] == (Binary("add", Input("mn", "bf16")), Binary("mul", Input("m", "fp32")),
                                 Binary("rsub", Input("n", "bf16")))
    with pytest.raises(ExprError, match="without extra inputs"):
        Conv2d(1, 4, 4, 8, 8, 1, 1, epilogue=(Binary("add", RES),))
    assert epilogue_from_dict({"op": "tanh"}) == Unary("tanh")


CASES = {  # name -> (batch, m, n, k, dtype, layout, steps): awkward sizes, every input kind
    "residual": (1, 37, 29, 53, "fp16", "nt", (BiasAdd(), Gelu("tanh"), Binary("add", RES))),
    "row-col": (3, 19, 23, 41, "fp32", "tn", (Binary("mul", ROW), Binary("add", COL), Binary("sub", RES))),
    "m=1": (1, 1, 45, 70, "fp16", "tt", (Binary("mul", COL), Binary("rsub", Input("mn", "fp32")), Unary("tanh"))),
    "n=1": (2, 50, 1, 33, "fp16", "nn", (Binary("div", (Unary("abs"), Binary("add", 1.0))), Binary("max", RES))),
    "nested": (2, 33, 47, 29, "fp32", "nn", (Scale(0.1), Binary("mul", (Unary("sigmoid"), Binary("mul", ROW))),
                                               Binary("min", (Scale(2.0), Binary("add", COL))))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_extra_inputs_match_the_reference(name):
    b, m, n, k, dtype, lay, steps = CASES[name]
    expr = Matmul(m, n, k, batch=b, dtype=dtype, trans_a=lay[0] == "t", trans_b=lay[1] == "t", epilogue=steps)
    err, tol = run_case(expr, SMALL)
    assert err <= tol
    x = MATMUL.inputs(expr, 0, "cpu")
    for lib in MATMUL.libraries(expr):  # the library candidates apply the same steps after the call
        x = MATMUL.inputs(expr, 1, "cpu")
        got = MATMUL.kernel(expr, Config.of(library=lib), MATMUL.problem_of(expr, x.args))(*x.args)
        assert rel_error(got, MATMUL.reference(expr, x.args)) <= tol, lib


@pytest.mark.parametrize("fn", list(UNARY) + [f for f in BINARY])
def test_every_function_matches_the_reference(fn):
    # values kept where every function is defined and well conditioned: log/sqrt of 1 + |v|
    safe = (Scale(0.05),) + ((Unary("abs"), Binary("add", 1.0)) if fn in ("log", "sqrt", "rsqrt", "rdiv") else ())
    other = (Unary("abs"), Binary("add", 1.5)) if fn in ("div", "rdiv") else (Binary("mul", Input("m", "fp32")),)
    step = Unary(fn) if fn in UNARY else Binary(fn, other)
    expr = Matmul(21, 18, 35, dtype="fp32", allow_tf32=False, epilogue=safe + (step,))
    err, tol = run_case(expr, SMALL)
    assert err <= tol


def test_a_residual_shared_by_the_batch_and_strided_vectors():
    """A 2-D residual of a batched output (batch stride 0), a transposed residual view and a
    strided column vector: the kernel reads the strides it is given."""
    expr = Matmul(29, 31, 40, batch=3, dtype="fp32", allow_tf32=False,
                  epilogue=(Binary("add", Input("mn", "fp32")), Binary("mul", Input("n", "fp32")),
                            Binary("add", Input("mn", "fp32"))))
    x = MATMUL.inputs(expr, 0, "cpu")
    a, b, c = x.args[:3]
    shared = torch.randn(29, 31)
    transposed = torch.randn(3, 31, 29).transpose(1, 2)
    col = torch.randn(62)[::2]
    kernel = MATMUL.kernel(expr, SMALL, launch.problem_of(expr, a, b, c, None, shared, col, transposed))
    kernel(a, b, c, None, shared, col, transposed)
    want = ((a.double() @ b.double()) + shared.double()) * col.double() + transposed.double()
    assert rel_error(c, want) <= 1e-5


def test_split_k_adds_the_residual_once():
    expr = Matmul(37, 29, 150, batch=2, dtype="fp32", epilogue=(Binary("add", RES), Binary("mul", ROW)))
    err, tol = run_case(expr, SMALL.replace(SPLIT_K=3))
    assert err <= tol


def test_a_kernel_reading_the_wrong_input_kind_is_caught():
    expr = Matmul(20, 24, 20, dtype="fp32", epilogue=(Binary("add", Input("mn", "fp32")),))
    wrong = Matmul(20, 24, 20, dtype="fp32", epilogue=(Binary("sub", Input("mn", "fp32")),))
    err, tol = run_case(expr, SMALL, kernel_expr=wrong)
    assert err > tol


def test_launch_counts_the_extra_inputs():
    expr = Matmul(8, 8, 8, epilogue=(Binary("add", RES),))
    x = MATMUL.inputs(expr, 0, "cpu")
    assert x.args[3] is None and x.args[4].shape == (1, 8, 8)  # no bias: its slot stays, as None
    with pytest.raises(ValueError, match="takes 1 extra epilogue inputs, got 0"):
        launch.ints_of(expr, *x.args[:4])
    assert launch.ints_of(expr, *x.args)[-3:] == (64, 8, 1)
    assert launch.canonical_problem(expr) == launch.problem_of(expr, *x.args)
