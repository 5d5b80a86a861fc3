"""`tune-cli run` end to end on a CPU: the session's wiring with a fake GPU worker and builder."""
import json
from functools import partial

import pytest

import fake_worker
from fakes import FakeBuilder
from tritune.records.database import Database
from tritune.tuner import run as tuning
from tritune.tuner.gpus import start
from tritune.tuner.cli import main, make_expr
from tritune.tuner.task import Task
from tritune.tuner.worker.local import LocalRunner


@pytest.mark.system
def test_run_tunes_stores_resumes_and_reports(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    db, summary = tmp_path / "t.db", tmp_path / "s.json"
    args = ["run", "--shape", "512,256,1024", "--trials", "24", "--db", str(db), "--summary-json", str(summary)]
    main(args)
    out = json.loads(summary.read_text())
    assert out["trials"] == 24 and out["ratio_vs_best_alternative"] == 1.1 and out["best_alternative"] == "mm"
    assert out["device"]["gpu"] == "Fake H100" and out["space_valid"] > 100
    assert "tritune best" in capsys.readouterr().out
    stored = Database(db).trials(Database(db).workloads()[0][0])
    assert len(stored) == 24 and all(r.status.value in ("OK", "COMPILE_ERROR", "WRONG_ANSWER") for r in stored)
    main(args)  # resumes: nothing new is measured
    assert len(Database(db).trials(Database(db).workloads()[0][0])) == 24
    assert "resumed: 24 trials" in capsys.readouterr().err


@pytest.mark.system
def test_tune_all_shares_one_gpu_session_and_skips_an_empty_space(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(start, "LocalRunner", lambda *a, **k: started.append(1) or LocalRunner(*a, handlers=fake_worker.session_handlers, **k))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    real = tuning.device_task

    def task(expr, info):  # the 64^3 workload's space is left empty
        t = real(expr, info)
        return Task(t.expr, t.device, t.limits, t.absent, frozenset()) if expr.m == 64 else t
    monkeypatch.setattr(tuning, "device_task", task)
    exprs = [make_expr("matmul", "512,256,1024", "fp16"), make_expr("matmul", "64", "fp16")]
    out = tuning.tune_all(exprs, Database(tmp_path / "t.db"), start.TuneOptions(trials=8, batch_size=8))
    assert started == [1]
    assert out[0]["trials"] == 8 and out[0]["best_config"] is not None
    assert out[1] == {"workload": exprs[1].to_dict(), "trials": 0, "best_config": None, "space_valid": 0}


@pytest.mark.system
def test_the_summary_says_where_the_time_went(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    summary = tmp_path / "s.json"
    main(["run", "--shape", "512,256,1024", "--trials", "16", "--db", str(tmp_path / "t.db"),
          "--summary-json", str(summary), "--verbose"])
    times = json.loads(summary.read_text())["time"]
    shown = capsys.readouterr().out
    assert "where the time went" in shown and "start-up before the run" in shown
    assert "first GPU worker's imports done at" in shown and "first GPU worker's CUDA up at" in shown
    assert "first GPU worker's answer came at" in shown and "priors loaded at" in shown
    assert times["wall"] > 0 and 0 <= times["GPU busy fraction"] <= 1
    loop = ("proposal (search over the model)", "model fit", "learning from results", "waiting for measurements",
            "claims (database)", "outside the loop (space, prior, head-to-head)")
    alongside = ("GPU waiting for compiles", "correctness check (GPU worker)", "timing (GPU worker)",
                 "worker start and requests", "storing results (database)")
    assert all(times[p] >= 0 for p in loop + alongside)
    assert abs(sum(times[p] for p in loop) - times["wall"]) <= 0.5
    assert sum(times[p] for p in alongside) <= times["wall"] + 0.5


def test_the_start_up_splits_into_this_process_the_session_and_the_workers_own_start():
    from tritune.tuner.breakdown import process_age_s, startup

    age = process_age_s()
    assert age is not None and 0 < age < 24 * 3600  # this test process's own age, from /proc
    times = startup(1.26, 9.04, {"imported_s": 3.0, "up_s": 7.52, "age_s": 7.6, "spawned_s": 0.31,
                                 "prepared_s": 2.5, "answered_s": 8.0})
    assert times == {"this process before the session": 1.3, "GPU session start (workers and compile pool)": 9.0,
                     "session: processes spawned at": 0.3, "session: priors loaded at": 2.5,
                     "session: first GPU worker's imports done at": 3.0, "session: first GPU worker's CUDA up at": 7.5,
                     "session: first GPU worker's answer came at": 8.0, "first GPU worker's age then": 7.6}
    assert startup(None, 2.0, {}) == {"GPU session start (workers and compile pool)": 2.0}  # nothing reported


def test_breakdown_arithmetic():
    from tritune.tuner.breakdown import summary

    times = summary(10.0, {"propose": 2.0, "fit": 1.5, "learn": 0.5, "wait": 4.0, "store": 0.5, "compile_wait": 1.0,
                           "measure": 4.0, "save": 0.2, "check": 1.0, "timing": 2.0},
                    {"check": 5.0, "timing": 5.0}, {"compile": 16.0}, 4)  # the devices' own: other workloads' too
    assert times["model fit"] == 1.5 and times["proposal (search over the model)"] == 0.5
    assert times["worker start and requests"] == 1.0 and times["GPU idle"] == 7.0
    assert times["outside the loop (space, prior, head-to-head)"] == 3.0
    assert times["storing results (database)"] == 0.2 and times["claims (database)"] == 0.5
    assert times["GPU busy fraction"] == 0.3 and times["compile pool busy fraction"] == 0.4
    assert not any(k.startswith("GPU busy fraction,") for k in times)  # one device: no split


def test_breakdown_per_device_and_outside_the_loop():
    from tritune.tuner.breakdown import summary

    measured = {"check": 2.0, "timing": 8.0, "check on h:0": 1.5, "timing on h:0": 6.0, "check on h:1": 0.5,
                "timing on h:1": 2.0}
    runner = {"check on h:2": 9.0, "timing on h:2": 9.0, "alternatives": 7.5}  # h:2 measured another workload
    times = summary(10.0, {"propose": 1.0, "wait": 5.0, "space and prior": 2.5, "head-to-head": 1.0, **measured},
                    runner, {"compile": 16.0}, 4, devices=2)
    assert times["GPU busy fraction"] == 0.5 and times["GPU busy fraction, h:0"] == 0.75
    assert times["GPU busy fraction, h:1"] == 0.25 and "GPU busy fraction, h:2" not in times
    alone = summary(10.0, {"check": 1.0, "timing": 3.0, "check on h:1": 1.0, "timing on h:1": 3.0}, runner,
                    {"compile": 16.0}, 4)  # a workload measured on one GPU of several: named
    assert alone["GPU busy fraction"] == alone["GPU busy fraction, h:1"] == 0.4
    assert times["outside the loop (space, prior, head-to-head)"] == 4.0
    assert times["space and prior (before the loop)"] == 2.5 and times["head-to-head (after the loop)"] == 1.0
    assert times["alternatives compiled ahead (second worker)"] == 7.5


@pytest.mark.parametrize("handlers", [fake_worker.library_wins_handlers, fake_worker.near_tie_handlers,
                                      fake_worker.compile_wins_handlers])
@pytest.mark.system
def test_a_library_call_that_wins_the_head_to_head_is_what_replay_runs(tmp_path, monkeypatch, handlers):
    """The search's short runs can rank a kernel above the library by noise; the final head-to-head
    (long runs, in turns) decides, and the database's best follows it: the library stays unless
    the kernel beats it by the margin, and where torch.compile's lowering beats the kernel (a
    compiled model then leaves the site to Inductor)."""
    from tritune.kernels.contraction.expr import Matmul
    from tritune.schedules.config import Config

    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    expr = Matmul(256, 256, 256)
    with Database(tmp_path / "t.db") as db:
        out = tuning.tune(expr, db, start.TuneOptions(trials=12, batch_size=4))
        assert [r.result.config for r in db.best_rows()] == [Config.of(library="mm")]
        assert db.best(expr.key, db.best_rows()[0].device).config == Config.of(library="mm")
    assert out["best_config"] == {"library": "mm"} and out["final_ours_ms"] in (0.9, 1.02, 2.0)


@pytest.mark.system
def test_a_kernel_that_ties_torch_compile_stays_where_the_library_call_is_far_slower(tmp_path, monkeypatch):
    """Within the margin of torch.compile's lowering but twice as fast as the library call (whose
    epilogue runs unfused): the kernel is stored, since call-time replay runs what is stored."""
    from tritune.kernels.contraction.expr import Matmul

    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.compile_ties_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    expr = Matmul(256, 256, 256)
    with Database(tmp_path / "t.db") as db:
        out = tuning.tune(expr, db, start.TuneOptions(trials=12, batch_size=4))
        assert db.best(expr.key, db.best_rows()[0].device).config.library is None
    assert "library" not in out["best_config"] and out["final_ours_ms"] == 1.0


def test_the_device_facts_unpickle_without_importing_torch(monkeypatch):
    """The tuning process never imports torch; a TorchVersion in the worker's handshake made its
    unpickling import torch there, seconds before the first round could start."""
    import pickle
    from types import SimpleNamespace

    import torch

    from tritune.kernels import device

    facts = [device.device_info.__wrapped__(0)]  # under the interpreter
    props = SimpleNamespace(name="Fake H100", major=9, minor=0, multi_processor_count=132,
                            shared_memory_per_block_optin=232448)
    monkeypatch.setattr(device, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    facts.append(device.device_info.__wrapped__(0))  # on a GPU
    for each in facts:
        assert all(type(v) in (str, int, float) for v in each.values()), each
        assert b"torch_version" not in pickle.dumps(each)
