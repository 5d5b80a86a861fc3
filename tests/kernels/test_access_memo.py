"""access_memo: torch's analysis of a user-defined Triton kernel's reads and writes, answered once
per kernel and kinds of arguments (what the analysis sees), as torch answers it."""
import sympy
import triton
import triton.language as tl
import torch
from torch._higher_order_ops import triton_kernel_wrap
from torch._subclasses.fake_tensor import FakeTensorMode

from tritune.kernels.backend import access_memo


def counting():
    calls = []

    def analyse(kernel, kwargs, *rest):
        calls.append((kernel, dict(kwargs), rest))
        return [name for name, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return calls, access_memo.memoised(analyse)


def test_tensors_of_one_dtype_and_any_shape_share_an_answer():
    calls, analyse = counting()
    with FakeTensorMode() as fake:
        a, b = fake.from_tensor(torch.empty(4, 8)), fake.from_tensor(torch.empty(1024, 3))
    assert analyse("k", {"x": a, "n": 16}, {}) == ["x"]
    assert analyse("k", {"x": b, "n": 16}, {}) == ["x"]
    assert analyse("k", {"x": torch.empty(5), "n": 16}, {}) == ["x"]
    assert len(calls) == 1


def test_what_the_analysis_sees_differently_is_analysed_again():
    calls, analyse = counting()
    base = {"x": torch.empty(2), "n": 16, "s": sympy.Symbol("s0")}
    analyse("k", base, {})
    analyse("k", {**base, "s": sympy.Symbol("s7") * 2}, {})  # any symbolic size is a 2 to the analysis
    assert len(calls) == 1
    for other in ({**base, "x": torch.empty(2, dtype=torch.float16)}, {**base, "n": 17}, {**base, "n": True},
                  {**base, "extra": None}):
        analyse("k", other, {})
    analyse("other kernel", base, {})
    analyse("k", base, {"x": ("stable", (16, 16))})
    assert len(calls) == 7


def test_answers_are_copies():
    _, analyse = counting()
    first = analyse("k", {"x": torch.empty(2)}, {})
    first.append("spoiled")
    assert analyse("k", {"x": torch.empty(2)}, {}) == ["x"]


def test_an_argument_it_cannot_key_goes_to_torch_every_time():
    calls, analyse = counting()
    odd = object()
    analyse("k", {"x": torch.empty(2), "d": odd}, {})
    analyse("k", {"x": torch.empty(2), "d": odd}, {})
    assert len(calls) == 2


def test_install_wraps_torchs_analysis_once():
    names = [n for n in access_memo.NAMES if callable(getattr(triton_kernel_wrap, n, None))]
    saved = {n: getattr(triton_kernel_wrap, n) for n in names}
    try:
        assert access_memo.install() is bool(names)
        wrapped = {n: getattr(triton_kernel_wrap, n) for n in names}
        assert all(w.memoised_by_tritune for w in wrapped.values())
        access_memo.install()
        assert {n: getattr(triton_kernel_wrap, n) for n in names} == wrapped  # not wrapped twice
    finally:
        for n, fn in saved.items():
            setattr(triton_kernel_wrap, n, fn)


@triton.jit
def _copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


def _one_config(block, warps=4):
    return triton.autotune(configs=[triton.Config({"BLOCK": block}, num_warps=warps)], key=[])(_copy)


def test_autotuners_of_one_function_and_first_config_share_an_answer():
    # torch wraps a kernel launched with num_warps/num_stages in a new autotuner at every call site
    calls, analyse = counting()
    args = {"x_ptr": torch.empty(2), "y_ptr": torch.empty(2)}
    for _ in range(3):
        analyse(_one_config(16), args, {})
    analyse(_one_config(16, warps=8), args, {})  # the analysis reads the config's arguments only
    assert len(calls) == 1
    analyse(_one_config(32), args, {})
    analyse(_copy, args, {})
    analyse(triton.autotune(configs=[], key=[])(_copy), args, {})
    assert len(calls) == 4
