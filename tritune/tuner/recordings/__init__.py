"""A builder and runner that replay a recorded space (real GPU timings) instead of using a GPU.

Recordings are written by scripts/sample_space.py: a meta line, then one line per config.
Search strategies are tested and compared in CI through these, with the real tuning loop.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from tritune.kernels.family import expr_from_dict, family
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config
from tritune.schedules.space import Limits
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import BuildResult
from tritune.tuner.timing import clearly_slower
from tritune.tuner.task import Task
from tritune.tuner.worker.protocol import OneRunner

# Recordings shipped with tritune (real GPU measurements of whole spaces or large samples); see
# recordings/README.md for how and where each was measured.
BUNDLED = Path(__file__).parent


def read_lines(path: str | Path) -> tuple[dict, list[dict]]:
    """A recording file as it is stored: its meta line and one dict per config (.jsonl or .jsonl.gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fp:
        return json.loads(fp.readline())["meta"], [json.loads(line) for line in fp]


def write_lines(path: str | Path, meta: dict, rows: list[dict]) -> None:
    """Store a recording (gzip-compressed when the name ends in .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as fp:
        fp.write(json.dumps({"meta": meta}) + "\n")
        fp.writelines(json.dumps(r) + "\n" for r in rows)


@dataclass(frozen=True)
class Recording:
    """One recorded space: workload, device facts, torch's time, and each config's outcome."""

    expr: Any
    limits: Limits
    device: dict
    torch_ms: float
    rows: dict[Config, dict]

    @classmethod
    def load(cls, path: str | Path) -> "Recording":
        """Read a recording (.jsonl or .jsonl.gz)."""
        meta, lines = read_lines(path)
        rows = {Config.of(r["config"]): r for r in lines}
        device = meta["device"]
        return cls(expr_from_dict(meta["workload"]), Limits(device["shared_bytes"], device["sms"]), device,
                   meta["torch_ms"], rows)

    def task(self, device: DeviceKey) -> Task:
        """The task of the recorded workload over the recorded configs: a space measured before
        later knobs existed replays as the subspace without them, a sample as just the sample."""
        space = family(self.expr.op).space(self.expr, self.limits)
        recorded = set(next(iter(self.rows)))
        absent = tuple(k.name for k in space.knobs if k.name not in recorded)
        return Task(self.expr, device, self.limits, absent, frozenset(self.rows))

    @cached_property
    def best_config(self) -> Config:
        """The config with the fastest recorded median."""
        return min((c for c, r in self.rows.items() if r["status"] == "OK"), key=lambda c: self.rows[c]["t_median"])

    @property
    def best_ms(self) -> float:
        """The fastest recorded median."""
        return self.rows[self.best_config]["t_median"]

    def result(self, config: Config) -> MeasureResult:
        """The recorded outcome of a config (RUNTIME_ERROR if it was never recorded)."""
        row = self.rows.get(config)
        if row is None:
            return MeasureResult(config, Status.RUNTIME_ERROR, message="config not in the recording")
        status, t = Status(row["status"]), row["t_median"]
        if status is not Status.OK:
            return MeasureResult(config, status, compile_s=row["compile_s"], message=row.get("message", ""))
        return MeasureResult(config, status, t, t, t, t, row["compile_s"], message="recorded")

    def results(self) -> list[MeasureResult]:
        """The recorded outcome of every config, in recorded order."""
        return [self.result(c) for c in self.rows]


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

