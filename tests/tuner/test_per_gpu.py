"""Several workloads tuned at once on one GPU (`tune-model --per-gpu`): each GPU gets that many
workers, which take turns at whatever they time there; the workloads spread over them; a worker
killed by a candidate costs its workload one restart and the others go on."""
import os
import threading
import time
from functools import partial

import pytest

from fakes import FakeBuilder
from tritune.records.database import Database
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.tuner import run as tuning
from tritune.tuner.cli import make_expr
from tritune.tuner.gpus import start
from tritune.tuner.worker.local import LocalRunner
from tritune.tuner.worker.protocol import distinct_gpus


def spans_handlers(timing):
    """A stand-in GPU whose measurements take 20 ms and append "pid start end" to $SPANS_LOG."""

    def measure(payload):
        begin = time.time()
        time.sleep(0.02)
        with open(os.environ["SPANS_LOG"], "a") as fp:
            fp.write(f"{os.getpid()} {begin} {time.time()}\n")
        return {"status": Status.OK, "times": (1.0, 1.0, 1.0, 1.0), "message": "fake"}
    return {"info": lambda p: {"pid": os.getpid()}, "measure": measure}


def _stand_in_gpu(monkeypatch, handlers_module="fake_gpu", handlers="handlers", devices="1"):
    import importlib

    monkeypatch.setenv("FAKE_GPU_DEVICES", devices)
    fake = getattr(importlib.import_module(handlers_module), handlers)
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())


@pytest.mark.system  # GPU worker processes for every worker of every device
@pytest.mark.parametrize("devices, per_gpu, expected", [("all", 2, [0, 1, 0, 1]), (None, 3, [None, 0, 0])])
def test_each_gpu_gets_per_gpu_workers_that_share_its_lock(monkeypatch, devices, per_gpu, expected):
    _stand_in_gpu(monkeypatch, devices="2")
    runner, builder = start.start_gpu(devices=devices, per_gpu=per_gpu)
    try:
        each = runner.each
        # one worker of every device first, so that the first workloads go to different GPUs
        assert [r.device for r in each] == expected
        by_name = {}
        for r in each:
            by_name.setdefault(r.name, set()).add(id(r.gpu_lock))
            assert r._judge.gpu_lock is r.gpu_lock  # the head-to-head's worker takes turns too
        assert all(len(locks) == 1 for locks in by_name.values())
        assert len({id(r.gpu_lock) for r in each}) == len(by_name)  # and devices do not wait on each other
        assert runner.gpus == distinct_gpus(each) == len(by_name)  # GPUs, not workers
    finally:
        builder.close()
        runner.close()


def _overlaps(spans):
    spans = sorted(spans)
    return sum(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def test_the_workers_of_one_gpu_take_turns_at_measuring(monkeypatch, tmp_path):
    log = tmp_path / "spans"
    monkeypatch.setenv("SPANS_LOG", str(log))
    lock = threading.Lock()
    runners = [LocalRunner(handlers=spans_handlers, gpu_lock=lock, device=0) for _ in range(2)]
    expr = make_expr("matmul", "64", "fp16")
    try:
        for r in runners:  # both up before the race, so that their measurements can meet
            r.device_info()
        threads = [threading.Thread(target=lambda r=r: [r.measure(expr, Config({"BLOCK_M": 64})) for _ in range(8)])
                   for r in runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for r in runners:
            r.close()
    rows = [line.split() for line in log.read_text().splitlines()]
    assert len(rows) == 16 and len({pid for pid, _, _ in rows}) == 2  # both workers measured
    assert _overlaps([(float(b), float(e)) for _, b, e in rows]) == 0


class Moments(tuning.Report):
    """When each workload started and finished (wall clock)."""

    def __init__(self):
        self.began, self.ended = {}, {}

    def started(self, expr, trials):
        self.began[expr.key] = time.time()
        return super().started(expr, trials)

    def finished(self, expr, best, h2h, gpu):
        self.ended[expr.key] = time.time()


def _convs():
    # convolutions: their spaces are enumerated in a fraction of a second (a matmul's takes seconds)
    return [make_expr("conv2d", s, "fp16", padding="1")
            for s in ("8,28,28,64,64,3,3", "8,14,14,64,64,3,3", "4,14,14,32,64,3,3")]


@pytest.mark.system  # a tuning run over stand-in GPU worker processes
def test_a_models_workloads_two_at_once_on_one_gpu(monkeypatch, tmp_path):
    _stand_in_gpu(monkeypatch)
    monkeypatch.setenv("FAKE_GPU_MS", "20")
    exprs, moments = _convs(), Moments()
    options = start.TuneOptions(trials=12, batch_size=4, strategy="random", per_gpu=2)
    with Database(tmp_path / "t.db") as db:
        out = tuning.tune_all(exprs, db, options, trials=[16, 8, 8], report=moments)
        stored = [db.trials(e.key) for e in exprs]
    assert [s["trials"] for s in out] == [16, 8, 8] and all(s["best_config"] for s in out)
    assert [len({r.config for r in trials}) for trials in stored] == [16, 8, 8]  # each config once
    # the two largest ran at once: the second began before the first ended
    first, second = exprs[0].key, exprs[1].key
    assert moments.began[second] < moments.ended[first]
    names = {r.measured_on for trials in stored for r in trials if r.status is not Status.COMPILE_ERROR}
    assert len(names) == 1 and names.pop().endswith(":0")  # one GPU measured every trial


@pytest.mark.system  # worker processes killed
def test_a_worker_killed_by_a_candidate_costs_only_its_workload_a_restart(monkeypatch, tmp_path):
    # each workload's first candidate kills the worker measuring it (as a segfault would), while
    # the GPU's other worker is measuring another workload
    _stand_in_gpu(monkeypatch, "fake_worker", "session_handlers")
    exprs = _convs()
    options = start.TuneOptions(trials=12, batch_size=4, strategy="random", per_gpu=2, faults=("exit",))
    with Database(tmp_path / "t.db") as db:
        out = tuning.tune_all(exprs, db, options, trials=[16, 8, 8])
        stored = [db.trials(e.key) for e in exprs]
    assert [s["trials"] for s in out] == [16, 8, 8] and all(s["best_config"] for s in out)
    for trials in stored:  # nothing lost: every trial stored once, the one that crashed as a crash
        assert len(trials) == len({r.config for r in trials})
        statuses = [r.status for r in trials]
        assert statuses.count(Status.CRASH) == 1 and statuses.count(Status.OK) == len(trials) - 1


@pytest.mark.parametrize("args, needle", [
    (["--per-gpu", "2", "--cluster", "tcp://127.0.0.1:8786"], "--per-gpu sets this host's workers"),
    (["--per-gpu", "0"], "Invalid value for '--per-gpu'"),
])
def test_per_gpu_refused_where_it_cannot_apply(capsys, tmp_path, args, needle):
    from test_cli import cli

    code, _, err = cli(capsys, "tune-model", "--model", "tritune.tuner.model.zoo:gpt2", "--input-shape", "1,16",
                       "--db", str(tmp_path / "t.db"), *args)
    assert code == 2 and needle in err and "Traceback" not in err
    assert not (tmp_path / "t.db").exists()  # refused before anything was opened
