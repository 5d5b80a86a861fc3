"""The runner's isolation: crashes and hangs take only the worker down; failures are classified."""
import pytest

import fake_worker
from tritune.kernels.contraction.expr import Matmul
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.tuner.worker.failures import classify
from tritune.tuner.worker.local import LocalRunner

EXPR = Matmul(8, 8, 8)
GOOD = Config.of(BLOCK_M=16)


@pytest.fixture
def runner():
    with LocalRunner(timeout_s=3, handlers=fake_worker.handlers) as r:
        yield r


@pytest.mark.system
def test_crash_hang_and_errors_are_recorded_and_tuning_goes_on(runner):
    first = runner.device_info()["pid"]
    outcomes = [runner.measure(EXPR, GOOD.replace(fault=f)) for f in ("exit", "hang", "cuda", "raise", "wrong")]
    assert [r.status for r in outcomes] == [Status.CRASH, Status.TIMEOUT, Status.CRASH,
                                            Status.RUNTIME_ERROR, Status.WRONG_ANSWER]
    assert all(r.message for r in outcomes) and all(r.t_median is None for r in outcomes)
    after = runner.measure(EXPR, GOOD)
    assert after.status is Status.OK and after.t_median == 1.2
    assert runner.restarts == 3  # one per exit, hang and fatal CUDA error; the ordinary error kept it
    assert runner.device_info()["pid"] != first


def test_ordinary_errors_keep_the_worker(runner):
    pid = runner.device_info()["pid"]
    assert runner.measure(EXPR, GOOD.replace(fault="raise")).status is Status.RUNTIME_ERROR
    assert runner.device_info()["pid"] == pid


@pytest.mark.parametrize("exc, status, fatal", [
    (RuntimeError("CUDA error: an illegal memory access was encountered"), Status.CRASH, True),
    (RuntimeError("CUDA error: misaligned address"), Status.CRASH, True),
    (type("OutOfResources", (Exception,), {})("out of resource: shared memory, Required: 300000"),
     Status.OUT_OF_RESOURCES, False),
    (RuntimeError("ptxas error: Try to compile with register target of 154 or higher"),
     Status.OUT_OF_RESOURCES, False),
    (ValueError("bad value"), Status.RUNTIME_ERROR, False),
])
def test_classify(exc, status, fatal):
    assert classify(exc) == (status, fatal)


def test_unknown_compiler_failures_are_compile_errors():
    assert classify(SyntaxError("unexpected token"), compiling=True) == (Status.COMPILE_ERROR, False)
