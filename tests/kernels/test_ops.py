"""Replay: tritune.ops.matmul runs the stored best config, else the nearest shape, else a default."""
import warnings

import pytest
import torch

import tritune
from tritune.kernels.backend import ops
from tritune.kernels.device import device_info
from tritune.kernels.family import device_key
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import Gelu
from tritune.records.database import Database
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config

FAST = Config.of(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=1, num_warps=2, num_stages=2, UNROLL=1)
SLOW = FAST.replace(BLOCK_M=16)


def store(path, expr, device=None):
    db = Database(path)
    db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
    db.save(expr.key, device or device_key(device_info(), "matmul"), [
        MeasureResult(SLOW, Status.OK, 2.0, 2.0, 2.0, 2.0), MeasureResult(FAST, Status.OK, 1.0, 1.0, 1.0, 1.0),
        MeasureResult(FAST.replace(BLOCK_M=64), Status.WRONG_ANSWER, message="wrong")])
    db.close()


def check(y, a, b, epilogue=()):
    ref = a.double() @ b.double()
    for step in epilogue:
        ref = step.reference(ref, None)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3


def test_replays_the_stored_best(tmp_path):
    a, b = torch.randn(40, 24, dtype=torch.float16), torch.randn(24, 33, dtype=torch.float16)
    store(tmp_path / "t.db", Matmul(40, 33, 24, dtype="fp16"))
    with tritune.apply_history_best(tmp_path / "t.db"):
        choice = ops.explain(a, b)
        y = tritune.ops.matmul(a, b)
    assert (choice.source, choice.config) == ("tuned", FAST)
    check(y, a, b)
    assert ops.explain(a, b, db=tmp_path / "t.db").config == FAST  # the plain db= form


def test_nearest_shape_then_default_each_warn_once(tmp_path):
    store(tmp_path / "t.db", Matmul(64, 64, 64, dtype="fp32"))
    a, b = torch.randn(2, 50, 70), torch.randn(2, 70, 30)  # batched, other shape, same op and dtype
    with tritune.apply_history_best(tmp_path / "t.db"):
        with pytest.warns(UserWarning, match="nearest tuned shape"):
            y = ops.matmul(a, b, epilogue=(Gelu(),))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ops.matmul(a, b, epilogue=(Gelu(),))  # second call: cached, silent
        assert ops.explain(a, b, epilogue=(Gelu(),)).config == FAST
    check(y, a, b, (Gelu(),))
    half = torch.randn(9, 9, dtype=torch.float16)
    with tritune.apply_history_best(tmp_path / "t.db"), pytest.warns(UserWarning, match="safe default"):
        assert ops.explain(half, half).source == "default"


def test_records_of_another_device_are_never_replayed(tmp_path):
    expr = Matmul(12, 12, 12, dtype="fp32")
    store(tmp_path / "t.db", expr, DeviceKey("NVIDIA H100", "9.0", "3.6.0", "2.11.0", "other-template"))
    a = torch.randn(12, 12)
    with tritune.apply_history_best(tmp_path / "t.db"), pytest.warns(UserWarning):
        assert ops.explain(a, a).source == "default"


def test_transposed_inputs_and_bias(tmp_path):
    a, b = torch.randn(30, 20).t(), torch.randn(25, 30).t()  # [20, 30] and [30, 25], both stored transposed
    bias = torch.randn(25)
    store(tmp_path / "t.db", Matmul(20, 25, 30, dtype="fp32", trans_a=True, trans_b=True))
    with tritune.apply_history_best(tmp_path / "t.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = ops.matmul(a, b, bias)
        assert ops.explain(a, b, bias).expr.trans_a and ops.explain(a, b, bias).expr.has_bias
    ref = a.double() @ b.double() + bias.double()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3


def test_mismatched_shapes_are_a_clear_error():
    with pytest.raises(ValueError, match="do not match"):
        ops.explain(torch.randn(3, 4), torch.randn(5, 6))


def test_call_signature_tells_alignment_layout_and_dtype_apart(tmp_path):
    """The per-call cache key must select another binary whenever the facts it was built for change."""
    store(tmp_path / "t.db", Matmul(33, 29, 47, dtype="fp32"))
    base, b = torch.randn(33 * 47 + 1), torch.randn(47, 29)
    aligned, shifted = base[:-1].view(33, 47), base[1:].view(33, 47)  # same shape and strides, 4 bytes apart
    transposed = aligned.t().contiguous().t()
    with tritune.apply_history_best(tmp_path / "t.db"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a in (aligned, shifted, transposed, aligned):
            check(ops.matmul(a, b), a, b)
        kernels = [e.kernel for e in ops._entries.values() if e.choice.expr.m == 33 and e.choice.expr.k == 47]
        facts = sorted((k.problem.aligned[0], k.expr.trans_a) for k in kernels)
        assert facts == [(False, False), (True, False), (True, True)]
        with pytest.raises(ValueError, match="one dtype"):
            ops.matmul(aligned, b.double())  # same shapes and strides as a cached call, other dtype


def test_given_config_and_odd_strides():
    a = torch.randn(2, 21, 40)[:, :, ::2]  # neither of the last two strides is 1: copied
    b = torch.randn(2, 20, 17)
    y = ops.matmul(a, b, config=FAST, epilogue=[Gelu(approximate="tanh")])
    ref = torch.nn.functional.gelu(a.double() @ b.double(), approximate="tanh")
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-5
    entry = next(e for e in ops._entries.values() if e.choice.expr.m == 21 and e.choice.expr.n == 17)
    assert entry.choice.source == "given" and entry.kernel.config == FAST and entry.copy_a and not entry.copy_b


def test_a_nearest_shape_whose_library_call_does_not_apply_is_passed_over(tmp_path):
    """The nearest tuned shape chose addmm (it has a bias); a call without one cannot run addmm:
    the next nearest that can run is used."""
    from tritune.kernels.epilogue import BiasAdd

    db = Database(tmp_path / "t.db")
    device = device_key(device_info(), "matmul")
    for expr, config in ((Matmul(40, 33, 24, dtype="fp16", epilogue=(BiasAdd(),)), Config.of(library="addmm")),
                         (Matmul(400, 330, 240, dtype="fp16"), FAST)):
        db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        db.save(expr.key, device, [MeasureResult(config, Status.OK, 1.0, 1.0, 1.0, 1.0)])
    db.close()
    a, b = torch.randn(41, 24, dtype=torch.float16), torch.randn(24, 33, dtype=torch.float16)
    with warnings.catch_warnings(), tritune.apply_history_best(tmp_path / "t.db"):
        warnings.simplefilter("ignore")
        choice = ops.explain(a, b)
        check(ops.matmul(a, b), a, b)
    assert choice.source == "nearest" and choice.config == FAST
