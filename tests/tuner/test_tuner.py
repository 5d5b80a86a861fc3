"""The tuning loop with fake builder/runner: statuses stored, resume, early stop, fault hook."""

import pytest

from fakes import FakeBuilder, FakeRunner, fake_time
from tritune.kernels.family import device_key
from tritune.kernels.contraction.expr import Matmul
from tritune.records.database import Database
from tritune.records.result import DeviceKey, Status
from tritune.schedules.space import Limits
from tritune.search import make_strategy
from tritune.kernels.contraction.features import FEATURE_NAMES
from tritune.tuner.prior import database_prior as warm_start
from tritune.tuner.task import Task, best_of
from tritune.tuner.tuner import Tuner

EXPR = Matmul(1024, 1024, 1024)
DEVICE = DeviceKey("Fake GPU", "9.0", "3.x", "2.x", "t1")
TASK = Task(EXPR, DEVICE, Limits.for_capability(9, 0))


def tune(db, trials, seed=0, **kw):
    builder, runner = FakeBuilder(), FakeRunner()
    tuner = Tuner(TASK, make_strategy("random", TASK.space, seed=seed), builder, runner, db, batch_size=8, **kw)
    return tuner.run(trials), builder, runner


def test_failures_are_classified_and_stored(tmp_path):
    db = Database(tmp_path / "t.db")
    history, builder, runner = tune(db, 96)
    stored = db.trials(EXPR.key, DEVICE)
    assert len(history) == len(stored) == 96
    statuses = {r.status for r in stored}
    assert Status.COMPILE_ERROR in statuses and Status.OK in statuses
    assert all(r.t_median is None for r in stored if not r.ok)
    # a compile failure is never sent to the runner
    assert not any(c.get("BLOCK_K") == 128 for c in runner.measured)
    best = db.best(EXPR.key, DEVICE)
    assert best.t_median == min(fake_time(r.config) for r in stored if r.ok)
    assert best == best_of(history)


def test_rerun_resumes_and_never_remeasures(tmp_path):
    db = Database(tmp_path / "t.db")
    first, _, _ = tune(db, 24)
    again, builder, runner = tune(db, 24)
    assert builder.built == [] and runner.measured == []  # budget already met: nothing new
    more, builder, _ = tune(db, 40)
    assert len(more) == 40 and len(builder.built) == 16
    assert not {c for c in builder.built} & {r.config for r in first}
    assert len(db.trials(EXPR.key, DEVICE)) == 40


@pytest.mark.system
def test_other_device_is_not_resumed(tmp_path):
    db = Database(tmp_path / "t.db")
    tune(db, 16)
    other = Task(EXPR, DeviceKey("Fake GPU", "9.0", "3.x", "2.x", "t2"), TASK.limits)  # new template hash
    tuner = Tuner(other, make_strategy("random", other.space), FakeBuilder(), FakeRunner(), db, batch_size=8)
    assert len(tuner.run(16)) == 16 and tuner.stored == []


def test_early_stopping_stops_before_the_budget(tmp_path):
    history, _, _ = tune(Database(tmp_path / "t.db"), 2000, early_stop=8)
    assert len(history) < 2000
    best_at = history.index(best_of(history))
    assert len(history) - 1 - best_at >= 8


def test_injected_faults_are_recorded_and_the_run_completes(tmp_path):
    db = Database(tmp_path / "t.db")
    history, _, runner = tune(db, 16, faults=("oob", "hang"))
    schedules = history[1:]  # after the library call
    assert [r.status for r in schedules[:2]] == [Status.CRASH, Status.TIMEOUT]
    assert len(history) == 16 and any(r.ok for r in history)
    assert all(r.status in (Status.OK, Status.COMPILE_ERROR, Status.WRONG_ANSWER) for r in schedules[2:])
    assert [r.config.get("fault") for r in db.trials(EXPR.key, DEVICE)[1:3]] == ["oob", "hang"]


def test_device_key_changes_with_the_template():
    info = {"gpu": "G", "capability": "9.0", "triton": "3.6.0", "torch": "2.11.0"}
    assert device_key(info, "matmul").template and device_key(info, "matmul") == device_key(dict(info), "matmul")
    assert device_key(info, "matmul") != device_key(dict(info, triton="3.9.0"), "matmul")


def test_warm_start_collects_other_shapes_of_the_op_on_this_device(tmp_path):
    db = Database(tmp_path / "t.db")
    tune(db, 24)  # EXPR on DEVICE
    other = Matmul(512, 2048, 1024)
    tuner = Tuner(Task(other, DEVICE, TASK.limits), make_strategy("random", TASK.space), FakeBuilder(),
                  FakeRunner(), db, batch_size=8)
    tuner.run(16)
    prior = warm_start(db, Task(Matmul(2048, 2048, 2048), DEVICE, TASK.limits))
    # schedules only: each workload's library call has no schedule features
    assert prior.X.shape == (38, len(FEATURE_NAMES)) and sorted(set(prior.groups.tolist())) == [0, 1]
    assert prior.y.max() == 1.0 and prior.y.min() == 0.0  # failures labelled worst
    assert warm_start(db, Task(EXPR, DEVICE, TASK.limits)).X.shape[0] == 15  # its own trials excluded
    elsewhere = DeviceKey("Other GPU", "8.0", "3.x", "2.x", "t1")
    assert warm_start(db, Task(EXPR, elsewhere, TASK.limits)) is None


