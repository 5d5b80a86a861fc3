"""Several runners as one: the devices of a host (`local.LocalRunner`, one or more per GPU) or the
hosts of a cluster, measured on together."""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable

from tritune.records.result import MeasureResult
from tritune.schedules.config import Config
from tritune.tuner.worker.protocol import distinct_gpus


class Runners:
    """Several runners (devices, or hosts of a cluster) as one: the measurer measures on all of them
    at once; everything else (device facts, the head-to-head) asks the first. Their check and timing
    seconds add up in one stopwatch (device-seconds). A runner lent mid-run (`lend`) joins the
    measurers listening."""

    def __init__(self, runners: list[Any]) -> None:
        self.each = list(runners)
        self.watch = runners[0].watch
        self._listeners: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()

    def lend(self, runner: Any) -> None:
        """Add a runner to the group, and to the measurers measuring on it now."""
        with self._lock:
            self.each.append(runner)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(runner)

    def listen(self, listener: Callable[[Any], None]) -> None:
        """Be told of runners lent from now on."""
        with self._lock:
            self._listeners.append(listener)

    def unlisten(self, listener: Callable[[Any], None]) -> None:
        """No longer be told of runners lent."""
        with self._lock:
            self._listeners.remove(listener)

    @property
    def restarts(self) -> int:
        """Worker replacements on every device."""
        return sum(r.restarts for r in self.each)

    @property
    def parallel(self) -> int:
        """Candidates the group measures at once."""
        return sum(r.parallel for r in self.each)

    @property
    def gpus(self) -> int:
        """GPUs the group measures on, each once (lost ones too: the measurer counts the live ones itself)."""
        return distinct_gpus(self.each, lost=True)

    @property
    def lost(self) -> bool:
        """Every device of the group is gone."""
        return all(r.lost for r in self.each)

    @property
    def name(self) -> str:
        """The GPU that answers for the group (its first that is not lost)."""
        return self._first().name

    def device_info(self) -> dict:
        """The GPU facts of the group (one GPU model: `gpus.start` refuses a mix)."""
        return self._first().device_info()

    def measure(self, expr: Any, config: Config, compile_s: float = 0.0, best_ms: float | None = None) -> MeasureResult:
        """One candidate on the first device (the measurer spreads candidates over `each` itself)."""
        return self._first().measure(expr, config, compile_s, best_ms)

    def head_to_head(self, expr: Any, config: Config) -> dict:
        """The end-of-run comparison, on the first device."""
        return self._first().head_to_head(expr, config)

    def queue_head_to_head(self, expr: Any, config: Config) -> Future:
        """The end-of-run comparison queued on the first device; its future."""
        return self._first().queue_head_to_head(expr, config)

    def prepare_head_to_head(self, expr: Any) -> None:
        """Compile the head-to-head's alternatives ahead, on the device that will run it."""
        self._first().prepare_head_to_head(expr)

    def _first(self) -> Any:
        """The first runner that is not lost (else the first: it says why)."""
        return next((r for r in self.each if not r.lost), self.each[0])

    def close(self, now: bool = False) -> None:
        """Stop every device's worker."""
        for runner in self.each:
            runner.close(now)
