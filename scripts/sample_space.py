"""Measure a seeded random sample of a matmul schedule space on the GPU through the real builder
and runner, and report how its times spread against torch in the same run (JSONL of every trial).

Usage: python scripts/sample_space.py --shape 4096 --dtype fp16 --n 256 [--where WARP_SPEC=1,TMA=2]
       [--faults oob,hang] [--out f.jsonl]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from tritune.kernels.contraction.launch import canonical_problem
from tritune.kernels.family import parse_expr
from tritune.tuner.worker.candidate import Timing
from tritune.tuner.run import device_task, start_gpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="4096")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", default="")
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--refine", type=int, default=0, help="re-time the N fastest configs ...")
    p.add_argument("--repeats", type=int, default=5, help="... this many more times; keep the median")
    p.add_argument("--where", default="", help="sample only configs with these knob values: K=V,K=V")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    expr = parse_expr("matmul", args.shape, args.dtype)
    t0 = time.time()
    runner, builder = start_gpu(Timing(args.warmup_ms, args.rep_ms), args.timeout, args.seed)
    with runner:
        info = runner.device_info()
        task = device_task(expr, info)
        configs = sample(task.space, args.where, np.random.default_rng(args.seed), args.n)
        faults = [f for f in args.faults.split(",") if f]
        configs = [c.replace(fault=f) for c, f in zip(configs, faults)] + configs[len(faults):]
        t1 = time.time()
        futures = builder.submit(expr, canonical_problem(expr), configs)
        results = []
        for c, f in zip(configs, futures):
            built = builder.result(f, c)
            results.append((built, runner.measure(expr, c, built.compile_s) if built.status is None else None))
        refine(expr, runner, results, args.refine, args.repeats)
        t2 = time.time()
        builder.close()
        torch_ms = runner.torch_time(expr)[2]
    report(expr, info, results, torch_ms, args, (t1 - t0, t2 - t1))


def sample(space, where: str, rng, n: int) -> list:
    """A seeded sample of n valid configs (all of them if fewer), limited to the knob values in `where`."""
    if not where:
        return space.sample(rng, n)
    fixed = {k: int(v) for k, v in (item.split("=") for item in where.split(","))}
    unknown = set(fixed) - {k.name for k in space.knobs}
    if unknown:
        raise SystemExit(f"--where: no knob {sorted(unknown)} in this space")
    matching = [c for c in (space.config(int(i)) for i in space.valid_indices)
                if all(c[k] == v for k, v in fixed.items())]
    return [matching[i] for i in sorted(rng.permutation(len(matching))[:n])]


def refine(expr, runner, results, top: int, repeats: int) -> None:
    """Re-time the fastest configs: a single short measurement can flatter a config by a few %."""
    ok = sorted((i for i, (_, m) in enumerate(results) if m is not None and m.ok), key=lambda i: results[i][1].t_median)
    for i in ok[:top]:
        built, first = results[i]
        runs = [first.t_median] + [m.t_median for m in (runner.measure(expr, built.config) for _ in range(repeats)) if m.ok]
        results[i] = (built, dataclasses.replace(first, t_median=float(np.median(runs)), message=json.dumps(runs)))


def report(expr, info, results, torch_ms, args, walls) -> None:
    rows = []
    for built, measured in results:
        status = (measured.status if measured else built.status).value
        rows.append({"config": dict(built.config), "status": status, "compile_s": built.compile_s,
                     "shared": built.shared_bytes, "t_median": measured.t_median if measured else None,
                     "message": (measured.message if measured else built.message)[:400]})
    if args.out:
        with open(args.out, "w") as fp:
            meta = {"workload": expr.to_dict(), "device": info, "torch_ms": torch_ms, "seed": args.seed,
                    "space_valid": len(results), "timing_ms": [args.warmup_ms, args.rep_ms],
                    "date": time.strftime("%Y-%m-%d")}
            fp.write(json.dumps({"meta": meta}) + "\n")
            for r in rows:
                fp.write(json.dumps(r) + "\n")
    ok = sorted(r["t_median"] for r in rows if r["status"] == "OK")
    counts = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    print(f"{expr.describe()} on {info['gpu']} triton {info['triton']} torch {info['torch']}")
    print(f"startup {walls[0]:.1f}s, build+measure {walls[1]:.1f}s for {len(rows)} configs; {counts}")
    for r in rows:
        if r["status"] not in ("OK",):
            print(f"  {r['status']:16s} {r['config']} {r['message'][:100]}")
    if ok:
        ratio = [torch_ms / t for t in ok]
        print(f"torch {torch_ms:.4f} ms; best {ok[0]:.4f} ms = {ratio[0]:.3f}x torch; "
              f"configs >= 0.9x torch: {sum(x >= 0.9 for x in ratio)}/{len(rows)}; >= 0.98x best: "
              f"{sum(t <= ok[0] / 0.98 for t in ok)}")
        best = min((r for r in rows if r["status"] == "OK"), key=lambda r: r["t_median"])
        print(f"best config {best['config']}")


if __name__ == "__main__":
    main()
