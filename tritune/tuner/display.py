"""Terminal output of the CLI: progress bar and result tables (rich)."""
from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from tritune.kernels.family import expr_from_dict, family
from tritune.records.result import MeasureResult

console = Console(stderr=True)
out = Console()


def rate(expr: Any, ms: float | None) -> str:
    """Throughput of the expression at a time in ms, e.g. '612.3 TFLOP/s' or '2.81 TB/s'."""
    value, unit = family(expr.op).rate(expr, ms)
    return f"{value:.{1 if value >= 10 else 2}f} {unit}"


def progress() -> Progress:
    """A progress bar per workload showing trials done, best so far, ETA, and each GPU's rate."""
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        TextColumn("{task.fields[devices]}"), console=console, transient=False,
    )


class DeviceRates:
    """Trials per second of each GPU that measures a workload, from its first result on."""

    def __init__(self) -> None:
        self._seen: dict[str, list[float]] = {}  # GPU name -> [first result's time, results]

    def add(self, name: str) -> str:
        """Count one result of GPU `name` ("host:index"; "" for none); the rates as one line (empty
        while one GPU measures: the bar's own count says it)."""
        now = time.monotonic()
        if name:
            self._seen.setdefault(name, [now, 0])[1] += 1
        if len(self._seen) < 2:
            return ""
        hosts = {n.rpartition(":")[0] for n in self._seen}
        return "per GPU: " + " ".join(  # one host: its GPUs by index
            f"{n.rpartition(':')[2] if len(hosts) == 1 else n} {(k - 1) / max(now - t, 1e-9):.1f}/s"
            for n, (t, k) in sorted(self._seen.items()))


def config_text(result: MeasureResult) -> str:
    """Compact one-line form of a config."""
    c = result.config
    return " ".join(f"{k}={c[k]}" for k in c)


def status_line(results: Sequence[MeasureResult]) -> str:
    """'128 trials: 120 OK, 5 OUT_OF_RESOURCES, ...'."""
    counts = Counter(r.status.value for r in results)
    parts = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    return f"{len(results)} trials: {parts}"


def summary_table(expr: Any, best: MeasureResult, h2h: dict, gpu: str) -> Table:
    """The final table of a tuned workload: its best against every alternative a user has without
    tritune (library calls, `torch.compile`'s default lowering), timed in turns in the same run."""
    table = Table(title=f"{expr.describe()} on {gpu}")
    for col in ("", "median ms", "throughput", "tritune best is"):
        table.add_column(col, justify="right" if col else "left")
    ours = h2h["ours_ms"]
    table.add_row("tritune best", f"{ours:.4f}", rate(expr, ours), "")
    for name, ms in sorted(h2h["alternatives"].items(), key=lambda kv: kv[1]):
        table.add_row(name, f"{ms:.4f}", rate(expr, ms), f"{ms / ours:.3f}x faster" if ms >= ours else f"{ms / ours:.3f}x")
    winner, ratio = h2h["best_alternative"], h2h["best_alternative_ms"] / ours
    verdict = f"fastest alternative: {winner}; tritune's best is {ratio:.3f}x its speed"
    failed = f"; torch.compile could not run: {h2h['compile_error']}" if h2h.get("compile_error") else ""
    table.caption = f"best config: {config_text(best)}\n{verdict}{failed}"
    return table


def time_table(times: dict) -> Table:
    """Where a run's time went (`tritune.tuner.breakdown.summary`), as seconds and shares of the wall time."""
    table = Table(title="where the time went")
    for col in ("", "seconds", "of wall"):
        table.add_column(col, justify="left" if not col else "right")
    for name, value in times.items():
        if "fraction" in name:
            table.add_row(name, "", f"{value:.0%}")
        else:
            table.add_row(name, f"{value:.1f}", f"{value / times['wall']:.0%}" if times["wall"] else "")
    return table


def best_table(rows: Sequence) -> Table:
    """`tune-cli best`: one row per workload and device."""
    table = Table(title="best stored configs")
    for col in ("workload", "device", "trials", "median ms", "throughput", "config"):
        table.add_column(col)
    for row in rows:
        expr = expr_from_dict(json.loads(row.workload_spec))
        dev = f"{row.device.gpu} (triton {row.device.triton})"
        ms = row.result.t_median
        table.add_row(expr.describe(), dev, str(row.n_trials), f"{ms:.4f}", rate(expr, ms),
                      config_text(row.result))
    if not rows:
        table.caption = "no tuned workloads yet: run `tune-cli run --op matmul --shape 4096`"
    return table
