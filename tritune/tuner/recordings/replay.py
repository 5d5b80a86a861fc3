"""A builder and runner that replay a recording (real GPU timings) instead of using a GPU: search
strategies are tested and compared in CI through these, with the real tuning loop."""
from __future__ import annotations

from typing import Any, Sequence

from tritune.records.result import MeasureResult
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import BuildResult, PoolShares
from tritune.tuner.recordings.format import Recording
from tritune.tuner.timing import clearly_slower
from tritune.tuner.worker.protocol import OneRunner


class _Done:
    def __init__(self, value: BuildResult) -> None:
        self.value = value

    def result(self) -> BuildResult:
        return self.value


class RecordedBuilder:
    """Builds nothing: every config is handed to the recorded runner."""

    workers = 1

    def __init__(self) -> None:
        self.watch = Stopwatch()
        self.shares = PoolShares(lambda: self.workers)  # the tuning loops "compiling" here

    def submit(self, expr: Any, problem: object, configs: Sequence[Config]) -> list[_Done]:
        return [_Done(BuildResult(c, None, 0.0)) for c in configs]

    def result(self, future: _Done, config: Config) -> BuildResult:
        return future.result()


class RecordedRunner(OneRunner):
    """Serves a recording's timings; counts what it was asked to measure."""

    name = "recorded:0"

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.measured: list[Config] = []
        self.stopped = 0  # candidates the GPU worker would have stopped timing early
        self.watch = Stopwatch()

    def device_info(self) -> dict:
        """The recorded GPU's facts."""
        return self.recording.device

    def head_to_head(self, expr: Any, config: Config) -> dict:
        """The recorded median of `config` against the recorded eager torch time."""
        torch_ms = self.recording.torch_ms
        return {"ours_ms": self.recording.result(config).t_median, "alternatives": {"torch": torch_ms},
                "best_alternative": "torch", "best_alternative_ms": torch_ms, "compile_error": ""}

    def measure(self, expr: Any, config: Config, compile_s: float = 0.0, best_ms: float | None = None) -> MeasureResult:
        self.measured.append(config)
        result = self.recording.result(config)
        # a recording keeps medians only: the median stands in for the fastest of the first runs
        self.stopped += result.ok and clearly_slower(result.t_median, best_ms)
        return result
