"""The whole-model check: graph verdicts decide what the backend replays; the check stores them and
reports a machine without a GPU in one line per mode."""
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import tritune
from test_compiler import FAST, fresh_dynamo, store, tuned_calls  # noqa: F401 - fixtures
from tritune.kernels.device import device_info
from tritune.kernels.family import device_key
from tritune.records.database import Database
from tritune.records.dispatch import graph_mode
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner import timing
from tritune.tuner.cli.display import check_table
from waiting import eventually
from tritune.tuner.model import check as model_check


def compiled_once(db_path, model, x, **options):
    torch._dynamo.reset()
    backend = tritune.compiler(db_path, fallback="eager", **options)
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
    return backend, y


def test_a_graph_measured_slower_with_tuned_kernels_goes_to_the_fallback_whole(tmp_path, tuned_calls):
    model, x = nn.Sequential(nn.Linear(23, 21), nn.ReLU(), nn.Linear(21, 9)), torch.randn(17, 23)
    db = store(tmp_path / "t.db", [t.expr for t in tritune.extract_tasks(model, (x,))])
    first, _ = compiled_once(db, model, x)
    assert [k for _, k in first.sites] == ["tuned", "tuned"] and len(tuned_calls) == 2 and len(first.graphs) == 1
    device = device_key(device_info(), "matmul")
    with Database(db) as d:
        d.save_graph_verdict(first.graphs[0], device, graph_mode("eager", None), "inductor", {})
    tuned_calls.clear()
    second, y = compiled_once(db, model, x)
    assert [k for _, k in second.sites] == ["graph", "graph"] and tuned_calls == []
    assert torch.allclose(y, model(x))
    # the verdict holds for the mode it was measured in, and the check itself reads none
    assert [k for _, k in compiled_once(db, model, x, mode="reduce-overhead")[0].sites] == ["tuned"] * 2
    assert [k for _, k in compiled_once(db, model, x, graph_verdicts=False)[0].sites] == ["tuned"] * 2
    with Database(db) as d:
        d.save_graph_verdict(first.graphs[0], device, graph_mode("eager", None), "tritune", {})
    assert [k for _, k in compiled_once(db, model, x)[0].sites] == ["tuned"] * 2


def test_a_retuned_site_is_another_graph(tmp_path):
    model, x = nn.Linear(23, 21), torch.randn(17, 23)
    expr = tritune.extract_tasks(model, (x,))[0].expr
    first = compiled_once(store(tmp_path / "a.db", [expr]), model, x)[0].graphs
    with Database(tmp_path / "b.db") as d:  # the same workload, tuned to another config
        d.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        other = Config.of(**{**dict(FAST), "BLOCK_M": 16})
        d.save(expr.key, device_key(device_info(), "matmul"), [MeasureResult(other, Status.OK, 1.0, 1.0, 1.0, 1.0)])
    second = compiled_once(tmp_path / "b.db", model, x)[0].graphs
    assert len(first) == len(second) == 1 and first != second


def test_the_check_stores_each_measured_mode_and_reports_failures(tmp_path):
    device = device_key(device_info(), "matmul")
    results = [
        {"mode": "default", "graphs": ["g1", "g2"], "tuned_sites": 2, "sites": 3, "device": device.to_json(),
         "inductor_ms": 1.0, "tritune_ms": 1.2, "eager_ms": 2.0, "ratio": 1.2, "rel_error": 1e-3, "rounds": 3, "winner": "inductor"},
        {"mode": "reduce-overhead", "graphs": ["g1", "g2"], "tuned_sites": 2, "sites": 3, "device": device.to_json(),
         "inductor_ms": 0.3, "tritune_ms": 0.25, "eager_ms": 2.0, "ratio": 0.83, "rel_error": 1e-3, "rounds": 3, "winner": "tritune"},
        {"mode": "max-autotune", "error": "RuntimeError: boom"},
    ]
    model_check._store(tmp_path / "t.db", results)
    with Database(tmp_path / "t.db") as db:
        assert [db.graph_verdict(g, device, "inductor/default") for g in ("g1", "g2")] == ["inductor"] * 2
        assert db.graph_verdict("g1", device, "inductor/reduce-overhead") == "tritune"
        assert db.graph_verdict("g1", device, "inductor/max-autotune") is None
    table = check_table(results)
    assert table.row_count == 3 and table.caption is None
    results[0]["seconds"] = {"process and imports": 4.25, "compile by Inductor alone": 9.5}
    assert check_table(results).caption == ("where the check's time went: default: process and imports 4.2 s, "
                                            "compile by Inductor alone 9.5 s")


def test_without_a_gpu_the_check_says_so_once_per_mode_and_stores_nothing(tmp_path):
    results = model_check.check_model(f"{Path(__file__).parents[1] / 'helpers' / 'models.py'}:Awkward", ["2,3,29", "3,5,7"], "fp32", tmp_path / "t.db",
                                      modes=("default", "reduce-overhead"), timeout_s=120)
    assert [r["mode"] for r in results] == ["default", "reduce-overhead"]
    assert all(r["error"].startswith("the model could not be built on the GPU") for r in results), results
    assert all(set(r["seconds"]) == {"process and imports", "model built"} for r in results)  # each mode's own start
    with Database(tmp_path / "t.db") as db:
        assert "graph_verdicts" not in db._db.table_names()


