"""What a candidate's compile costs, for an sm_90 target (no GPU needed): the builder's own
`build_one`, on the 4096^3 fp16 matmul's space.

  scale     random configs of the space compiled by P processes at once (a fresh Triton cache per
            P): seconds a compile and compiles a second, to tell a slow host from a crowded one
  replay    the candidates a run compiled (its database, `run --db`), recompiled alone by P
            processes: against the run's own compile seconds, to tell a dear mix from contention
  stages    one config and variants of it, each compile split by Triton's stages (TTIR, TTGIR,
            LLVM IR, PTX, cubin)

Usage:
    python -m scripts.probes.compile_probe scale --configs 48 --processes 1,4,8,16
    python -m scripts.probes.compile_probe replay --db run.db --processes 16,4
    python -m scripts.probes.compile_probe stages
"""
from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import sqlite3
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

# a warp-specialised 128x256 tile on 4 warps (a dear compile on Triton 3.6), and variants of it
BASE = {"BLOCK_K": 128, "BLOCK_M": 128, "BLOCK_N": 256, "GROUP_M": 8, "PERSISTENT": 1, "SPLIT_K": 1, "TMA": 1,
        "UNROLL": 1, "WARP_SPEC": 1, "num_stages": 2, "num_warps": 4}
VARIANTS = ({}, {"WARP_SPEC": 0}, {"num_warps": 8}, {"num_warps": 8, "WARP_SPEC": 0}, {"TMA": 2},
            {"TMA": 2, "WARP_SPEC": 0}, {"num_stages": 3, "BLOCK_K": 64}, {"num_stages": 3, "BLOCK_K": 64, "WARP_SPEC": 0})


def _init(cache: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache
    from tritune.tuner.builder import import_compiler

    import_compiler()


def build(spec: str) -> float:
    """Compile one config (JSON) of the 4096^3 matmul for sm_90; its seconds."""
    from triton.backends.compiler import GPUTarget

    from tritune.kernels.family import family, parse_expr
    from tritune.schedules.config import Config
    from tritune.tuner.builder import build_one

    expr = parse_expr("matmul", "4096", "fp16")
    problem = family("matmul").canonical_problem(expr)
    return build_one(expr, Config.from_json(spec), problem, GPUTarget("cuda", 90, 32), 0).compile_s


def _warm(_: int) -> float:
    time.sleep(0.5)  # one warm-up per process: none takes a second
    return build(json.dumps({**BASE, "WARP_SPEC": 0, "num_warps": 8}))


def in_processes(specs: list[str], processes: int) -> tuple[float, list[float]]:
    """Wall seconds and each compile's seconds, `processes` at once, after a warm-up in each."""
    with tempfile.TemporaryDirectory() as cache, ProcessPoolExecutor(
            processes, mp_context=mp.get_context("spawn"), initializer=_init, initargs=(cache,)) as pool:
        list(pool.map(_warm, range(processes)))
        start = time.perf_counter()
        seconds = list(pool.map(build, specs))
        return time.perf_counter() - start, seconds


def line(processes: int, wall: float, seconds: list[float]) -> str:
    n = len(seconds)
    return (f"P={processes:2d}: {n} compiles in {wall:5.1f} s = {n / wall:5.2f}/s; "
            f"mean {sum(seconds) / n:.2f} s, median {sorted(seconds)[n // 2]:.2f} s")


def stages() -> None:
    """Each variant of BASE compiled once, its seconds split by Triton's stages."""
    import triton.backends.nvidia.compiler as nvidia

    spent: collections.Counter = collections.Counter()
    add_stages = nvidia.CUDABackend.add_stages

    def timed_stages(self, stages, options, *args, **kwargs):
        add_stages(self, stages, options, *args, **kwargs)
        for name, fn in list(stages.items()):
            def timed(src, metadata, fn=fn, name=name):
                start = time.perf_counter()
                out = fn(src, metadata)
                spent[name] += time.perf_counter() - start
                return out
            stages[name] = timed

    nvidia.CUDABackend.add_stages = timed_stages
    _warm(0)
    for i, variant in enumerate(VARIANTS):
        spent.clear()
        seconds = build(json.dumps({**BASE, **variant, "GROUP_M": 1 + i}))  # GROUP_M: no cache hits
        print(f"{json.dumps(variant):50s} {seconds:5.2f} s: " + " ".join(f"{k} {t:.2f}" for k, t in spent.items()),
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("scale", "replay", "stages"))
    p.add_argument("--configs", type=int, default=48, help="scale: random configs per process count")
    p.add_argument("--processes", default="1,4,8,16", help="process counts, comma-separated")
    p.add_argument("--db", help="replay: a run's database")
    args = p.parse_args()
    if args.what == "stages":
        return stages()
    for processes in (int(x) for x in args.processes.split(",")):
        if args.what == "replay":
            rows = sqlite3.connect(args.db).execute("select config, compile_s from trials where compile_s > 0").fetchall()
            print(f"the run's pool: {len(rows)} compiles, mean {sum(r[1] for r in rows) / len(rows):.2f} s")
            specs = [r[0] for r in rows]
        else:
            import numpy as np

            from tritune.kernels.family import family, parse_expr
            from tritune.schedules.space import Limits

            space = family("matmul").space(parse_expr("matmul", "4096", "fp16"), Limits.for_capability(9, 0))
            specs = [c.to_json() for c in space.sample(np.random.default_rng(processes), args.configs)]
        print(line(processes, *in_processes(specs, processes)), flush=True)


if __name__ == "__main__":
    main()
