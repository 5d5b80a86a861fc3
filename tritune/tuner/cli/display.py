"""Terminal output of the CLI: progress bars and result tables (rich), and `Terminal`, the report
of a tuning run that shows them."""
from __future__ import annotations

import json
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from tritune.kernels.family import expr_from_dict, rate_text as rate
from tritune.records.result import MeasureResult
from tritune.tuner.run import Report

console = Console(stderr=True)
out = Console()


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


class Terminal(Report):
    """A tuning run on the terminal: a progress bar per workload (workloads tuned at once share
    one display), notes on stderr, each workload's final table on stdout."""

    def __init__(self) -> None:
        self._bar: Progress | None = None

    @contextmanager
    def running(self) -> Iterator[None]:
        """One progress display for the workloads tuned inside (a nested one reuses it)."""
        if self._bar is not None:
            yield
            return
        with progress() as self._bar:
            try:
                yield
            finally:
                self._bar = None

    def started(self, expr: Any, trials: int) -> Callable[[MeasureResult], None]:
        """A bar for the workload: trials done, the best so far, each GPU's rate."""
        bar = self._bar
        if bar is None:  # outside `running` (the run opens it around every search): nothing to show on
            return lambda result: None
        job = bar.add_task(expr.describe(), total=trials, best="-", devices="")
        state, rates = {"best": None}, DeviceRates()

        def on_result(result: MeasureResult) -> None:
            if result.ok and (state["best"] is None or result.t_median < state["best"]):
                state["best"] = result.t_median
            bar.update(job, advance=1, best=rate(expr, state["best"]) if state["best"] else "-",
                       devices=rates.add(result.measured_on))
        return on_result

    def note(self, text: str, problem: bool = False) -> None:
        """On stderr (above the bars while they show); a problem in red."""
        (self._bar.console if self._bar is not None else console).print(f"[red]{text}[/red]" if problem else text)

    def searched(self, history: Sequence[MeasureResult], restarts: int) -> None:
        """The trials' statuses in one line."""
        self.note(status_line(history) + f"; worker restarts: {restarts}")

    def finished(self, expr: Any, best: MeasureResult, h2h: dict, gpu: str) -> None:
        """The workload's final table."""
        out.print(summary_table(expr, best, h2h, gpu))

    def timed(self, times: dict) -> None:
        """Where the time went."""
        out.print(time_table(times))


def config_text(result: MeasureResult) -> str:
    """Compact one-line form of a config."""
    c = result.config
    return " ".join(f"{k}={c[k]}" for k in c)


def status_line(results: Sequence[MeasureResult]) -> str:
    """'128 trials: 120 OK, 5 OUT_OF_RESOURCES, ...'."""
    counts = Counter(r.status.value for r in results)
    parts = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    return f"{len(results)} trials: {parts}"


def bandwidth(h2h: dict, ms: float) -> tuple[str, str]:
    """GB/s of a call that moves the head-to-head's operand bytes in `ms`, and its share of the
    device's measured copy bandwidth ('' where the worker did not say)."""
    if not h2h.get("bytes") or not ms:
        return "", ""
    gbps = h2h["bytes"] / (ms * 1e-3) / 1e9
    return f"{gbps:,.0f}", f"{gbps / h2h['copy_gbps']:.0%}" if h2h.get("copy_gbps") else ""


def summary_table(expr: Any, best: MeasureResult, h2h: dict, gpu: str) -> Table:
    """The final table of a tuned workload: its best against every alternative a user has without
    tritune (library calls, `torch.compile`'s default lowering), timed in turns in the same run;
    with the GB/s each reaches on the operands' bytes and its share of the measured copy bandwidth."""
    table = Table(title=f"{expr.describe()} on {gpu}")
    for col in ("", "median ms", "throughput", "GB/s", "of copy BW", "tritune best is"):
        table.add_column(col, justify="right" if col else "left")
    ours = h2h["ours_ms"]
    table.add_row("tritune best", f"{ours:.4f}", rate(expr, ours), *bandwidth(h2h, ours), "")
    for name, ms in sorted(h2h["alternatives"].items(), key=lambda kv: kv[1]):
        table.add_row(name, f"{ms:.4f}", rate(expr, ms), *bandwidth(h2h, ms),
                      f"{ms / ours:.3f}x faster" if ms >= ours else f"{ms / ours:.3f}x")
    winner, ratio = h2h["best_alternative"], h2h["best_alternative_ms"] / ours
    verdict = f"fastest alternative: {winner}; tritune's best is {ratio:.3f}x its speed"
    if h2h.get("tuned_kernel_ms"):  # the library was kept (`_judge`): the row above is its time
        verdict += (f"\nthe tuned kernel ({h2h['tuned_kernel_ms']:.4f} ms) did not beat every alternative by the "
                    "margin: replay calls the library, a compiled model leaves the site to Inductor")
    failed = f"; torch.compile could not run: {h2h['compile_error']}" if h2h.get("compile_error") else ""
    timed = f"\ntimed as {h2h['timed_as']}" if h2h.get("timed_as") else ""
    copy = f"; copy bandwidth {h2h['copy_gbps']:,.0f} GB/s" if h2h.get("copy_gbps") else ""
    table.caption = f"best config: {config_text(best)}\n{verdict}{failed}{timed}{copy}"
    return table


