"""What devices_bench reads off a tune-cli command's output: its last line, the --verbose "where
the time went" and start-up tables of `run`, and GPU busy per device of `run` and `tune-model`."""
from __future__ import annotations

import re


def last_line(text: str) -> str:
    """The last non-empty line of a command's output."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def parse_verbose(text: str) -> list[dict]:
    """Each "where the time went" table of `tune-cli run --verbose`, as {"wall": seconds,
    "GPU busy": {device or "all": fraction}, "compile pool busy": fraction}: rows "│ name │ seconds │
    share │", fractions as percentages ("GPU busy fraction, host:0 │ │ 28% │")."""
    tables: list[dict] = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)]
        if len(cells) < 4:
            continue
        name, seconds, share = cells[1:4]
        if name == "wall" and seconds:
            tables.append({"wall": float(seconds), "GPU busy": {}})
        elif tables and name.startswith("GPU busy fraction") and share.endswith("%"):
            device = name.partition(", ")[2] or "all"
            tables[-1]["GPU busy"][device] = float(share[:-1]) / 100
        elif tables and name == "compile pool busy fraction" and share.endswith("%"):
            tables[-1]["compile pool busy"] = float(share[:-1]) / 100
    return tables


def parse_startup(text: str) -> dict:
    """The "start-up before the run" table of `tune-cli run --verbose`: {row name: seconds}."""
    rows, inside = {}, False
    for line in text.splitlines():
        inside = inside or "start-up before the run" in line
        cells = [c.strip() for c in re.split(r"[│┃|]", line)]
        if inside and len(cells) == 4 and re.fullmatch(r"[0-9.]+", cells[2]):
            rows[cells[1]] = float(cells[2])
        elif inside and rows and "where the time went" in line:
            break
    return rows


def busy_of_run(tables: list[dict]) -> dict:
    """GPU busy per device of a `run` (its one table): each device where several measured, else all."""
    if not tables:
        return {}
    busy = tables[-1]["GPU busy"]
    return {k: v for k, v in busy.items() if k != "all"} or busy


def busy_of_model(summary: dict, whole_s: float) -> dict:
    """GPU busy per device of a tune-model run: every workload's device-seconds (its fraction of its
    own wall, per device where several measured it) over the whole command's seconds."""
    seconds: dict[str, float] = {}
    for task in summary.get("tasks", []):
        times = task.get("time") or {}
        split = {k.partition(", ")[2]: v for k, v in times.items() if k.startswith("GPU busy fraction, ")}
        for device, fraction in (split or {"?": times.get("GPU busy fraction", 0.0)}).items():
            seconds[device] = seconds.get(device, 0.0) + fraction * times.get("wall", 0.0)
    return {d: round(s / whole_s, 3) for d, s in sorted(seconds.items())} if whole_s else {}
