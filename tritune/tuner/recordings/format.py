"""The recording format, read and written in this one place: a first line `{"meta": ...}` (the
workload, the GPU's facts, torch's time for the same problem, the timing, the date), then one line
per config (its knobs, status, compile seconds, shared bytes, median ms and message); `.jsonl`, or
gzip-compressed `.jsonl.gz`."""
from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tritune.kernels.family import expr_from_dict, family
from tritune.records import files
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config
from tritune.schedules.space import Limits
from tritune.tuner.task import Task

# Recordings shipped with tritune (real GPU measurements of whole spaces or large samples); see
# recordings/README.md for how and where each was measured.
BUNDLED = Path(__file__).parent

MESSAGE_CHARS = 400  # of a config's message (a compiler's can run to pages)


class RecordingError(ValueError):
    """A file that is not a recording, or recordings that cannot be joined (the message is one line)."""


def _open(path: str | Path, mode: str, name: str | Path | None = None) -> Any:
    """The file at `path`, gzip-compressed where `name` (else the path) ends in .gz."""
    return (gzip.open if str(name or path).endswith(".gz") else open)(path, mode)


def read_lines(path: str | Path) -> tuple[dict, list[dict]]:
    """A recording file as it is stored: its meta line and one dict per config (.jsonl or .jsonl.gz)."""
    unreadable = files.not_a_regular_file(path)
    if unreadable:  # a FIFO would wait for a writer
        raise RecordingError(f"{path}: not a recording: {unreadable}")
    try:
        with _open(path, "rt") as fp:
            meta = json.loads(fp.readline())["meta"]
            return meta, [json.loads(line) for line in fp]
    except (ValueError, KeyError, TypeError, EOFError, gzip.BadGzipFile, RecursionError) as exc:
        raise RecordingError(f"{path}: not a recording (a meta line, then one JSON line per config): "
                             f"{type(exc).__name__}") from None
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def write_lines(path: str | Path, meta: dict, rows: list[dict]) -> None:
    """Store a recording (gzip-compressed when the name ends in .gz), put in place once complete
    (`records.files.written`); RecordingError (one line) where it cannot be written."""
    try:
        with files.written(path) as part, _open(part, "wt", name=path) as fp:
            fp.write(json.dumps({"meta": meta}) + "\n")
            fp.writelines(json.dumps(r) + "\n" for r in rows)
    except OSError as exc:
        raise RecordingError(f"cannot write {path}: {exc.strerror or exc}") from None


def meta_line(expr: Any, device: dict, torch_ms: float, **facts: Any) -> dict:
    """A recording's meta line: the workload, the GPU's facts, torch's median ms, today's date and
    `facts` (the seed, the timing, ...)."""
    return {"workload": expr.to_dict(), "device": device, "torch_ms": torch_ms, **facts,
            "date": time.strftime("%Y-%m-%d")}


def config_line(built: Any, measured: MeasureResult | None) -> dict:
    """One config's line: its build (a `BuildResult`) and, if it built, its measurement."""
    return {"config": dict(built.config), "status": (measured.status if measured else built.status).value,
            "compile_s": built.compile_s, "shared": built.shared_bytes,
            "t_median": measured.t_median if measured else None,
            "message": (measured.message if measured else built.message)[:MESSAGE_CHARS]}


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
        try:
            rows = {Config.of(r["config"]): r for r in lines}
            device = meta["device"]
            return cls(expr_from_dict(meta["workload"]), Limits(device["shared_bytes"], device["sms"]), device,
                       meta["torch_ms"], rows)
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordingError(f"{path}: not a recording: {type(exc).__name__}: {exc}") from None

    def device_key(self) -> DeviceKey:
        """The recorded GPU and versions, under the template name 'recorded'."""
        d = self.device
        return DeviceKey(d["gpu"], d["capability"], d["triton"], d["torch"], "recorded")

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
