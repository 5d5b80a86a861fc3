"""A GPU that is not there, for whole `tune-cli` processes in tests: TRITUNE_FAKE_GPU=fake_gpu (with
tests/ on PYTHONPATH). The worker takes FAKE_GPU_MS milliseconds per measurement and appends the key
of each config it measured to the file FAKE_GPU_LOG (if set); the builder compiles nothing."""
import os
import time

from fakes import fake_head_to_head, fake_time
from tritune.records.result import Status
from tritune.tuner.builder import BuildResult

INFO = {"gpu": "Fake H100", "capability": "9.0", "sms": 132, "shared_bytes": 232448, "triton": "3.x", "torch": "2.x"}


def _measure(payload: dict) -> dict:
    time.sleep(float(os.environ.get("FAKE_GPU_MS", "20")) / 1000)
    config = payload["config"]
    log = os.environ.get("FAKE_GPU_LOG")
    if log:
        with open(log, "a") as fp:
            fp.write(config.key + "\n")
    t = fake_time(config)
    return {"status": Status.OK, "times": (t, t, t, t), "message": "fake"}


def handlers(timing):
    return {"info": lambda p: INFO, "measure": _measure, "head_to_head": fake_head_to_head}


def build(expr, config, problem, target, shared_limit):
    return BuildResult(config, None, 0.0)
