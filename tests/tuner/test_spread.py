"""A model's workloads spread over devices: each device tunes one workload at a time, largest first;
free devices join the last; a workload whose devices are lost goes back to the queue."""
import threading
from functools import partial

import pytest

from fakes import FakeBuilder
from waiting import eventually
from tritune.records.database import Database
from tritune.records.result import Status
from tritune.tuner import run as tuning
from tritune.tuner.gpus import start
from tritune.tuner.cli import make_expr
from tritune.tuner.worker.local import DeviceLost, LocalRunner
from tritune.tuner.gpus.spread import spread


class Device:
    def __init__(self, name):
        self.name, self.lost, self.watch = name, False, None


def scripted(script):
    """A `run` for `spread` that records each workload's runners when it starts and ends, and ends
    each when the test says (`script[i]`: an event, or a device to lose)."""
    seen = {}

    def run(i, group, release):
        seen.setdefault(i, []).append([r.name for r in group.each])
        step = script[i].pop(0) if isinstance(script[i], list) else script[i]
        if isinstance(step, Device):
            step.lost = True
            raise DeviceLost(Status.CRASH, f"{step.name} fell off the bus")
        step.wait(10)
        seen[i].append([r.name for r in group.each])
        return f"done {i}"
    return run, seen


def test_each_device_takes_the_next_workload_and_free_ones_join_the_last():
    devices = [Device("a"), Device("b")]
    gates = [threading.Event() for _ in range(3)]
    run, seen = scripted(gates)
    out = []
    thread = threading.Thread(target=lambda: out.append(spread(run, [30, 20, 10], devices)))
    thread.start()
    eventually(lambda: len(seen) == 2)
    assert seen == {0: [["a"]], 1: [["b"]]}  # the two largest at once, one device each
    gates[1].set()
    eventually(lambda: 2 in seen)
    assert seen[2] == [["b"]]  # the device that came free takes the next waiting workload
    gates[2].set()
    eventually(lambda: len(devices) and seen[2][-1] == ["b"] and len(seen[2]) == 2)
    gates[0].set()
    thread.join(10)
    assert out == [["done 0", "done 1", "done 2"]]
    assert seen[0][-1] == ["a", "b"]  # with none waiting, the free device joined the last one running


def test_a_workload_that_gives_its_runner_back_lets_the_next_start_before_it_ends():
    devices = [Device("a")]
    searched, judged = threading.Event(), threading.Event()
    began = []

    def run(i, group, release):
        began.append(i)
        if i == 0:
            searched.wait(10)
            release()  # its search is over: what is left (the head-to-head) needs no runner
            release()  # said twice: counted once
            judged.wait(10)
        return f"done {i}"
    out = []
    thread = threading.Thread(target=lambda: out.append(spread(run, [2, 1, 1], devices)))
    thread.start()
    eventually(lambda: began == [0])
    searched.set()
    eventually(lambda: began == [0, 1, 2])  # the next ones ran on the runner while 0 was still judging
    assert not out
    judged.set()
    thread.join(10)
    assert out == [["done 0", "done 1", "done 2"]]


def test_no_runner_is_lent_to_a_workload_that_gave_its_own_back():
    devices = [Device("a"), Device("b")]
    released, judged = threading.Event(), threading.Event()
    groups = {}

    def run(i, group, release):
        groups[i] = group
        if i == 0:
            release()
            released.set()
            judged.wait(10)
        else:
            released.wait(10)
        return f"done {i}"
    out = []
    thread = threading.Thread(target=lambda: out.append(spread(run, [2, 1], devices)))
    thread.start()
    eventually(lambda: len(out) == 0 and 1 in groups and released.is_set())
    threading.Event().wait(0.5)  # the scheduler's turn to hand the freed runners out
    judged.set()
    thread.join(10)
    assert out == [["done 0", "done 1"]] and [r.name for r in groups[0].each] == ["a"]


