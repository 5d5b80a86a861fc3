"""Kill `tune-cli run` at any moment: real processes on a stand-in GPU (tests/helpers/fake_gpu.py), stopped
by SIGKILL, SIGTERM and SIGINT; a full disk and a read-only database; four tuners on one database."""
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

import fake_worker
import kill_harness
from fakes import FakeBuilder
from tritune.records.database import Database
from tritune.tuner.gpus import start
from tritune.tuner.builder import usable_cpus
from tritune.tuner.tuner import in_flight_target
from tritune.tuner.worker.local import LocalRunner

pytestmark = pytest.mark.system  # tune-cli runs killed by signals, stand-in GPUs in worker processes

HELPERS = Path(__file__).parents[1] / "helpers"


def tune(trials: int, *extra: str) -> list[str]:
    """`tune-cli run` arguments: a convolution (its space of 5,496 configs is built in well under a second)."""
    return ["run", "--op", "conv2d", "--shape", "8,28,28,64,64,3,3", "--padding", "1", "--trials", str(trials),
            "--strategy", "random", "--batch-size", "16", *extra]


RUN = tune(5000)  # more than 20 short runs measure: every run ends by its stop


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """Whole tune-cli processes on the stand-in GPU, which logs what it measures."""
    path = os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("TRITUNE_FAKE_GPU", "fake_gpu")
    monkeypatch.setenv("FAKE_GPU_LOG", str(tmp_path / "measured.log"))
    monkeypatch.setenv("FAKE_GPU_MS", "15")
    return tmp_path / "t.db"


def kill_moments(rng: random.Random, count: int) -> list[tuple[int, float]]:
    """When to kill each run: (more stored trials to wait for, then seconds more)."""
    # by the run's progress, not the clock: on a loaded host the start-up alone outlasted most kills
    # timed from the start, which then found nothing measured. Every other one still comes 0.5 to 3 s
    # after the start, mostly during the start-up, and costs no start-up to wait for (never the
    # first: it would find no file to check)
    return [(0, rng.uniform(0.5, 3.0)) if i % 2 else (rng.randint(1, 8), rng.uniform(0.0, 0.1))
            for i in range(count)]


def test_sigkill_at_20_random_moments_loses_only_the_trial_in_flight(fake_gpu):
    for waited, delay in kill_moments(random.Random(0), 20):
        stop = kill_harness.run(RUN, fake_gpu, delay, after_trials=waited)
        # killed once the trials it waited for were stored: load moves the moment, not the bound
        assert stop["exit"] == -signal.SIGKILL and stop["stored"] >= stop["stored_at_signal"] >= waited, stop
        assert stop["integrity"] == "ok" and stop["orphans"] == 0, stop
        assert stop["lost"] <= 1 and stop["remeasured"] == 0, stop
    rest = kill_harness.run(tune(stop["total"] + 40), fake_gpu, None)
    assert rest["exit"] == 0 and rest["stored"] == 40 and rest["remeasured"] == 0, rest


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_sigterm_and_sigint_store_what_was_measured_and_stop_the_children(fake_gpu, sig, code, word):
    stop = kill_harness.run(RUN, fake_gpu, 0.5, sig, after_trials=5)  # stopped while measuring
    assert stop["exit"] == code and stop["last_line"].startswith("tune-cli: ") and word in stop["last_line"]
    assert stop["integrity"] == "ok" and stop["orphans"] == 0 and stop["stored"] > 0 and stop["lost"] <= 1


def test_four_tuners_on_one_database_measure_nothing_twice(fake_gpu):
    # two of them with the same seed: they propose the same configs in the same order
    base = [*tune(200, "--batch-size", "8"), "--db", str(fake_gpu)]
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-m", "tritune", *base, "--seed", str(seed)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for seed in (0, 0, 1, 2)]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert not any("locked" in e for e in errors)
    measured = Path(os.environ["FAKE_GPU_LOG"]).read_text().split()
    assert len(measured) == len(set(measured))  # no config measured twice
    assert kill_harness.integrity(fake_gpu) == "ok" and kill_harness.stored_keys(fake_gpu) == set(measured)
    # the budget, plus what was in flight in the others (the pipeline's depth: a round over its
    # target, which the pool of one process per core sets; two rounds of 8 on a small host)
    most = in_flight_target(usable_cpus(), 1, 8, 200, 200) + 8
    assert 200 <= len(measured) <= 200 + 4 * most


@pytest.fixture
def fake_session(monkeypatch):
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())


