"""Join recordings of parts of one space (sample_space.py --where ..., run one after the other,
e.g. because one device call cannot measure the whole space) into one recording.

The first part's meta line is kept; `torch_ms_parts` lists torch's time of every part (a drift
check) and `space_valid` counts every config. Parts must be of one workload and one device.

Usage: python scripts/merge_recordings.py OUT.jsonl.gz PART.jsonl [PART.jsonl ...]
"""
from __future__ import annotations

import json
import sys

from tritune.tuner.recordings import read_lines, write_lines


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out, parts = sys.argv[1], [read_lines(p) for p in sys.argv[2:]]
    meta = parts[0][0]
    for other, _ in parts[1:]:
        if (other["workload"], other["device"]["gpu"]) != (meta["workload"], meta["device"]["gpu"]):
            raise SystemExit(f"merge_recordings: parts differ in workload or GPU: {other['device']['gpu']}")
    rows = [row for _, part in parts for row in part]
    configs = [json.dumps(r["config"], sort_keys=True) for r in rows]
    if len(set(configs)) != len(configs):
        raise SystemExit("merge_recordings: a config is in more than one part")
    meta = {**meta, "space_valid": len(rows), "torch_ms_parts": [m["torch_ms"] for m, _ in parts],
            "parts": len(parts)}
    write_lines(out, meta, rows)
    print(f"{len(rows)} configs from {len(parts)} parts -> {out}")


if __name__ == "__main__":
    main()
