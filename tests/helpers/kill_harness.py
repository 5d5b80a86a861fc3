"""Stop `tune-cli run` at random moments (SIGKILL by default) and check what each stop leaves: the
database's integrity, processes of the run still alive 5 s later, trials stored, trials lost
(measured but not stored: only with the stand-in GPU of the tests, whose worker logs what it
measured), and at the end whether a rerun measures a stored config again.

Usage: python tests/helpers/kill_harness.py --kills 5 --db /tmp/k.db [--signal KILL] [--min-s 5 --max-s 30]
           [--json OUT] -- run --op matmul --shape 2048 --trials 400

The run's arguments follow `--`; `--db` is added to them. With TRITUNE_FAKE_GPU=fake_gpu (tests/helpers
on PYTHONPATH) and FAKE_GPU_LOG=FILE set, trials lost per stop are counted exactly.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

MARK = "TRITUNE_KILL_TEST"  # every process of a run inherits it: how its orphans are found


def processes_marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment carries the mark."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0") and \
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def integrity(db: Path) -> str:
    """SQLite's own check of the file ('ok', or what is broken)."""
    with sqlite3.connect(db) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def stored_keys(db: Path) -> set[str]:
    """The config keys of every stored trial."""
    if not db.exists():
        return set()
    with sqlite3.connect(db) as conn:
        try:
            return {k for (k,) in conn.execute("SELECT config_key FROM trials")}
        except sqlite3.OperationalError:  # killed before the tables were made
            return set()


def measured_log() -> list[str]:
    """What the stand-in GPU measured so far (empty without one)."""
    log = os.environ.get("FAKE_GPU_LOG")
    return Path(log).read_text().split() if log and Path(log).exists() else []


def _sigint_default() -> None:
    # a shell starts background jobs with SIGINT ignored, and Python keeps an inherited ignore:
    # the run must see SIGINT as a user's Ctrl-C
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def trials_now(db: Path) -> int:
    """How many trials the database of a live run holds (0 while it is being created)."""
    try:
        return len(stored_keys(db))
    except sqlite3.DatabaseError:  # a file being created may not read as SQLite yet
        return 0


def wait_for_trials(db: Path, n: int, proc: subprocess.Popen, limit_s: float = 120.0) -> None:
    """Return once the database holds at least n trials, or the run has ended, or after limit_s
    (the report then shows fewer stored at the signal than waited for, and the run's exit)."""
    deadline = time.time() + limit_s
    while trials_now(db) < n and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)


def run(args: list[str], db: Path, delay: float | None, sig: int = signal.SIGKILL, after_trials: int = 0) -> dict:
    """Start `tune-cli ARGS --db DB`, stop it with `sig` once the database holds `after_trials` more
    trials and `delay` s more (delay None: let it finish), and report what the stop left, and how
    many more trials were stored at the signal."""
    mark, before, seen = uuid.uuid4().hex, stored_keys(db), len(measured_log())
    env = dict(os.environ, **{MARK: mark, "PYTHONUNBUFFERED": "1"})
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "tritune", *args, "--db", str(db)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    at_signal = signal_s = None
    if delay is not None:
        wait_for_trials(db, len(before) + after_trials, proc)
        time.sleep(delay)
        at_signal, signal_s = trials_now(db) - len(before), time.time() - start
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    deadline = time.time() + 5
    while processes_marked(mark) and time.time() < deadline:
        time.sleep(0.1)
    orphans = processes_marked(mark)
    for pid in orphans:  # leave none behind for the next round, but count them
        os.kill(pid, signal.SIGKILL)
    after, measured = stored_keys(db), set(measured_log()[seen:])
    return {"delay_s": delay, "signal_s": signal_s, "stored_at_signal": at_signal, "exit": proc.returncode,
            "integrity": integrity(db) if db.exists() else "no file", "orphans": len(orphans),
            "stored": len(after - before), "total": len(after),
            "lost": len(measured - after) if os.environ.get("FAKE_GPU_LOG") else None,
            "remeasured": len(measured & before) if os.environ.get("FAKE_GPU_LOG") else None,
            "last_line": err.strip().splitlines()[-1] if err.strip() else ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--db", required=True, type=Path)
    p.add_argument("--signal", default="KILL", choices=("KILL", "TERM", "INT"))
    p.add_argument("--min-s", type=float, default=5.0)
    p.add_argument("--max-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("run", nargs=argparse.REMAINDER)
    args = p.parse_args()
    run_args = [a for a in args.run if a != "--"]
    rng, sig = random.Random(args.seed), getattr(signal, f"SIG{args.signal}")
    rows = [run(run_args, args.db, rng.uniform(args.min_s, args.max_s), sig) for _ in range(args.kills)]
    for i, r in enumerate(rows, 1):
        print(f"stop {i}: after {r['delay_s']:.1f} s exit {r['exit']}, integrity {r['integrity']}, "
              f"orphans {r['orphans']}, +{r['stored']} trials stored, lost {r['lost']}", flush=True)
    final = run(run_args, args.db, None)
    print(f"rerun to the end: exit {final['exit']}, integrity {final['integrity']}, +{final['stored']} trials, "
          f"{final['total']} stored, stored configs measured again: {final['remeasured']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"stops": rows, "rerun": final}, indent=1))
    bad = [r for r in rows + [final] if r["integrity"] != "ok" or r["orphans"] or (r["lost"] or 0) > 1]
    return 1 if bad or final["exit"] != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