@pytest.mark.system
def test_a_gated_search_with_no_gated_trials_learns_from_the_plain_gemms_lifted(tmp_path):
    from tritune.kernels.gated.expr import ACTIVATIONS, Gated
    from tritune.kernels.gated.features import FEATURE_NAMES as GATED_FEATURES
    from tritune.tuner.prior import prior_for

    from dataclasses import replace

    from tritune.kernels.family import family

    db = Database(tmp_path / "t.db")
    on = {op: replace(DEVICE, template=family(op).template_hash()) for op in ("matmul", "gated")}
    plain = Task(EXPR, on["matmul"], TASK.limits)  # plain GEMM trials of EXPR, under the matmul template
    Tuner(plain, make_strategy("random", plain.space), FakeBuilder(), FakeRunner(), db, batch_size=8).run(24)
    gated = Task(Gated(16, 1024, 512, "fp16", "gelu"), on["gated"], TASK.limits)
    prior = prior_for(db, gated, "db")
    assert prior.X.shape == (23, len(GATED_FEATURES)) and set(prior.groups.tolist()) == {0}
    assert (prior.X[:, -3:] == [0, 0, ACTIVATIONS.index("gelu")]).all()  # one weight tile per MMA, no bias
    assert prior_for(db, gated, "none") is None
    # once another gated workload is measured, the search learns from it alone
    other = Task(Gated(32, 1024, 512, "fp16", "gelu"), on["gated"], TASK.limits)
    Tuner(other, make_strategy("random", other.space), FakeBuilder(), FakeRunner(), db, batch_size=8).run(16)
    own = prior_for(db, gated, "db")
    assert own.X.shape[0] < 16 and set(own.groups.tolist()) == {0}
    # an op that names no other learns from nothing else
    from tritune.kernels.rows.expr import Softmax

    assert prior_for(db, Task(Softmax(64, 1024), replace(DEVICE, template=family("softmax").template_hash()), TASK.limits),
                     "db") is None


@pytest.mark.system
def test_the_plain_gemms_a_gated_search_learns_from_are_read_under_their_own_template(tmp_path):
    """Each op's trials are stored under its template's hash (part of the device key): a gated
    task's lift reads the plain GEMMs' trials under the matmul template, on the same GPU."""
    from dataclasses import replace

    from tritune.kernels.family import family
    from tritune.kernels.gated.expr import Gated
    from tritune.tuner.prior import prior_for

    db = Database(tmp_path / "t.db")
    on = {op: replace(DEVICE, template=family(op).template_hash()) for op in ("matmul", "gated")}
    plain = Task(EXPR, on["matmul"], TASK.limits)
    Tuner(plain, make_strategy("random", plain.space), FakeBuilder(), FakeRunner(), db, batch_size=8).run(16)
    gated = Task(Gated(16, 1024, 512, "fp16", "gelu"), on["gated"], TASK.limits)
    assert prior_for(db, gated, "db").X.shape[0] >= 8
    elsewhere = Task(gated.expr, replace(on["gated"], gpu="Other GPU"), TASK.limits)
    assert prior_for(db, elsewhere, "db") is None


@pytest.mark.system
def test_the_library_is_measured_first_stored_and_chosen_when_it_wins(tmp_path, monkeypatch):
    import fakes
    from tritune.schedules.config import Config

    db = Database(tmp_path / "t.db")
    history, builder, runner = tune(db, 24)
    library = [r for r in history if r.config.library is not None]
    assert [r.config for r in library] == [Config.of(library="mm")] == list(TASK.libraries)
    assert runner.measured[0] == Config.of(library="mm")  # the bar to beat, measured before any schedule
    assert db.best(EXPR.key, DEVICE).config.library is None  # schedules beat it here
    monkeypatch.setattr(fakes, "LIBRARY_MS", 0.5)
    other = Matmul(512, 512, 512)
    task = Task(other, DEVICE, TASK.limits)
    seen = []
    strategy = make_strategy("random", task.space, seed=0)
    original = strategy.update
    strategy.update = lambda results: seen.extend(results) or original(results)
    Tuner(task, strategy, FakeBuilder(), FakeRunner(), db, batch_size=8).run(16)
    assert db.best(other.key, DEVICE).config == Config.of(library="mm")  # the library won: it is the best
    assert seen and all(r.config.library is None for r in seen)  # the search never sees it
    again, _, runner = tune(db, 32)
    assert Config.of(library="mm") not in runner.measured  # resumed: not measured twice


def test_the_cost_model_never_learns_from_library_calls(tmp_path):
    from tritune.cost_model.dataset import training_set

    db = Database(tmp_path / "t.db")
    tune(db, 16)
    results = db.trials(EXPR.key, DEVICE)
    X, y = training_set(EXPR, TASK.limits, results)
    assert len(y) == len(results) - 1 and X.shape[1] == len(FEATURE_NAMES)
