"""Where a GPU session's start-up goes: one GPU worker started alone, beside a compile pool that
imports the compiler, and beside that pool while this process loads the priors (as `start_gpu`
does). Each variant runs in a fresh process and prints, on its own clock: when the worker had
imported what it runs, when CUDA was up, when its answer came, and a second request's round trip.

Usage (on a GPU host): python -m scripts.probes.startup_probe [--pool 16]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = ("alone", "pool", "pool+priors")


def one(variant: str, pool: int) -> dict:
    """Start a worker (and, by variant, the pool and the priors) and time its answers."""
    from tritune.tuner.builder import Builder
    from tritune.tuner.gpus.start import timeline
    from tritune.tuner.prior import preload
    from tritune.tuner.worker.local import LocalRunner

    wall, builder = time.time(), None
    runner = LocalRunner()
    runner.start()
    if variant != "alone":
        builder = Builder(workers=pool)
        builder.spawn()
    if variant == "pool+priors":
        preload()
    priors = time.time() - wall
    runner.device_info()
    answered = time.time() - wall
    again = time.perf_counter()
    runner.request("info", {"device": None})
    round_trip = time.perf_counter() - again
    moments = timeline(dict(runner.startup), wall, priors_s=priors, answered_s=answered)
    out = {"variant": variant, **{k: round(v, 2) for k, v in moments.items() if v is not None},
           "second_request_ms": round(round_trip * 1e3, 1)}
    if builder is not None:
        builder.close(now=True)
    runner.close(now=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run each variant in a process of its own and print a line for each."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pool", type=int, default=os.cpu_count() or 2, help="compile processes [default: one per core]")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(one(args.variant, args.pool)))
        return 0
    rows = []
    for variant in VARIANTS:
        done = subprocess.run([sys.executable, "-m", "scripts.probes.startup_probe", "--variant", variant,
                               "--pool", str(args.pool)], capture_output=True, text=True, timeout=180)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        rows.append(json.loads(lines[-1]) if lines else {"variant": variant, "error": done.stderr.strip()[-300:]})
        print(rows[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
