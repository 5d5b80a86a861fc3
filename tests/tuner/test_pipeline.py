"""The pipelined tuning loop: the next rounds compile while one is measured, every result is
stored by the measuring thread as it comes, and nothing is stored once the run is stopping."""
import threading
import time

import numpy as np
import pytest

from fakes import FakeBuilder, FakeRunner
from tritune.kernels.contraction.expr import Matmul
from tritune.records.database import Database, DatabaseError
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.space import Limits
from tritune.search import make_strategy
from tritune.tuner.measurer import Measurer, Stopped
from tritune.tuner.task import Task
from tritune.tuner.tuner import Tuner

EXPR = Matmul(1024, 1024, 1024)
DEVICE = DeviceKey("Fake GPU", "9.0", "3.x", "2.x", "t1")
TASK = Task(EXPR, DEVICE, Limits.for_capability(9, 0))


class Clocked(FakeRunner):
    """Takes 20 ms per measurement and notes when each began and ended."""

    def __init__(self):
        super().__init__()
        self.spans = {}

    def measure(self, expr, config, compile_s=0.0, best_ms=None):
        start = time.perf_counter()
        time.sleep(0.02)
        result = super().measure(expr, config, compile_s, best_ms)
        self.spans[config] = (start, time.perf_counter())
        return result


class Noting(FakeBuilder):
    def __init__(self):
        super().__init__()
        self.submitted = []

    def submit(self, expr, problem, configs):
        self.submitted.append((time.perf_counter(), list(configs)))
        return super().submit(expr, problem, configs)


@pytest.mark.system
def test_the_next_round_is_built_while_one_is_measured(tmp_path):
    builder, runner = Noting(), Clocked()
    db = Database(tmp_path / "t.db")
    history = Tuner(TASK, make_strategy("random", TASK.space), builder, runner, db, batch_size=8).run(48)
    assert len(history) == 48 == len(db.trials(EXPR.key, DEVICE)) == len({r.config for r in history})
    library, *rounds = builder.submitted  # the library call goes out first, alone
    assert [c.library for c in library[1]] == ["mm"] and len(rounds) == 6
    for (submitted, _), (_, measured) in zip(rounds[2:], rounds[1:]):
        # round n+2 was proposed and sent to the compile pool before round n+1 was measured
        ends = [runner.spans[c][1] for c in measured if c in runner.spans]
        assert ends and submitted < max(ends)


def test_nothing_in_flight_measures_each_round_before_proposing_the_next(tmp_path):
    builder, runner = Noting(), Clocked()
    Tuner(TASK, make_strategy("random", TASK.space), builder, runner, Database(tmp_path / "t.db"),
          batch_size=8, in_flight=0).run(24)
    for (submitted, _), (_, measured) in zip(builder.submitted[1:], builder.submitted):
        assert submitted > max(runner.spans[c][1] for c in measured if c in runner.spans)


def test_the_runner_hears_the_best_so_far(tmp_path):
    seen = []

    class Listening(FakeRunner):
        def measure(self, expr, config, compile_s=0.0, best_ms=None):
            seen.append(best_ms)
            return super().measure(expr, config, compile_s, best_ms)

    history = Tuner(TASK, make_strategy("random", TASK.space), FakeBuilder(), Listening(),
                    Database(tmp_path / "t.db"), batch_size=8).run(32)
    assert seen[0] is None  # nothing to compare the first candidate with
    best = None
    for result, told in zip(history, seen):
        assert told == best
        if result.ok:
            best = result.t_median if best is None else min(best, result.t_median)


def test_a_result_that_arrives_after_close_is_not_stored(tmp_path):
    release = threading.Event()

    class Stuck(FakeRunner):
        def measure(self, expr, config, compile_s=0.0, best_ms=None):
            release.wait(10)  # the run is stopped meanwhile; then the worker is killed
            return MeasureResult(config, Status.CRASH, message="worker died (killed by the stopping run)")

    db = Database(tmp_path / "t.db")
    db.add_workload(EXPR.key, EXPR.op, EXPR.dtype, EXPR.to_json())
    builder = FakeBuilder()
    measurer = Measurer(EXPR, DEVICE, builder, Stuck(), db.path)
    config = TASK.space.sample(np.random.default_rng(0), 1)[0]
    done = measurer.submit(config, builder.submit(EXPR, None, [config])[0])
    time.sleep(0.1)
    measurer.close()
    release.set()
    with pytest.raises(Stopped):
        done.result(timeout=10)
    assert db.trials(EXPR.key, DEVICE) == []  # no false CRASH stored


def test_a_database_error_in_the_measurer_stops_the_run(tmp_path, monkeypatch):
    original = Database.save

    def save(self, *args, **kwargs):
        if threading.current_thread().name.startswith("tritune-measurer"):
            raise DatabaseError("disk full")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Database, "save", save)
    tuner = Tuner(TASK, make_strategy("random", TASK.space), FakeBuilder(), FakeRunner(),
                  Database(tmp_path / "t.db"), batch_size=8)
    with pytest.raises(DatabaseError, match="disk full"):
        tuner.run(16)