def test_a_workload_whose_device_is_lost_goes_back_and_none_left_is_device_lost():
    devices = [Device("a"), Device("b")]
    go = threading.Event()
    go.set()
    run, seen = scripted([[devices[0], go], go])  # workload 0 loses device a, then runs on b
    assert spread(run, [2, 1], devices) == ["done 0", "done 1"]
    assert seen[0] == [["a"], ["b"], ["b"]]
    alone = [Device("c")]
    run, _ = scripted([[alone[0]]])
    with pytest.raises(DeviceLost, match="c fell off the bus"):
        spread(run, [1], alone)


def test_a_models_workloads_over_two_stand_in_gpus(monkeypatch, tmp_path):
    """Three workloads, two (stand-in) GPU processes: every workload gets its trials, each once,
    and the records say which device measured each trial (which one when is the scheduler's
    business, tested above: here it depends on timing)."""
    import fake_gpu

    monkeypatch.setenv("FAKE_GPU_DEVICES", "2")
    monkeypatch.setenv("FAKE_GPU_MS", "5")
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_gpu.handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    # convolutions: their spaces are enumerated in a fraction of a second (a matmul's takes seconds)
    exprs = [make_expr("conv2d", s, "fp16", padding="1") for s in ("8,28,28,64,64,3,3", "8,14,14,64,64,3,3",
                                                                   "4,14,14,32,64,3,3")]
    options = start.TuneOptions(trials=12, batch_size=4, strategy="random", devices="all")
    with Database(tmp_path / "t.db") as db:
        out = tuning.tune_all(exprs, db, options, trials=[16, 8, 8])
        stored = [db.trials(e.key) for e in exprs]
    assert [s["trials"] for s in out] == [16, 8, 8] and all(s["best_config"] for s in out)
    assert [len({r.config for r in trials}) for trials in stored] == [16, 8, 8]
    names = {r.measured_on for trials in stored for r in trials if r.status is not Status.COMPILE_ERROR}
    assert len(names) == 2 and all(n.endswith((":0", ":1")) for n in names)  # a compile error met no GPU


def _recording_runner(events):
    """LocalRunner over the stand-in GPU that logs ("start", device) and ("info", device)."""
    import fake_gpu

    class Recording(LocalRunner):
        def start(self):
            if self._judge is not None or self.device is None:  # a device's own worker, not its judge
                events.append(("start", self.device))
            super().start()

        def device_info(self):
            events.append(("info", self.device))
            return super().device_info()

    return partial(Recording, handlers=fake_gpu.handlers)


@pytest.mark.parametrize("guess", [3, 1])
def test_every_devices_worker_starts_beside_the_first_where_the_gpus_can_be_counted(monkeypatch, guess):
    # "all" on a host of 2 GPUs: counted 3 without CUDA, the workers of devices 1 and 2 start with
    # device 0's, and 2's is stopped once device 0's worker says there are 2; counted 1 (no driver
    # to ask), device 1's starts only after device 0's has come up
    events = []
    monkeypatch.setenv("FAKE_GPU_DEVICES", "2")
    monkeypatch.setattr(start, "LocalRunner", _recording_runner(events))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    monkeypatch.setattr(start, "visible_gpus", lambda: guess)
    runner, builder = start.start_gpu(devices="all")
    try:
        assert [r.device for r in runner.each] == [0, 1] and runner.device_info()["device_count"] == 2
        first_info = events.index(("info", 0))
        if guess == 3:
            assert {("start", 1), ("start", 2)} <= set(events[:first_info]) and ("info", 2) not in events
        else:
            assert events.index(("start", 1)) > first_info
    finally:
        builder.close()
        runner.close()


def test_visible_gpus_are_counted_without_cuda(monkeypatch):
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "3,5,6")  # a container given three of the host's GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 1,")  # of which this process uses two
    assert start.visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert start.visible_gpus() == 0 and start._expected_others("all") == ()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert start.visible_gpus() == 3
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")
    assert start.visible_gpus() == 0
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")  # every GPU of the host: the driver's list tells
    monkeypatch.setattr(start.os, "listdir", lambda path: ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"])
    assert start.visible_gpus() == 3 and start._expected_others("all") == (1, 2)
    monkeypatch.setattr(start.os, "listdir", lambda path: (_ for _ in ()).throw(FileNotFoundError(path)))
    assert start.visible_gpus() == 1 and start._expected_others((2, 0, 3)) == (0, 3)
