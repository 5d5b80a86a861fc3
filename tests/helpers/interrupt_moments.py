"""Stop a tune-cli command at many moments and report what each stop left. This process imports the
CLI once, then forks a child per moment in a folder of its own (a copy of the work folder: the
database and any earlier output); the child runs the command and stops itself once it has used
that much CPU time: an interval timer's SIGPROF, whose handler sends the stop (SIGINT, SIGTERM or
SIGKILL). CPU time, not the clock, places the moments: a loaded host moves them all alike. The
moments spread over the CPU time of a whole run (a first child, not stopped).

Usage: python tests/helpers/interrupt_moments.py WORK MOMENTS -- COMMAND...   (prints one JSON object)

Each moment's record: the signal, the exit (0 where the command ended first; 130, 143, or -9), its
stderr, the database's integrity and trial count, and the sha256 of every file in its folder.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import sqlite3
import sys
import traceback
from pathlib import Path

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child(folder: Path, command: list[str], stop: int | None, at_s: float) -> None:
    """Run the command in `folder` (the forked child: it never returns)."""
    from tritune.tuner.cli import main

    os.chdir(folder)
    err = os.open("stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    if stop is not None:
        signal.signal(signal.SIGPROF, lambda *_: os.kill(os.getpid(), stop))
        signal.setitimer(signal.ITIMER_PROF, at_s)
    start, code = _cpu_s(), 0
    try:
        main(command)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - a stop that came after the command's own handling, or a bug
        if exc.__traceback__.tb_next is not None:  # raised inside the command: a bug
            traceback.print_exc()
            code = 1
        # else the stop landed here, once the command had returned: it ended first (exit 0)
    signal.setitimer(signal.ITIMER_PROF, 0)
    Path("cpu_s.txt").write_text(str(_cpu_s() - start))
    sys.stderr.flush()
    os._exit(code)


def _state(folder: Path) -> dict:
    """What a run left in its folder."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in ("stderr.txt", "cpu_s.txt"):
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    record = {"files": found, "stderr": (folder / "stderr.txt").read_text()}
    if (folder / "t.db").exists():
        with sqlite3.connect(f"{(folder / 't.db').as_uri()}?mode=ro", uri=True) as conn:
            record["integrity"] = conn.execute("PRAGMA integrity_check").fetchone()[0]
            record["trials"] = conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    return record


def _start(work: Path, folder: Path, command: list[str], stop: int | None = None, at_s: float = 0.0) -> int:
    """Fork a child that runs the command in a copy of `work`; its pid."""
    shutil.copytree(work, folder)
    pid = os.fork()
    if pid == 0:
        _child(folder, command, stop, at_s)
    return pid


def _record(folder: Path, status: int, stop: int | None, at_s: float) -> dict:
    cpu = folder / "cpu_s.txt"
    return {"exit": os.waitstatus_to_exitcode(status), "signal": stop and signal.Signals(stop).name, "at_s": at_s,
            "cpu_s": float(cpu.read_text()) if cpu.exists() else None, **_state(folder)}


def moments(work: Path, count: int, command: list[str], seed: int = 0) -> dict:
    """The command run whole once, then stopped at `count` moments spread over its CPU time (as
    many children at once as there are cores: each child's moment is its own CPU time)."""
    runs = work.parent / f"{work.name}-runs"
    whole = _record(runs / "whole", os.waitpid(_start(work, runs / "whole", command), 0)[1], None, 0.0)
    rng = random.Random(seed)
    plan = [(STOPS[i % len(STOPS)], max(0.001, whole["cpu_s"] * (i + rng.random()) / count)) for i in range(count)]
    running: dict[int, int] = {}
    stopped: list = [None] * count
    for i, (stop, at_s) in enumerate(plan):
        if len(running) >= (os.cpu_count() or 1):
            pid, status = os.wait()
            j = running.pop(pid)
            stopped[j] = _record(runs / str(j), status, *plan[j])
        running[_start(work, runs / str(i), command, stop, at_s)] = i
    while running:
        pid, status = os.wait()
        j = running.pop(pid)
        stopped[j] = _record(runs / str(j), status, *plan[j])
    return {"whole": whole, "stopped": stopped}


def _cheap_reports() -> None:
    """Reports cheap to make: the cost model with 2 rounds instead of 150 and plots at 10 dpi
    without a layout pass (a whole report took 15 s of CPU). Where and how the files are written,
    what is under test here, is unchanged. Matplotlib's fonts are loaded before the forks."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tritune.cost_model import report

    def save(fig, path):
        fig.savefig(path, dpi=10)
        plt.close(fig)
        return path

    report.XGBCostModel = functools.partial(report.XGBCostModel, n_estimators=2, n_jobs=1)
    report._save = save
    fig, ax = plt.subplots()
    ax.set(title="fonts")
    save(fig, io.BytesIO())


def _imported(command: str) -> None:
    """What the command imports, imported once here rather than in every child (before its moment)."""
    import tritune.tuner.cli  # noqa: F401
    from tritune.kernels.family import family
    from tritune.tuner.cli import imports  # noqa: F401 - import's checks

    family("matmul")
    if command == "report":
        _cheap_reports()


if __name__ == "__main__":
    work_dir, how_many, rest = Path(sys.argv[1]).absolute(), int(sys.argv[2]), sys.argv[3:]
    command_line = rest[rest.index("--") + 1:]
    _imported(command_line[0])
    print(json.dumps(moments(work_dir, how_many, command_line)))
