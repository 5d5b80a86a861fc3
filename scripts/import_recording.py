"""Load recorded spaces (scripts/sample_space.py output) into a tuning database, as trials in their
recorded order, under the recording's GPU and versions (template 'recorded').

Usage: python scripts/import_recording.py --db DB FILE [FILE ...]
"""
from __future__ import annotations

import argparse

from tritune.records.database import Database
from tritune.records.result import DeviceKey
from tritune.tuner.recordings import Recording


def load(db: Database, path: str) -> int:
    """Add one recording's trials; returns how many were new."""
    rec = Recording.load(path)
    d = rec.device
    device = DeviceKey(d["gpu"], d["capability"], d["triton"], d["torch"], "recorded")
    db.add_workload(rec.expr.key, rec.expr.op, rec.expr.dtype, rec.expr.to_json())
    return db.save(rec.expr.key, device, [rec.result(c) for c in rec.rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", required=True)
    p.add_argument("files", nargs="+")
    args = p.parse_args()
    with Database(args.db) as db:
        for path in args.files:
            print(f"{path}: {load(db, path)} trials")


if __name__ == "__main__":
    main()
