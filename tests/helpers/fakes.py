"""A builder and runner that replay a fixed table of outcomes, so the tuning loop runs without a GPU."""
from tritune.records.result import MeasureResult, Status
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import BuildResult, PoolShares
from tritune.tuner.worker.protocol import OneRunner


class DoneFuture:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class FakeBuilder:
    """Fails to compile configs whose BLOCK_K is 128 (a stand-in for a compiler error); builds faults."""

    workers = 1

    def __init__(self):
        self.built = []
        self.watch = Stopwatch()
        self.shares = PoolShares(lambda: self.workers)

    def spawn(self):
        pass

    def start(self, target, shared_limit=0):
        pass

    def background(self, fn, *args):
        return DoneFuture(fn(*args))

    def submit(self, expr, problem, configs):
        self.built.extend(configs)
        return [DoneFuture(BuildResult(c, Status.COMPILE_ERROR, 0.5, message="boom") if self.fails(c)
                           else BuildResult(c, None, 0.5)) for c in configs]

    @staticmethod
    def fails(config):
        return config.get("BLOCK_K") == 128 and "fault" not in config

    def result(self, future, config):
        return future.result()

    def close(self, now=False):
        pass


class FakeRunner(OneRunner):
    """Times a config as a deterministic function of its knobs; some configs fail at run time."""

    name = "fake:0"

    def __init__(self):
        self.measured = []
        self.watch = Stopwatch()

    def device_info(self):
        return {"gpu": "fake", "capability": "9.0"}

    def head_to_head(self, expr, config):
        return fake_head_to_head({})

    def measure(self, expr, config, compile_s=0.0, best_ms=None):
        self.measured.append(config)
        if config.get("fault") == "oob":
            return MeasureResult(config, Status.CRASH, compile_s=compile_s, message="worker died")
        if config.get("fault") == "hang":
            return MeasureResult(config, Status.TIMEOUT, compile_s=compile_s, message="no answer")
        if config.get("num_warps") == 2 and config.get("BLOCK_M") == 256:
            return MeasureResult(config, Status.WRONG_ANSWER, compile_s=compile_s, message="relative error 1")
        t = fake_time(config)
        return MeasureResult(config, Status.OK, t, t, t, t, compile_s)


# the library's time: mid-field, so that a search still finds faster schedules
LIBRARY_MS = 1.6


def fake_time(config):
    if config.library is not None:
        return LIBRARY_MS
    return 1.0 + abs(config["BLOCK_M"] - 128) / 64 + abs(config["BLOCK_N"] - 128) / 64 + config["num_stages"] / 10


def fake_head_to_head(payload):
    """A worker's head-to-head answer: the tuned best against a library call and torch.compile."""
    return {"ours_ms": 1.0, "alternatives": {"mm": 1.1, "torch.compile": 1.2}, "best_alternative": "mm",
            "best_alternative_ms": 1.1, "compile_error": ""}


def abort_on_block_m_32(expr, config, problem, target, shared_limit):
    """A pool-process build that dies like an LLVM assertion on BLOCK_M=32 and builds the rest."""
    import os
    import time

    if config.get("BLOCK_M") == 32:
        time.sleep(0.5)  # let the others be in flight when the pool dies
        os.abort()
    time.sleep(0.2)
    return BuildResult(config, None, 0.2)


class AllBuild(FakeBuilder):
    """Builds every config (FakeBuilder fails BLOCK_K 128, the matmul space's stand-in error)."""

    fails = staticmethod(lambda config: False)


def fake_gpu_session(monkeypatch, builder=AllBuild):
    """tune-cli's session on a fake GPU worker (tests/helpers/fake_worker.py) and a fake builder."""
    from functools import partial

    import fake_worker
    from tritune.tuner.gpus import start
    from tritune.tuner.worker.local import LocalRunner

    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: builder())