def startup_table(times: dict) -> Table:
    """Where the time before the first round went (`tritune.tuner.breakdown.startup`), in seconds."""
    table = Table(title="start-up before the run")
    for col in ("", "seconds"):
        table.add_column(col, justify="left" if not col else "right")
    for name, value in times.items():
        table.add_row(name, f"{value:.1f}")
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
    """`tune-cli best`: one row per workload and device (a workload whose stored spec is damaged is
    left out, and counted in the caption)."""
    table = Table(title="best stored configs")
    for col in ("workload", "device", "trials", "median ms", "throughput", "config"):
        table.add_column(col)
    damaged = 0
    for row in rows:
        try:
            expr = expr_from_dict(json.loads(row.workload_spec))
        except (ValueError, KeyError, TypeError, RecursionError):  # ExprError and json's errors are ValueErrors
            damaged += 1
            continue
        dev = f"{row.device.gpu} (triton {row.device.triton})"
        ms = row.result.t_median
        table.add_row(expr.describe(), dev, str(row.n_trials), f"{ms:.4f}", rate(expr, ms),
                      config_text(row.result))
    if not rows:
        table.caption = "no tuned workloads yet: run `tune-cli run --op matmul --shape 4096`"
    elif damaged:
        table.caption = f"left out: {damaged} workload{'s' * (damaged > 1)} whose stored spec is damaged"
    return table


def plan_table(planned: Sequence[Any]) -> Table:
    """The plan as a table: workload, count, FLOP share, trials."""
    table = Table(title="tune-model: tasks")
    for col in ("#", "workload", "count", "FLOPs", "trials", "not fused"):
        table.add_column(col, justify="left" if col in ("workload", "not fused") else "right")
    for i, p in enumerate(planned, 1):
        table.add_row(str(i), p.task.expr.describe(), str(p.task.count), f"{p.share:.0%}", str(p.trials),
                      ", ".join(p.task.unfused))
    return table


def result_table(summaries: Sequence[dict]) -> Table:
    """The model's workloads after tuning: the best found (a tritune kernel, or the library where it
    won) against the fastest alternative without tritune, and what a compiled model will run."""
    table = Table(title="tuned workloads: the best against the fastest alternative (timed in turns)")
    for col in ("workload", "count", "best", "ms", "GB/s", "of copy BW", "fastest alternative", "ms", "speed-up",
                "compiled model runs"):
        table.add_column(col)
    for s in summaries:
        expr = expr_from_dict(s["workload"])
        if not s.get("best_config"):
            table.add_row(expr.describe(), str(s["count"]), "nothing ran", "", "", "", "", "", "", "Inductor's choice")
            continue
        library = s["best_config"].get("library")
        table.add_row(expr.describe(), str(s["count"]), f"library {library}" if library else "tritune kernel",
                      f"{s['final_ours_ms']:.4f}", *bandwidth(s, s["final_ours_ms"]), s["best_alternative"],
                      f"{s['best_alternative_ms']:.4f}",
                      f"{s['ratio_vs_best_alternative']:.3f}x", "Inductor's choice" if library else "tritune kernel")
    return table


def check_table(results: Sequence[dict]) -> Table:
    """The check as a table: per mode Inductor's time and the tuned model's, wall per call and the
    GPU's own time per step (which decides under CUDA graphs), and what the model runs."""
    table = Table(title="the whole model, compiled: Inductor against the tuned kernels (timed in turns)")
    for col in ("mode", "tuned sites", "Inductor ms", "with tuned kernels ms", "speed-up (paired rounds)",
                "GPU ms: Inductor", "tuned", "GPU speed-up", "compiled model runs"):
        table.add_column(col)
    for r in results:
        if "error" in r:
            table.add_row(r["mode"], *[""] * 7, f"check failed ({r['error']}): the sites decide")
        elif not r.get("winner"):
            table.add_row(r["mode"], f"0/{r['sites']}", *[""] * 6, "Inductor (nothing tuned to replay)")
        else:
            runs = "tuned kernels" if r["winner"] == "tritune" else "Inductor (graph verdict)"
            gpu = [f"{r['inductor_gpu_ms']:.4f}", f"{r['tritune_gpu_ms']:.4f}", f"{1 / r['gpu_ratio']:.3f}x"] \
                if "gpu_ratio" in r else ["", "", ""]
            table.add_row(r["mode"], f"{r['tuned_sites']}/{r['sites']}", f"{r['inductor_ms']:.4f}", f"{r['tritune_ms']:.4f}",
                          f"{1 / r['ratio']:.3f}x", *gpu, runs)
    spent = [f"{r['mode']}: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["seconds"].items())
             for r in results if r.get("seconds")]
    table.caption = "where the check's time went: " + "; ".join(spent) if spent else None
    return table
