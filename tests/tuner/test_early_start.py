"""A run that starts on the device facts the CUDA driver gives (without torch) while its GPU worker
starts: the facts read, the search compiling before the worker answers, and a worker that reports
other facts stopping the run before anything is stored."""
import ctypes
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from functools import partial

import pytest

import fake_worker
from fakes import FakeBuilder
from tritune.kernels import device
from tritune.records.database import Database
from tritune.tuner.cli import EXIT_NO_GPU, main
from tritune.tuner.gpus import start
from tritune.tuner.worker.local import LocalRunner

HELPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers")
FACTS = {"gpu": "Fake H100", "capability": "9.0", "sms": 132, "shared_bytes": 232448, "triton": "3.x",
         "torch": "2.x", "device": 0, "device_count": 1}


class FakeDriver:
    """libcuda's calls that `driver_facts` makes, answering through their ctypes references."""

    VALUES = {75: 9, 76: 0, 16: 132, 97: 232448}

    def __init__(self, count=2):
        self.count = count

    def cuInit(self, flags):
        return 0

    def cuDeviceGetCount(self, ref):
        ref._obj.value = self.count
        return 0

    def cuDeviceGet(self, ref, index):
        ref._obj.value = index
        return 0

    def cuDeviceGetName(self, buffer, size, dev):
        buffer.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def cuDeviceGetAttribute(self, ref, attribute, dev):
        ref._obj.value = self.VALUES[attribute]
        return 0


def test_the_driver_facts_are_the_workers_facts(monkeypatch):
    import torch
    import triton

    assert device.torch_version() == str(torch.__version__)  # read from torch's files, not imported
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver())
    assert device.driver_facts(1) == {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132,
                                      "shared_bytes": 232448, "triton": triton.__version__,
                                      "torch": str(torch.__version__), "device": 1, "device_count": 2}
    assert device.driver_facts(2) is None  # no such device
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeDriver(count=0))
    assert device.driver_facts(0) is None


def test_no_driver_gives_no_facts(monkeypatch):
    def missing(name):
        raise OSError("libcuda.so.1: cannot open shared object file")
    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert device.driver_facts(0) is None


@pytest.fixture
def slow_worker(monkeypatch, tmp_path):
    """A session whose worker answers its handshake only once the search has submitted its first
    compile (else a minute late), on a host whose driver tells the facts; the submissions, timed."""
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.gated_session_handlers))
    monkeypatch.setattr(LocalRunner, "on_gpu", property(lambda self: True))
    builder = FakeBuilder()
    builder.submitted = []
    submit = builder.submit

    def submitted(*args):
        builder.submitted.append(time.time())
        go.touch()
        return submit(*args)
    builder.submit = submitted
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: builder)
    return builder


@pytest.mark.system
def test_the_search_compiles_before_the_worker_answers(slow_worker, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(start, "driver_facts", lambda index: dict(FACTS))
    answered = []
    real = start.gpu_session

    def session(*args, **kwargs):  # keep the first worker, to read when it answered
        with real(*args, **kwargs) as (runner, builder):
            yield runner, builder
            answered.append(runner.startup["answered_at"])
    monkeypatch.setattr(start, "gpu_session", start.contextmanager(session))
    db = tmp_path / "t.db"
    main(["run", "--shape", "512,256,1024", "--trials", "16", "--batch-size", "8", "--db", str(db), "--verbose"])
    assert slow_worker.submitted[0] < answered[0] < slow_worker.submitted[0] + 30  # compiled before it answered
    stored = Database(db).trials(Database(db).workloads()[0][0])
    assert len(stored) == 16
    shown = capsys.readouterr().out
    assert "first GPU worker's answer came at" in shown and "start-up before the run" in shown


def test_a_run_that_waited_for_its_worker_says_how_busy_the_gpu_was_once_it_was_up():
    from tritune.tuner.breakdown import summary

    tuner = {"check": 1.0, "timing": 2.0, "propose": 1.0, "wait": 7.0, "measure": 6.0}
    waited = summary(10.0, tuner, {"worker_start": 4.0}, {"compile": 40.0}, 16)
    assert waited["GPU busy fraction"] == 0.3 and waited["GPU busy fraction once its worker was up"] == 0.5
    assert "GPU busy fraction once its worker was up" not in summary(10.0, tuner, {"worker_start": 0.1}, {}, 16)


@pytest.mark.system
def test_a_worker_with_other_facts_stops_the_run_before_anything_is_stored(slow_worker, monkeypatch, tmp_path,
                                                                            capsys):
    monkeypatch.setattr(start, "driver_facts", lambda index: {**FACTS, "gpu": "Fake A100"})
    db = tmp_path / "t.db"
    with pytest.raises(SystemExit) as stop:
        main(["run", "--shape", "512,256,1024", "--trials", "16", "--db", str(db)])
    assert stop.value.code == EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "'Fake H100' (the driver said 'Fake A100')" in err and "TRITUNE_EARLY_START=0" in err
    assert err.strip().splitlines()[-1].startswith("tune-cli: no GPU left to measure on: GPU ")
    assert all(not Database(db).trials(key) for key, *_ in Database(db).workloads())


@pytest.mark.system
def test_two_stand_in_gpus_started_on_the_driver_facts_both_measure(tmp_path):
    """`--devices all` on a host whose driver tells both devices' facts ahead: each device's worker
    checks its own, both measure; a device the driver does not have leaves the run to the workers'
    answers, which name it."""
    # TOGETHER: neither device measures before both workers are up (one started late measured all 24)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HELPERS, os.environ.get("PYTHONPATH", "")]),
           "TRITUNE_FAKE_GPU": "fake_gpu", "FAKE_GPU_MS": "10", "FAKE_GPU_EARLY": "1", "FAKE_GPU_DEVICES": "2",
           "FAKE_GPU_TOGETHER": str(tmp_path)}
    tune = [sys.executable, "-m", "tritune", "run", "--shape", "512,256,1024", "--trials", "24", "--batch-size", "8"]
    both = subprocess.run([*tune, "--devices", "all", "--db", str(tmp_path / "t.db")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert both.returncode == 0, both.stderr[-2000:]
    with Database(tmp_path / "t.db") as db:
        measured_on = Counter(r.measured_on for r in db.trials(db.workloads()[0][0]))
    host = socket.gethostname()
    assert set(measured_on) == {f"{host}:0", f"{host}:1"} and sum(measured_on.values()) == 24
    missing = subprocess.run([*tune, "--devices", "0,3", "--db", str(tmp_path / "m.db")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == EXIT_NO_GPU and "there is no CUDA device 3" in missing.stderr.strip().splitlines()[-1]
