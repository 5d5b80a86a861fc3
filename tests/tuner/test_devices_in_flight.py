"""Every device and the whole pool busy: one workload measured on several devices keeps two compiled
candidates waiting for each device's lane and counts the compile pool once; workloads tuned at once
(tune-model over several devices) each count their part of the pool, so that together they fill
it. Builds are futures the tests complete themselves, and the loop is caught where it waits (no
sleeps, no clocks)."""
import threading

import numpy as np
import pytest

from fakes import FakeRunner
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import Builder, BuildResult, PoolShares
from tritune.tuner.measurer import Measurer
from tritune.tuner.tuner import LAG_SHARE, QUEUED_PER_LANE, in_flight_target
from tritune.tuner.worker.runners import Runners
from test_in_flight import ROUND, HeldBuilder, loop_waits, start, stored_results
from test_tuner import EXPR, TASK

import tritune.tuner.tuner as tuner_module


def built_before_waiting(target):
    """Candidates a loop has started when it first waits: the library, then rounds until more
    than `target` are in flight."""
    return 1 + ROUND * ((target - 1) // ROUND + 1)


def test_loops_on_one_pool_split_it_evenly_at_least_one_each_and_take_it_back_as_they_end():
    shares = PoolShares(lambda: 16)
    assert shares.loops == 0
    with shares.taken() as first:
        assert first() == 16  # alone (`run`, with any number of devices): the whole pool
        with shares.taken() as second, shares.taken() as third:
            assert [first(), second(), third()] == [6, 5, 5] and shares.loops == 3  # adds up to the pool
            with shares.taken() as fourth:
                assert first() + second() + third() + fourth() == 16
        assert first() == 16 and shares.loops == 1  # the others ended: their parts come back
    crowded = PoolShares(lambda: 2)
    with crowded.taken() as a, crowded.taken() as b, crowded.taken() as c:
        assert [a(), b(), c()] == [1, 1, 1]  # more loops than processes: one each still


def test_a_builder_shares_its_pool_by_its_size():
    builder = Builder(workers=12)
    try:
        with builder.shares.taken() as a, builder.shares.taken() as b:
            assert a() + b() == 12 == 2 * a()
    finally:
        builder.close(now=True)


def test_every_device_measuring_a_workload_is_a_lane_and_a_lent_one_joins():
    builder, first = HeldBuilder(workers=16), FakeRunner()
    group = Runners([first, FakeRunner()])
    measurer = Measurer(EXPR, TASK.device, builder, group, None)
    try:
        assert measurer.lanes == 2
        group.lend(FakeRunner())  # a device that came free in tune-model
        assert measurer.lanes == 3
        assert in_flight_target(16, measurer.lanes, ROUND, 100, 1000) == 16 + 3 * QUEUED_PER_LANE
    finally:
        measurer.close()


@pytest.mark.system
def test_one_workload_on_two_devices_keeps_two_waiting_for_each_and_counts_the_pool_once(tmp_path, monkeypatch):
    targets = []
    real = tuner_module.in_flight_target

    def recorded(workers, lanes, *rest):
        targets.append((workers, lanes))
        return real(workers, lanes, *rest)
    monkeypatch.setattr(tuner_module, "in_flight_target", recorded)
    waiting = loop_waits(monkeypatch)
    builder = HeldBuilder(workers=14)
    runners = Runners([FakeRunner(), FakeRunner()])
    tuner, thread, out = start(tmp_path, builder, 40 + 200, learned=stored_results(40), runner=runners)
    assert waiting.wait(60)
    target = in_flight_target(14, 2, ROUND, 40, 240)
    assert target == 14 + 2 * QUEUED_PER_LANE == 18  # one device: 16, two rounds; two devices: three
    assert len(builder.built) == built_before_waiting(target) == 25
    builder.finish()
    thread.join(60)
    assert len(out) == 240 and set(targets) == {(14, 2)}  # the whole pool, both lanes, throughout
    assert len(runners.each[0].measured) + len(runners.each[1].measured) == 200


def test_a_workload_tuned_beside_another_counts_its_part_of_the_pool_then_all_of_it(tmp_path, monkeypatch):
    waiting = loop_waits(monkeypatch)
    builder = HeldBuilder(workers=32)
    builder.shares = PoolShares(lambda: builder.workers)
    other = builder.shares.taken()  # another workload's loop on the other device
    other.__enter__()
    tuner, thread, out = start(tmp_path, builder, 40 + 320, learned=stored_results(40))
    assert waiting.wait(60)
    target = in_flight_target(16, 1, ROUND, 40, 360)  # half the pool, two waiting for the one GPU
    assert target == 18 and len(builder.built) == built_before_waiting(target) == 25  # alone: 41
    other.__exit__(None, None, None)  # the other workload is done: its part comes back
    builder.finish()
    thread.join(60)
    assert len(out) == 360 and tuner.pool_parts == [16, 32]
    assert builder.shares.loops == 0 and tuner.pool_part() == 32


def test_verbose_says_the_part_of_the_pool_a_workload_tuned_beside_another_counted(tmp_path):
    from fakes import FakeBuilder
    from tritune.records.database import Database
    from tritune.search import make_strategy
    from tritune.tuner import run as tuning
    from tritune.tuner.gpus.start import TuneOptions

    class Notes(tuning.Report):
        def __init__(self):
            self.lines = []

        def note(self, text, problem=False):
            self.lines.append(text)

    builder = FakeBuilder()
    builder.workers = 16
    builder.shares = PoolShares(lambda: builder.workers)
    for verbose, said in [(True, [f"{EXPR.describe()}: its part of the 16-process compile pool: 8"]), (False, [])]:
        notes = Notes()
        with builder.shares.taken(), Database(tmp_path / f"{verbose}.db") as db:
            tuning._search(TASK, make_strategy("random", TASK.space, seed=0), builder, FakeRunner(), db,
                           TuneOptions(trials=24, batch_size=ROUND, verbose=verbose), notes)
        assert notes.lines == said


class Paired(FakeRunner):
    """A device of a pair sharing one stopwatch (as a host's devices do), each candidate taking a
    second of checking on it; its first measurement waits until the other device is measuring
    too (both lanes work at once, or the barrier breaks and the test fails)."""

    def __init__(self, name, watch, barrier):
        super().__init__()
        self.name, self.watch, self.barrier = name, watch, barrier

    def measure(self, expr, config, compile_s=0.0, best_ms=None):
        if not self.measured:
            self.barrier.wait(60)
        self.watch.add("check", 1.0)
        self.watch.add(f"check on {self.name}", 1.0)
        return super().measure(expr, config, compile_s, best_ms)


def pair():
    shared, barrier = Stopwatch(), threading.Barrier(2)
    return [Paired(f"h:{i}", shared, barrier) for i in range(2)]


def test_two_devices_keep_twice_the_share_of_the_budget_in_flight_and_both_measure(tmp_path, monkeypatch):
    """At `run`'s 128 trials one device keeps at most an eighth of the budget in flight (16: half
    of a 32-process pool idle); each device measuring the workload may keep that much, so two keep
    the whole pool busy, and both measure."""
    built, deepest, runners = {}, {}, {1: FakeRunner(), 2: Runners(pair())}
    for gpus, runner in runners.items():
        waiting = loop_waits(monkeypatch)
        builder = HeldBuilder(workers=32)
        tuner, thread, out = start(tmp_path / str(gpus), builder, 40 + 128, learned=stored_results(40), runner=runner)
        assert waiting.wait(60)
        built[gpus] = len(builder.built)
        builder.finish()
        thread.join(60)
        assert len(out) == 168
        deepest[gpus] = tuner.most_in_flight
    assert in_flight_target(32, 1, ROUND, 40, 168) == 168 // LAG_SHARE == 21
    assert in_flight_target(32, 2, ROUND, 40, 168, gpus=2) == 32 + 2 * QUEUED_PER_LANE == 36  # under 2 * 21
    assert built == {1: built_before_waiting(21), 2: built_before_waiting(36)} == {1: 25, 2: 41}
    assert deepest[2] > deepest[1]
    measured = [len(r.measured) for r in runners[2].each]
    assert sum(measured) == 128 and min(measured) > 0


def test_a_workload_counts_only_its_own_candidates_gpu_seconds_on_devices_it_shares_a_stopwatch_with():
    first, second = pair()
    measurers = [Measurer(EXPR, TASK.device, HeldBuilder(workers=4), r, None) for r in (first, second)]
    configs = TASK.space.sample(np.random.default_rng(0), 5)
    try:
        futures = [[m.submit(c, BuildResult(c, None, 0.5)) for c in configs[:n]] for m, n in zip(measurers, (2, 3))]
        for f in futures[0] + futures[1]:
            f.result(60)
    finally:
        for m in measurers:
            m.close()
    assert first.watch is second.watch and first.watch.spent["check"] == 5.0
    assert [dict(m.watch.spent) for m in measurers][0]["check on h:0"] == 2.0 and "check on h:1" not in measurers[0].watch.spent
    assert measurers[1].watch.spent["check"] == 3.0 == measurers[1].watch.spent["check on h:1"]
    assert [m.gpus for m in measurers] == [1, 1] and Runners(pair()).gpus == 2
