"""Every runner implementation keeps the runner contract (`tritune.tuner.worker.protocol.Runner`):
the tuning loop, the measurer, spreading and the run call these members and nothing else, so a
runner that lacks one, or takes other arguments, fails here rather than mid-run."""
import inspect

import pytest

from fakes import FakeRunner
from tritune.tuner.gpus.cluster_client import RemoteHost
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.recordings import BUNDLED, RecordedRunner, Recording
from tritune.tuner.worker.local import LocalRunner
from tritune.tuner.worker.runners import Runners
from tritune.tuner.worker.protocol import Runner

CALLED = ("device_info", "measure", "head_to_head", "listen", "unlisten", "close")


def _instances():
    rec = Recording.load(next(BUNDLED.glob("*.jsonl.gz")))
    local = LocalRunner(device=0)  # nothing starts until asked
    remote = RemoteHost(cluster=None, address="tcp://127.0.0.1:1", info={"name": "host", "parallel": 3,
                                                                      "devices": ["host:0", "host:1"]})
    return {"local": local, "several": Runners([LocalRunner(device=0), LocalRunner(device=1)]), "remote": remote,
            "recorded": RecordedRunner(rec), "fake": FakeRunner()}


@pytest.mark.parametrize("kind", ["local", "several", "remote", "recorded", "fake"])
def test_every_runner_keeps_the_contract(kind):
    runner = _instances()[kind]
    assert isinstance(runner, Runner)
    assert runner in runner.each or kind == "several"
    assert all(isinstance(r, Runner) for r in runner.each)
    assert runner.parallel >= 1 and runner.gpus >= 1 and runner.restarts == 0 and runner.lost is False
    assert isinstance(runner.watch, Stopwatch)
    for name in CALLED:  # the same parameters as the contract's, so every caller's call fits
        ours = inspect.signature(getattr(Runner, name)).parameters
        theirs = inspect.signature(getattr(type(runner), name)).parameters
        assert list(theirs)[:len(ours)] == list(ours), f"{type(runner).__name__}.{name}{tuple(theirs)}"


def test_a_runner_without_a_contract_member_is_refused():
    class Half:  # measures, but cannot say which GPU it is or be closed
        def measure(self, expr, config, compile_s=0.0, best_ms=None):
            return None

    assert not isinstance(Half(), Runner)


def test_a_group_is_its_runners_and_measures_as_many_at_once():
    group = Runners([LocalRunner(device=0), LocalRunner(device=1)])
    assert [r.device for r in group.each] == [0, 1] and group.parallel == 2
    lent = []
    group.listen(lent.append)
    extra = LocalRunner(device=2)
    group.lend(extra)
    group.unlisten(lent.append)
    group.lend(LocalRunner(device=3))
    assert lent == [extra] and group.parallel == 4
