"""`tune-cli run` end to end on a CPU: the session's wiring with a fake GPU worker and builder."""
import json
from functools import partial

import fake_worker
from fakes import FakeBuilder
from tritune.records.database import Database
from tritune.tuner import session
from tritune.tuner.cli import main, make_expr
from tritune.tuner.tuner import Task
from tritune.tuner.runner import Runner


def test_run_tunes_stores_resumes_and_reports(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(session, "Runner", partial(Runner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(session, "Builder", lambda *args, **kwargs: FakeBuilder())
    monkeypatch.setattr("tritune.tuner.cli.require_gpu", lambda: None)
    db, summary = tmp_path / "t.db", tmp_path / "s.json"
    args = ["run", "--shape", "512,256,1024", "--trials", "24", "--db", str(db), "--summary-json", str(summary)]
    main(args)
    out = json.loads(summary.read_text())
    assert out["trials"] == 24 and out["ratio_vs_torch"] == 1.1
    assert out["device"]["gpu"] == "Fake H100" and out["space_valid"] > 100
    assert "tritune best" in capsys.readouterr().out
    stored = Database(db).trials(Database(db).workloads()[0][0])
    assert len(stored) == 24 and all(r.status.value in ("OK", "COMPILE_ERROR", "WRONG_ANSWER") for r in stored)
    main(args)  # resumes: nothing new is measured
    assert len(Database(db).trials(Database(db).workloads()[0][0])) == 24
    assert "resumed: 24 trials" in capsys.readouterr().err


def test_tune_all_shares_one_gpu_session_and_skips_an_empty_space(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(session, "Runner", lambda *a, **k: started.append(1) or Runner(*a, handlers=fake_worker.session_handlers, **k))
    monkeypatch.setattr(session, "Builder", lambda *args, **kwargs: FakeBuilder())
    real = session.device_task

    def task(expr, info):  # the 64^3 workload's space is left empty
        t = real(expr, info)
        return Task(t.expr, t.device, t.limits, t.absent, frozenset()) if expr.m == 64 else t
    monkeypatch.setattr(session, "device_task", task)
    exprs = [make_expr("matmul", "512,256,1024", "fp16"), make_expr("matmul", "64", "fp16")]
    out = session.tune_all(exprs, Database(tmp_path / "t.db"), session.TuneOptions(trials=8, batch_size=8))
    assert started == [1]
    assert out[0]["trials"] == 8 and out[0]["best_config"] is not None
    assert out[1] == {"workload": exprs[1].to_dict(), "trials": 0, "best_config": None, "space_valid": 0}
