"""How many timed runs does a candidate need, and can its first few runs tell a loser? Times a
random sample of a workload's space run by run, as the tuner's worker does (warm-up, L2 flushed
before each run), after leaving the GPU idle as it is while a candidate compiles, and writes each
config's first runs and the quantiles of a long timing: the data behind `timing.LOSER` and the
candidate budget (tests/tuner/test_timing.py reads it from tests/fixtures/timing/).

Usage: python -m scripts.probes.timing_probe --shape 4096 --shape 16,4096,4096 --configs 40 --out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from tritune.kernels.device import device_info
from tritune.kernels.family import family, parse_expr
from tritune.tuner.builder import Builder
from tritune.tuner.task import device_limits, device_target, device_task
from tritune.tuner.timing import Timing, quantiles, runs_for, timed_runs, warm_up
from tritune.tuner.worker.candidate import rel_error, seed_for

LONG_RUNS = 400  # the long timing every config is compared with


def probe(expr, configs, idle_s: float) -> list[dict]:
    """Each built config's first runs, its adaptive-budget median and its long timing."""
    fam = family(expr.op)
    x = fam.inputs(expr, seed_for(0, expr.key), "cuda")
    ref = fam.reference(expr, x.args)
    rows = []
    for config in configs:
        kernel = fam.kernel(expr, config, fam.problem_of(expr, x.args))
        kernel(*x.args)
        if not rel_error(x.out, ref) <= fam.tolerance(expr):
            continue
        time.sleep(idle_s)  # the GPU idles while the next candidate compiles: clocks may drop
        fn = lambda: kernel(*x.args)  # noqa: E731
        warm_up(fn, Timing())
        runs = timed_runs(fn, Timing().first_runs + LONG_RUNS)
        first = runs[:Timing().first_runs]
        budget = runs_for(statistics.median(first), Timing())
        rows.append({"config": dict(config), "first": first, "adaptive_runs": budget,
                     "adaptive_median": statistics.median(runs[:budget]),
                     "long": dict(zip(("min", "p20", "median", "p80"), quantiles(runs[len(first):])))})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", action="append", required=True)
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--configs", type=int, default=40)
    p.add_argument("--idle", type=float, default=0.3, help="seconds the GPU idles before each config")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    info = device_info()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    builder = Builder(device_target(info), device_limits(info).shared_bytes)
    for shape in args.shape:
        expr = parse_expr("matmul", shape, args.dtype)
        task = device_task(expr, info)
        configs = task.space.sample(np.random.default_rng(0), args.configs)
        built = [builder.result(f, c) for c, f in zip(configs, builder.submit(expr, task.family.canonical_problem(expr), configs))]
        rows = probe(expr, [b.config for b in built if b.status is None], args.idle)
        name = f"timing_{expr.key}.json"
        (out / name).write_text(json.dumps({"workload": expr.to_dict(), "gpu": info["gpu"], "rows": rows}))
        worst = max(min(r["first"]) / r["long"]["median"] for r in rows)
        drift = max(abs(r["adaptive_median"] / r["long"]["median"] - 1) for r in rows)
        print(f"{expr.describe()}: {len(rows)} configs; fastest of the first runs / long median, worst: "
              f"{worst:.3f}; adaptive median vs long median, worst: {drift:.2%}")
    builder.close()


if __name__ == "__main__":
    main()
