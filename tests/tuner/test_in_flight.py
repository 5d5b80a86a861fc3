"""How deep the tuning loop's pipeline runs: with room in the compile pool, more than two rounds are in
flight; compiles that finish first are measured first. Builds are futures the tests complete
themselves, and the loop is caught where it waits (no sleeps, no clocks)."""
import threading
from concurrent.futures import Future

import pytest

from fakes import FakeBuilder, FakeRunner
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.search import make_strategy
from tritune.tuner import tuner as tuner_module
from tritune.tuner.builder import BuildResult
from tritune.tuner.measurer import Measurer
from tritune.tuner.tuner import LAG_SHARE, QUEUED_PER_LANE, Tuner, in_flight_target
from test_tuner import EXPR, TASK

ROUND = 8


class HeldBuilder(FakeBuilder):
    """A pool of `workers` processes whose compiles finish only when the test says so."""

    def __init__(self, workers):
        super().__init__()
        self.workers = workers
        self.futures = []
        self.holding = True
        self.lock = threading.RLock()

    def submit(self, expr, problem, configs):
        with self.lock:
            self.built.extend(configs)
            futures = [Future() for _ in configs]
            self.futures.extend(zip(configs, futures))
            if not self.holding:
                self.finish(*configs)
        return futures

    def finish(self, *configs):
        """Finish the compiles of these configs; with none named, of all, and of all from now on."""
        with self.lock:
            self.holding = self.holding and bool(configs)
            for config, future in self.futures:
                if not future.done() and (not configs or config in configs):
                    future.set_result(BuildResult(config, None, 0.5))


def loop_waits(monkeypatch):
    """An event set each time the tuning loop blocks waiting for a result (nothing it holds is done)."""
    waiting, real = threading.Event(), tuner_module.wait

    def wait(*args, **kwargs):
        waiting.set()
        return real(*args, **kwargs)
    monkeypatch.setattr(tuner_module, "wait", wait)
    return waiting


def start(tmp_path, builder, trials, strategy="random", learned=(), runner=None):
    """A tuner running in a thread (its own database connection: SQLite's are per thread), and the
    list its history lands in. `learned`: results stored beforehand; `runner`: a FakeRunner's stead."""
    path = tmp_path / "t.db"
    if learned:
        with Database(path) as db:
            db.add_workload(EXPR.key, EXPR.op, EXPR.dtype, EXPR.to_json())
            db.save(EXPR.key, TASK.device, list(learned))
    tuner = Tuner(TASK, make_strategy(strategy, TASK.space, seed=0), builder, runner or FakeRunner(), None,
                  batch_size=ROUND)
    out: list = []

    def run():
        with Database(path) as db:
            tuner.db = db
            out.extend(tuner.run(trials))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return tuner, thread, out


def stored_results(n):
    """n measured schedules of the task, as another run stored them."""
    configs = TASK.space.sample(__import__("numpy").random.default_rng(1), n)
    return [MeasureResult(c, Status.OK, 2.0, 2.0, 2.0, 2.0, 0.5) for c in configs]


def test_the_target_fills_the_pool_and_queues_for_every_lane_as_far_as_the_model_keeps_up():
    assert in_flight_target(1, 1, ROUND, 100, 1000) == ROUND  # a small pool: a round, as before
    assert in_flight_target(16, 1, ROUND, 100, 1000) == 16 + QUEUED_PER_LANE
    assert in_flight_target(32, 2, ROUND, 100, 1000) == 32 + 2 * QUEUED_PER_LANE
    assert in_flight_target(32, 1, ROUND, 20, 1000) == 20  # no more in flight than results learned
    assert in_flight_target(16, 1, ROUND, 100, 128) == 128 // LAG_SHARE == 16  # nor than a share of the budget
    assert in_flight_target(16, 1, ROUND, 0, 64) == in_flight_target(16, 1, ROUND, 100, 64) == ROUND


def test_more_than_two_rounds_are_in_flight_when_the_pool_has_room(tmp_path, monkeypatch):
    waiting = loop_waits(monkeypatch)
    builder = HeldBuilder(workers=32)
    learned = stored_results(40)  # a model that has learned enough to go deep at once
    tuner, thread, out = start(tmp_path, builder, 40 + 320, learned=learned)
    assert waiting.wait(60)  # the loop has proposed all it will until something comes back
    target = in_flight_target(32, 1, ROUND, 40, 360)  # 34: the pool's 32 and two waiting for the GPU
    # the library first, then rounds of 8 until more than the target are in flight
    assert len(builder.built) == 1 + ROUND * (target // ROUND + 1) == 41
    assert (len(builder.built) - 1) // ROUND > 2  # five rounds, not two
    builder.finish()
    thread.join(60)
    assert len(out) == 360 and tuner.most_in_flight == target + ROUND  # 34 in flight, then a round more
    assert len({r.config for r in out}) == 360


def test_a_fresh_model_goes_deep_only_as_fast_as_it_learns(tmp_path, monkeypatch):
    waiting = loop_waits(monkeypatch)
    builder = HeldBuilder(workers=32)
    tuner, thread, out = start(tmp_path, builder, 256)
    assert waiting.wait(60)
    assert len(builder.built) == 1 + ROUND  # nothing learned yet: the library and one round
    builder.finish()
    thread.join(60)
    assert len(out) == 256 and ROUND * 2 < tuner.most_in_flight <= 256 // LAG_SHARE + ROUND


@pytest.mark.parametrize("workers, trials", [(1, 400), (32, 64)])
def test_a_small_pool_or_budget_keeps_two_rounds_in_flight_as_before(tmp_path, workers, trials):
    builder = FakeBuilder()  # one process: a round is enough to keep it busy; 64 trials: a lag of 8 at most
    builder.workers = workers
    tuner = Tuner(TASK, make_strategy("random", TASK.space, seed=0), builder, FakeRunner(),
                  Database(tmp_path / "t.db"), batch_size=ROUND)
    assert len(tuner.run(trials)) == trials and tuner.most_in_flight == 2 * ROUND


def test_the_measurer_takes_the_first_compiled_not_the_first_proposed():
    builder, runner = HeldBuilder(workers=4), FakeRunner()
    configs = TASK.space.sample(__import__("numpy").random.default_rng(0), 3)
    measurer = Measurer(EXPR, TASK.device, builder, runner, None)
    try:
        futures = [measurer.submit(c, b) for c, b in zip(configs, builder.submit(EXPR, None, configs))]
        builder.finish(configs[2])
        assert futures[2].result(60).config == configs[2] and runner.measured == [configs[2]]
        assert measurer.lanes == 1 and not futures[0].done()
        builder.finish()
        assert [f.result(60).config for f in futures] == configs
        assert runner.measured[1:] == configs[:2]  # the rest in proposal order
    finally:
        measurer.close()


@pytest.mark.parametrize("workers", [1, 32])
def test_a_deep_pipeline_measures_every_candidate_once(tmp_path, workers):
    builder = FakeBuilder()
    builder.workers = workers  # compiles that fail still count as trials
    db = Database(tmp_path / "t.db")
    tuner = Tuner(TASK, make_strategy("random", TASK.space, seed=0), builder, FakeRunner(), db, batch_size=ROUND)
    history = tuner.run(120)
    assert len(history) == 120 == len({r.config for r in history}) == len(db.trials(EXPR.key, TASK.device))
