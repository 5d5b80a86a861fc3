"""Tuning through Dask distributed on a local cluster (loopback only): a scheduler in this process,
GPU hosts as `tune-cli gpu-host` processes on stand-in GPUs (tests/helpers/fake_gpu.py), one killed mid-run."""
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tritune.records.database import Database
from tritune.tuner import run as tuning
from tritune.tuner.gpus import start
from tritune.tuner.cli import main, make_expr

pytestmark = pytest.mark.system  # Dask clusters: a scheduler, worker processes, a killed host

HELPERS = Path(__file__).parents[1] / "helpers"


@pytest.fixture
def scheduler():
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", scheduler_port=0,
                           dashboard_address=":0")
    yield cluster.scheduler_address
    cluster.close()


@pytest.fixture
def hosts(scheduler, tmp_path):
    """Start `tune-cli gpu-host` processes on stand-in GPUs, all at once: `start(name=env, ...)` (the
    env as FAKE_GPU_* settings) returns each one's process and measurement log once all serve;
    every one is killed at the end."""
    procs = []

    def start(**hosts):
        started = {}
        for name, env in hosts.items():
            log = tmp_path / f"{name}.log"
            environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")]),
                       "TRITUNE_FAKE_GPU": "fake_gpu", "FAKE_GPU_LOG": str(log), "FAKE_GPU_MS": "20", **env}
            proc = subprocess.Popen([sys.executable, "-m", "tritune", "gpu-host", "--scheduler", scheduler,
                                     "--name", name, "--compile-workers", "1"], env=environ, stderr=subprocess.PIPE, text=True)
            procs.append(proc)
            started[name] = proc, log
        for proc, _ in started.values():
            lines = [proc.stderr.readline()]
            while lines[-1] and "serving" not in lines[-1]:  # the line that says it joined the scheduler
                lines.append(proc.stderr.readline())
            assert "serving" in lines[-1], "".join(lines)
        return started

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def started(log):
    """(workload, config key) of every measurement a host began."""
    path = Path(f"{log}.started")
    return [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []


def kill_when(proc, log, n):
    """Kill a host (SIGKILL) once it has begun `n` measurements, from a thread of its own."""
    def watch():
        deadline = time.time() + 60
        while len(started(log)) < n and time.time() < deadline:
            time.sleep(0.02)
        proc.kill()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_cluster_tunes_several_workloads_and_a_killed_host_loses_nothing(scheduler, hosts, tmp_path):
    # a measures one candidate and hangs on its second (both sent to it at once, as the first
    # workload on it starts: it takes two at a time), and is killed then; b's two GPUs start on
    # the facts its driver gives ahead of their workers
    started_hosts = hosts(a={"FAKE_GPU_HANG": "1"}, b={"FAKE_GPU_DEVICES": "2", "FAKE_GPU_EARLY": "1"})
    a, a_log = started_hosts["a"]
    killer = kill_when(a, a_log, 2)
    # convolutions: their spaces are enumerated in a fraction of a second (a matmul's takes seconds)
    exprs = [make_expr("conv2d", s, "fp16", padding="1") for s in ("8,28,28,64,64,3,3", "8,14,14,64,64,3,3",
                                                                   "4,14,14,32,64,3,3")]
    options = start.TuneOptions(strategy="random", batch_size=4, cluster=scheduler)
    with Database(tmp_path / "t.db") as db:
        out = tuning.tune_all(exprs, db, options, trials=[16, 12, 12])
        stored = {e.key: db.trials(e.key) for e in exprs}
    killer.join()
    assert [s["trials"] for s in out] == [16, 12, 12] and all(s["best_config"] for s in out)
    assert [len({r.config for r in trials}) for trials in stored.values()] == [16, 12, 12]
    assert all(r.ok for trials in stored.values() for r in trials)
    on = {(key, r.config.key): r.measured_on for key, trials in stored.items() for r in trials}
    assert set(Counter(on.values())) <= {"a:0", "b:0", "b:1"} and {"b:0", "b:1"} <= set(on.values())
    # the hosts report their GPUs' seconds back: the breakdown says how busy each was
    busy = Counter()
    for s in out:
        busy.update({k: v for k, v in s["time"].items() if k.startswith("GPU busy fraction, ")})
    assert all(s["time"]["GPU busy fraction"] > 0 for s in out) and busy["GPU busy fraction, b:0"] > 0
    assert busy["GPU busy fraction, b:1"] > 0
    # what host a began but never sent back (the hung one at least) was measured again on b
    unfinished = [c for c in started(a_log) if on.get(c) != "a:0"]
    assert started(a_log)[-1] in unfinished and all(on[c] in ("b:0", "b:1") for c in unfinished)


def test_losing_the_last_host_is_one_line_and_keeps_what_was_measured(scheduler, hosts, tmp_path):
    a, a_log = hosts(a={"FAKE_GPU_HANG": "5"})["a"]
    kill_when(a, a_log, 6)
    db = tmp_path / "t.db"
    proc = subprocess.run([sys.executable, "-m", "tritune", "run", "--op", "conv2d", "--shape", "8,28,28,64,64,3,3",
                           "--padding", "1", "--trials", "40", "--strategy", "random", "--batch-size", "4",
                           "--cluster", scheduler, "--db", str(db)], capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3 and last.startswith("tune-cli: no GPU left to measure on: host a lost"), proc.stderr
    assert "Traceback" not in proc.stderr
    with Database(db) as stored:
        trials = stored.trials(stored.workloads()[0][0])
    measured = Path(a_log).read_text().split()  # what host a measured: 5, the last result maybe not sent yet
    assert len(measured) == 5 and 4 <= len(trials) <= 5 and {r.config.key for r in trials} <= set(measured)
    assert all(r.ok and r.measured_on == "a:0" for r in trials)  # nothing blamed on the hung one


@pytest.mark.parametrize("args, code, words", [
    (["--cluster", "tcp://127.0.0.1:1"], 3, "cannot reach a Dask scheduler at tcp://127.0.0.1:1"),
    (["--cluster", "no port"], 2, "bad scheduler address 'no port'"),
    (["--cluster", "tcp://127.0.0.1:1", "--devices", "all"], 2, "--devices picks this host's GPUs"),
    (["--cluster", "SCHEDULER", "--cluster-wait", "0"], 3, "no GPU host joined the scheduler"),
])
def test_bad_or_empty_clusters_are_one_line(scheduler, tmp_path, capsys, args, code, words):
    args = [scheduler if a == "SCHEDULER" else a for a in args]
    with pytest.raises(SystemExit) as info:
        main(["run", "--shape", "256", "--trials", "4", "--db", str(tmp_path / "t.db"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == code and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "t.db").exists()  # nothing written


def test_a_worker_without_a_scheduler_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "tritune", "gpu-host", "--scheduler", "tcp://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stderr.strip() == (
        "tune-cli: cannot reach a Dask scheduler at tcp://127.0.0.1:1: Connection refused"), proc.stderr
