"""The runner contract: what the tuning loop, the measurer, spreading across GPUs and the run ask of
anything that measures candidates. Implemented by the local GPU worker (`local.LocalRunner`),
several of them as one (`runners.Runners`), a cluster's GPU host (`gpus.cluster_client.RemoteHost`),
the recorded runner that replays stored timings (`tuner.recordings.RecordedRunner`) and the tests'
stand-ins; `tests/tuner/test_runner_protocol.py` holds each of them to it."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Protocol, runtime_checkable

from tritune.records.result import MeasureResult
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch


@runtime_checkable
class Runner(Protocol):
    """Measures built candidates on one GPU, or on several as one."""

    watch: Stopwatch  # the check and timing seconds it spent (device-seconds, for the breakdown)
    parallel: int  # candidates it measures at once (a cluster host compiles and measures several)
    gpus: int  # GPUs it measures on (a group: all of its runners'; a cluster host: all of the host's)
    lost: bool  # its device is gone for this run (a group: its first device)

    @property
    def name(self) -> str:
        """Which GPU measured, as trials record it: "host:index" (a group: its first)."""

    @property
    def each(self) -> list[Any]:
        """The single runners it measures on (itself, for one); spreading workloads hands them out."""

    @property
    def restarts(self) -> int:
        """How many times a GPU worker was replaced after a crash or a hang."""

    def device_info(self) -> dict:
        """The GPU's facts (name, capability, versions, limits)."""

    def measure(self, expr: Any, config: Config, compile_s: float = 0.0, best_ms: float | None = None) -> MeasureResult:
        """Check and time one candidate; failures come back as results, never raised (DeviceLost
        where the device itself is gone)."""

    def head_to_head(self, expr: Any, config: Config) -> dict:
        """The tuned best against every alternative of the expression, timed in turns."""

    def queue_head_to_head(self, expr: Any, config: Config) -> Future:
        """`head_to_head` as a future, queued before the call returns where the runner has a queue
        for it (the workload's runners may then measure the next workload's candidates meanwhile)."""

    def prepare_head_to_head(self, expr: Any) -> None:
        """Start compiling the head-to-head's alternatives while the search runs (where it can)."""

    def listen(self, listener: Callable[[Any], None]) -> None:
        """Be told of runners that join it mid-run (only a group gains any)."""

    def unlisten(self, listener: Callable[[Any], None]) -> None:
        """No longer be told of runners joining."""

    def close(self, now: bool = False) -> None:
        """Stop: after the work in hand, or at once (`now`: the run was interrupted)."""


def distinct_gpus(runners: Any, lost: bool = False) -> int:
    """GPUs that the runners not lost (or all of them, `lost`) measure on, each counted once:
    runners that answer to one name share its devices (several workloads' workers on one GPU,
    `tune-model --per-gpu`)."""
    return sum({r.name: r.gpus for r in runners if lost or not r.lost}.values())


def settled(fn: Callable[..., Any], *args: Any) -> Future:
    """`fn(*args)` run now, as a done future of its result (or of what it raised)."""
    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - the caller's .result() raises it
        done.set_exception(exc)
    return done


class OneRunner:
    """The parts of the contract a runner of one device shares: it is its own `each`, measures one
    candidate at a time, gains no runners mid-run, and has a stopwatch."""

    parallel = 1
    gpus = 1
    lost = False
    restarts = 0
    watch: Stopwatch

    @property
    def each(self) -> list[Any]:
        """Itself."""
        return [self]

    def listen(self, listener: Callable[[Any], None]) -> None:
        """A single runner gains no runners: nothing to tell."""

    def unlisten(self, listener: Callable[[Any], None]) -> None:
        """Nothing was listening."""

    def queue_head_to_head(self, expr: Any, config: Config) -> Future:
        """Nothing to queue it in: `head_to_head` runs now (`settled`)."""
        return settled(self.head_to_head, expr, config)  # type: ignore[attr-defined]

    def prepare_head_to_head(self, expr: Any) -> None:
        """Nothing compiled ahead: the head-to-head compiles its alternatives when it runs."""

    def close(self, now: bool = False) -> None:
        """Nothing to stop."""
