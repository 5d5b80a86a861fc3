"""The run's start and end off the critical path: the head-to-head's alternatives compiled ahead in a
second worker while the search measures in the first, and the prior learned while the space is
enumerated. Real worker processes with stand-in handlers (tests/helpers/fake_worker.py); no GPU, no clocks."""
import threading
from functools import partial

import numpy as np
import pytest

import fake_worker
from fakes import FakeBuilder
from test_sa import SPACE, FakeModel, knob_rows
from tritune.cost_model.dataset import Prior
from tritune.kernels.contraction.expr import Matmul
from tritune.records.database import Database
from tritune.schedules.config import Config
from tritune.search import make_strategy
from tritune.tuner import run as tuning
from tritune.tuner.cli import make_expr
from tritune.tuner.gpus import start
from tritune.tuner.gpus.start import TuneOptions
from tritune.tuner.worker.local import LocalRunner
from tritune.tuner.worker.runners import Runners

EXPR = Matmul(256, 256, 256)
MM = Config.of(library="mm")


def test_the_head_to_head_runs_in_the_second_worker_on_what_it_compiled_ahead():
    with LocalRunner(handlers=fake_worker.ahead_handlers, judge=True) as runner:
        runner.start()
        runner.prepare_head_to_head(EXPR)
        measuring = runner.measure(EXPR, MM).message  # "library": measured in the first worker
        h2h = runner.head_to_head(EXPR, MM)
        assert measuring == "library" and h2h["ready"] and h2h["pid"] != runner._proc.pid
        assert h2h["pid"] == runner._judge._proc.pid and runner.watch.spent["alternatives"] == 0.5
        other = Matmul(512, 256, 256)
        assert not runner.head_to_head(other, MM)["ready"]  # not prepared: compiled at the end, as before


def test_the_second_worker_warms_torch_compile_up_as_it_starts_before_compiling_alternatives():
    with LocalRunner(handlers=fake_worker.ahead_handlers, judge=True) as runner:
        runner.start()
        runner.prepare_head_to_head(EXPR)
        assert runner.head_to_head(EXPR, MM)["warm before"]
    with LocalRunner(handlers=fake_worker.ahead_handlers, judge=True) as runner:
        runner.prepare_head_to_head(EXPR)  # never started: no session start to warm up in
        assert not runner.head_to_head(EXPR, MM)["warm before"]


def test_a_workload_starting_while_the_second_worker_warms_up_is_not_held_up(monkeypatch, tmp_path):
    """The second worker's lock is held for its whole warm-up: a workload asking it to compile its
    alternatives meanwhile queues that and goes on to its search (it once waited out the warm-up)."""
    warming, go = tmp_path / "warming", tmp_path / "go"
    monkeypatch.setenv("FAKE_WARMING", str(warming))
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))
    with LocalRunner(handlers=fake_worker.slow_warm_handlers, judge=True) as runner:
        runner.start()
        for _ in range(3000):  # the warm-up has begun in the second worker (at most a minute)
            if warming.exists():
                break
            threading.Event().wait(0.02)
        asked = threading.Thread(target=runner.prepare_head_to_head, args=(EXPR,), daemon=True)
        asked.start()
        asked.join(10)
        returned = not asked.is_alive()
        go.touch()
        assert warming.exists() and returned
        assert runner.head_to_head(EXPR, MM)["ready"]  # prepared after the warm-up, in order


def test_without_a_second_worker_the_measuring_one_compares():
    with LocalRunner(handlers=fake_worker.ahead_handlers) as runner:
        runner.prepare_head_to_head(EXPR)  # nothing to prepare in
        h2h = runner.head_to_head(EXPR, MM)
        assert h2h["pid"] == runner._proc.pid and not h2h["ready"] and "alternatives" not in runner.watch.spent


def test_a_group_prepares_on_the_device_that_compares():
    first = LocalRunner(handlers=fake_worker.ahead_handlers, judge=True)
    second = LocalRunner(handlers=fake_worker.ahead_handlers, judge=True, device=1)
    group = Runners([first, second])
    try:
        group.prepare_head_to_head(EXPR)
        h2h = group.head_to_head(EXPR, MM)
        assert h2h["ready"] and h2h["pid"] == first._judge._proc.pid and second._judge._proc is None
    finally:
        group.close(now=True)