def test_a_check_process_leaves_without_finalising_once_its_result_is_written(tmp_path, monkeypatch):
    """Its parent joins it before the next mode is timed: it ends as the GPU workers do
    (`lifeline.leave`), not by finalising torch, Triton and a CUDA context."""
    from tritune.tuner.model import subject

    out, events = tmp_path / "r.json", []

    class Conn:
        def recv(self):
            return "go"

        def send(self, what):
            events.append(what)

    def no_gpu(*args):
        raise RuntimeError("no CUDA GPU")
    monkeypatch.setattr(model_check, "bind_to_parent", lambda parent: None)
    monkeypatch.setattr(model_check.os, "nice", lambda n: 0)
    monkeypatch.setattr(subject, "load_subject", no_gpu)
    monkeypatch.setattr(model_check, "leave", lambda: events.append(("left", out.exists())))
    model_check._child(os.getpid(), Conn(), "m.py:f", [], None, "fp16", str(tmp_path / "t.db"), "default", 3, str(out))
    assert events == ["compiled", ("left", True)]


def test_paired_ratio_takes_each_round_as_a_pair():
    # the host slowed down in rounds 2 and 4 for both: the ratio of each pair holds
    ours, theirs = [0.9, 1.8, 0.9, 1.8, 0.9], [1.0, 2.0, 1.0, 2.0, 1.0]
    assert abs(timing.paired_ratio(ours, theirs) - 0.9) < 1e-12


def test_under_cuda_graphs_the_gpu_time_decides_and_a_win_is_never_thrown_away():
    # a host-bound phase read the tuned model 0.3% slower by wall while its GPU time was 6.8% lower
    assert model_check.wins(wall_ratio=1.003, gpu_ratio=0.932, cuda_graphs=True)
    assert model_check.wins(wall_ratio=1.10, gpu_ratio=1 - model_check.GRAPH_MARGIN, cuda_graphs=True)
    assert not model_check.wins(wall_ratio=0.90, gpu_ratio=0.99, cuda_graphs=True)  # a tie on the GPU is Inductor's


def test_in_the_default_mode_the_wall_time_decides():
    # without CUDA graphs the host's launches are part of the step: fewer launches win there
    assert model_check.wins(wall_ratio=0.90, gpu_ratio=1.05, cuda_graphs=False)
    assert not model_check.wins(wall_ratio=0.99, gpu_ratio=0.80, cuda_graphs=False)


@pytest.mark.system
def test_the_early_check_waits_for_the_tuning_and_is_killed_if_it_never_comes(tmp_path):
    spec = f"{Path(__file__).parents[1] / 'helpers' / 'models.py'}:Awkward"
    with model_check.EarlyCheck(spec, ["2,3,29", "3,5,7"], "fp32", tmp_path / "t.db", modes=("default",)) as early:
        time.sleep(3)  # long enough for its start and the model's (failed) build here
        assert all(c.proc.is_alive() and not c.out.exists() for c in early._children)  # waiting for the tuning
        niced = min(19, os.nice(0) + model_check.CHECK_NICE)  # below the tuning's compile pool
        for c in early._children:
            eventually(lambda: os.getpriority(os.PRIO_PROCESS, c.proc.pid) == niced, timeout_s=60)
        results = early.finish(timeout_s=120)
    assert [r["mode"] for r in results] == ["default"] and "could not be built" in results[0]["error"]
    with model_check.EarlyCheck(spec, ["2,3,29", "3,5,7"], "fp32", tmp_path / "t.db") as left:
        procs = [c.proc for c in left._children]
    assert len(procs) == 2 and not any(p.is_alive() for p in procs)  # a tuning that failed leaves no check behind


@pytest.mark.system
def test_the_modes_compile_at_once_and_time_one_after_another(tmp_path, monkeypatch):
    results = stand_in_check("0.3", tmp_path, monkeypatch)
    assert [r["mode"] for r in results] == ["default", "reduce-overhead"]
    first, second = (r["heard"] for r in results)
    assert max(first["go"], second["go"]) < min(first["time"], second["time"])  # every compile before any timing
    assert first["timed"] < second["time"]  # one mode timed at a time


@pytest.mark.system
def test_the_modes_may_start_compiling_before_the_check_is_finished(tmp_path, monkeypatch):
    """tune-model lets the compiles start as the last verdict is stored, before its session ends;
    `finish` then only waits for them (each child is told to go once)."""
    import check_stub

    monkeypatch.setattr(model_check, "_child", check_stub.child)
    with model_check.EarlyCheck("0.1", [], "fp16", tmp_path / "t.db", modes=("default", "reduce-overhead")) as early:
        early.compile_now()
        went = [Path(early._tmp.name) / f"went-{mode}" for mode in early.modes]
        eventually(lambda: all(w.exists() for w in went), timeout_s=60)
        finishing = time.time()
        results = early.finish(timeout_s=120)
    assert [r["heard"]["words"] for r in results] == [["go", "time"]] * 2
    assert all(r["heard"]["go"] < finishing for r in results)


@pytest.mark.system
def test_a_mode_out_of_gpu_memory_beside_the_others_is_checked_again_alone(tmp_path, monkeypatch):
    results = stand_in_check("0.1:oom", tmp_path, monkeypatch)
    assert [r["mode"] for r in results] == ["default", "reduce-overhead"]
    assert not any("error" in r for r in results), results
    again, other = (r["heard"] for r in results)
    assert again["started"] > other["timed"]  # started once the others were done


def stand_in_check(spec, tmp_path, monkeypatch):
    """EarlyCheck's results for both modes, its children the stand-in (`check_stub.child`, `spec`)."""
    import check_stub

    monkeypatch.setattr(model_check, "_child", check_stub.child)
    with model_check.EarlyCheck(spec, [], "fp16", tmp_path / "t.db", modes=("default", "reduce-overhead")) as early:
        return early.finish(timeout_s=120)