@pytest.mark.parametrize("refuse, words", [
    ("PRAGMA max_page_count = {pages}", "database or disk is full"),  # what a full disk looks like to SQLite
    ("PRAGMA query_only = 1", "readonly"),  # a read-only file (chmod does not stop root, who runs CI)
])
def test_a_refused_write_stops_the_run_with_one_line_and_keeps_what_was_stored(
        fake_session, monkeypatch, tmp_path, capsys, refuse, words):
    from tritune.tuner.cli import main

    db_path = tmp_path / "t.db"
    main([*tune(40), "--db", str(db_path)])
    capsys.readouterr()

    class Refusing(Database):
        def __init__(self, path):
            super().__init__(path)
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            self._db.execute(refuse.format(pages=pages + 1))

    monkeypatch.setattr("tritune.tuner.cli.paths.Database", Refusing)  # what open_db opens
    with pytest.raises(SystemExit) as info:
        main([*tune(400), "--db", str(db_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and words in err[-1] and err[-1].startswith("tune-cli: cannot write")
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert 40 <= conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0] < 400


def test_children_end_with_their_parent(tmp_path):
    """A parent killed with SIGKILL takes its compile pool and GPU worker along (parent-death signal)."""
    code = ("import os, sys, time\nsys.path.insert(0, %r)\nimport fake_worker\n"
            "from tritune.tuner.builder import Builder\nfrom tritune.tuner.worker.local import LocalRunner\n"
            "r = LocalRunner(handlers=fake_worker.handlers); r.device_info()\n"
            "b = Builder(None, workers=2); b._pool.submit(time.sleep, 0).result()\n"
            "print(r._proc.pid, *b._pool._processes, flush=True); time.sleep(60)\n") % str(HELPERS)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    children = [int(p) for p in proc.stdout.readline().split()]
    assert len(children) >= 2  # the GPU worker and at least one pool process
    proc.kill()
    proc.wait()
    deadline = time.time() + 5
    while any(_alive(pid) for pid in children) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children)


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_two_devices_share_a_workload_and_a_lost_one_loses_nothing(fake_gpu, monkeypatch):
    """`--devices all` on a host of two (stand-in) GPUs: both measure the workload's candidates; when
    device 1 falls off the bus, its candidate in flight goes back to device 0 and nothing is lost
    or recorded as a crash."""
    monkeypatch.setenv("FAKE_GPU_DEVICES", "2")
    monkeypatch.setenv("FAKE_GPU_TOGETHER", str(fake_gpu.parent))  # neither measures before both are up
    args = [sys.executable, "-m", "tritune", *tune(48, "--devices", "all", "--db", str(fake_gpu))]
    both = subprocess.run(args, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert both.returncode == 0, both.stderr[-2000:]
    host = socket.gethostname()
    shares = dict(re.findall(rf"({host}:\d): (\d+)", both.stderr))
    with Database(fake_gpu) as db:
        stored = db.trials(db.workloads()[0][0])
    measured_on = Counter(r.measured_on for r in stored)  # which device measured each, in the records
    assert set(measured_on) == {f"{host}:0", f"{host}:1"} and sum(measured_on.values()) == 48
    assert {name: int(n) for name, n in shares.items()} == measured_on  # as the run reported them
    monkeypatch.setenv("FAKE_GPU_LOSE", "1:5")
    lost = subprocess.run([*args[:-2], "--seed", "1", "--db", str(fake_gpu.with_name("lost.db"))],
                          env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert lost.returncode == 0, lost.stderr[-2000:]
    with Database(fake_gpu.with_name("lost.db")) as db:
        stored = db.trials(db.workloads()[0][0])
    assert len(stored) == 48 and [r for r in stored if not r.ok] == []
    assert Counter(r.measured_on for r in stored)[f"{host}:1"] == 5


def test_devices_that_are_not_there_or_malformed_are_one_line(fake_gpu):
    for devices, code, words in (("0,3", 3, "there is no CUDA device 3"), ("zero", 2, "bad --devices 'zero'")):
        proc = subprocess.run([sys.executable, "-m", "tritune", *tune(8, "--devices", devices, "--db", str(fake_gpu))],
                              env=dict(os.environ), capture_output=True, text=True, timeout=120)
        assert proc.returncode == code and words in proc.stderr.strip().splitlines()[-1], proc.stderr[-1000:]


def test_the_only_device_lost_mid_run_is_one_line_and_keeps_what_was_measured(fake_gpu, monkeypatch):
    monkeypatch.setenv("FAKE_GPU_LOSE", "0:6")
    proc = subprocess.run([sys.executable, "-m", "tritune", *tune(48, "--db", str(fake_gpu))],
                          env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and proc.stderr.strip().splitlines()[-1].startswith("tune-cli: no GPU left"), proc.stderr
    with Database(fake_gpu) as db:
        stored = db.trials(db.workloads()[0][0])
    assert len(stored) == 6 and all(r.ok for r in stored)  # nothing blamed on the candidate in flight