@pytest.mark.system
def test_a_run_compiles_the_alternatives_ahead_and_reports_the_parts_outside_the_loop(tmp_path):
    runner = LocalRunner(handlers=fake_worker.ahead_handlers, judge=True)
    runner.start()
    try:
        with Database(tmp_path / "t.db") as db:
            out = tuning.tune(EXPR, db, TuneOptions(trials=12, batch_size=4), (runner, FakeBuilder()))
    finally:
        runner.close()
    times = out["time"]
    assert out["trials"] == 12 and times["alternatives compiled ahead (second worker)"] == 0.5
    parts = times["space and prior (before the loop)"] + times["head-to-head (after the loop)"]
    assert 0 <= parts <= times["outside the loop (space, prior, head-to-head)"] + 0.1


@pytest.mark.system
def test_the_next_workloads_strategy_is_built_during_the_head_to_head_with_every_earlier_trial(monkeypatch, tmp_path):
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    exprs = [make_expr("matmul", shape, "fp16") for shape in ("128", "64,128,128", "64")]
    built, real = [], tuning._strategy

    def strategy(task, db, options):  # which thread built it, and the trials its prior could see
        built.append((threading.current_thread().name, task.expr.key, sum(db.count(e.key, task.device) for e in exprs)))
        return real(task, db, options)
    monkeypatch.setattr(tuning, "_strategy", strategy)
    out = tuning.tune_all(exprs, Database(tmp_path / "t.db"), TuneOptions(trials=8, batch_size=8))
    assert [o["trials"] for o in out] == [8, 8, 8]
    assert [(key, seen) for _, key, seen in built] == [(exprs[0].key, 0), (exprs[1].key, 8), (exprs[2].key, 16)]
    assert [name.startswith("tritune-strategy-ahead") for name, _, _ in built] == [False, True, True]


@pytest.mark.system  # a tuning run over stand-in GPU worker processes
def test_the_next_workload_searches_while_the_last_ones_head_to_head_runs(monkeypatch, tmp_path):
    """The head-to-head is queued in the GPU's second worker, then the workload gives its GPU back:
    the next one starts at once. Here the first head-to-head answers only once the second workload
    has started (else 20 s late, and the order below fails)."""
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.gated_head_to_head_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    exprs = [make_expr("matmul", shape, "fp16") for shape in ("128", "64")]
    events = []

    class Told(tuning.Report):
        def finished(self, expr, best, h2h, gpu):
            events.append(("finished", expr.key))

    def announce(i, expr, trials):
        events.append(("started", expr.key))
        if i == 1:
            go.touch()
    out = tuning.tune_all(exprs, Database(tmp_path / "t.db"), TuneOptions(trials=8, batch_size=8), announce=announce,
                          report=Told())
    assert [o["trials"] for o in out] == [8, 8] and all(o["best_config"] for o in out)
    assert events.index(("started", exprs[1].key)) < events.index(("finished", exprs[0].key))


def test_a_prior_learned_in_a_thread_beside_the_space_proposes_the_same(tmp_path):
    rng = np.random.default_rng(0)
    configs = SPACE.sample(rng, 64)
    prior = Prior(knob_rows(configs), rng.random(64).astype(np.float32), np.zeros(64, dtype=np.int64))

    def strategy():
        return make_strategy("sa", SPACE, seed=5, features=knob_rows, prior=prior, model=FakeModel(),
                             prior_model=FakeModel())

    warmed, cold = strategy(), strategy()
    warmed.warm()
    assert warmed.prior_model.fits == [(64, 1)] and cold.prior_model.fits == [] and warmed.fit_s == 0.0
    assert warmed.propose(8) == cold.propose(8)
    assert warmed.prior_model.fits == cold.prior_model.fits == [(64, 1)]  # learned once either way


def test_an_idle_second_worker_is_stopped_not_killed():
    """Killed, a worker leaves a semaphore it made (tqdm's, in torch.compile) to the resource
    tracker, which warns after the run's last line: once the head-to-head is done, it is stopped."""
    with LocalRunner(handlers=fake_worker.ahead_handlers, judge=True) as runner:
        runner.start()
        runner.prepare_head_to_head(EXPR)
        runner.head_to_head(EXPR, MM)
        judge = runner._judge._proc
    assert judge.exitcode == 0  # `leave`: stopped; a kill is -9


def test_a_second_worker_still_answering_is_killed():
    runner = LocalRunner(handlers=fake_worker.ahead_handlers, judge=True)
    runner.start()
    runner.prepare_head_to_head(EXPR)
    runner.head_to_head(EXPR, MM)
    judge = runner._judge._proc
    with runner._judge._lock:
        asking = threading.Thread(target=runner.close)  # while this thread awaits the judge's answer
        asking.start()
        asking.join()
    assert judge.exitcode == -9
