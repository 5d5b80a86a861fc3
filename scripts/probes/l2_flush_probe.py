"""Does the way L2 is flushed change short kernels' timings? do_bench flushes by writing 256 MB of
zeros, which leaves L2 full of dirty lines whose write-back can overlap the timed kernel; a flush
by reading leaves clean lines. Times one config and torch both ways, in one run.

Both are timed by `tritune.tuner.timing.timed_runs`: its own write flush, and a read flush passed to it.

Usage: python -m scripts.probes.l2_flush_probe --shape 16,4096,4096 --config '{"BLOCK_M": 16, ...}'
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from tritune.kernels.family import family, parse_expr
from tritune.schedules.config import Config
from tritune.tuner.timing import COMPARE, time_fn, timed_runs, warm_up


def read_flush_median(fn, reps: int = 200) -> float:
    """Median ms of fn, each run preceded by reading (not writing) a 256 MB buffer."""
    buf = torch.ones(64 * 2**20, dtype=torch.float32, device="cuda")
    warm_up(fn, COMPARE)
    return statistics.median(timed_runs(fn, reps, flush=buf.sum))  # reads 256 MB: L2 holds clean lines of buf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="16,4096,4096")
    p.add_argument("--config", required=True, help="JSON of the config to time")
    args = p.parse_args()
    expr = parse_expr("matmul", args.shape, "fp16")
    fam = family(expr.op)
    x = fam.inputs(expr, 0, "cuda")
    kernel = fam.kernel(expr, Config.of(json.loads(args.config)), fam.problem_of(expr, x.args))
    ours, theirs = (lambda: kernel(*x.args)), fam.eager(expr, x)
    rows = []
    for name, fn in (("tritune", ours), ("torch", theirs)):
        rows.append((name, time_fn(fn, COMPARE)[2], read_flush_median(fn)))
    print(f"{expr.describe()}: median ms with a write flush (do_bench) and with a read flush")
    for name, write, read in rows:
        print(f"{name:8s} write-flush {write * 1e3:7.1f} us   read-flush {read * 1e3:7.1f} us")
    print(f"ratio torch/tritune: write-flush {rows[1][1] / rows[0][1]:.3f}x, read-flush {rows[1][2] / rows[0][2]:.3f}x")


if __name__ == "__main__":
    main()
