"""How close decode's weight-streaming GEMMs come to the memory bandwidth: for each skinny
workload, a seeded sample of the contraction template's space is built in the compile pool, checked
against float64 and timed as the tuner's worker times it (CUDA-graph replays of calls back to back
over operand sets spanning 3x the L2: L2 cold), then the fastest against the library and
torch.compile (`head_to_head`). Beside it, the read ceiling: a kernel that only reads a buffer of
the weight's size, timed the same way, i.e. what any kernel of that size can reach.

    python -m scripts.probes.decode_gemm_probe --shape 16,2048,5632 --configs 160 --out DIR
    python -m scripts.probes.decode_gemm_probe --workload '{"op": "wide", "m": 16, "ns": [2048, 512, 512],
        "k": 2048, "dtype": "fp16", "trans_b": true, "bias": false, "norm_eps": 1e-6}' --out DIR

`--shape` takes a matmul's M,N,K; `--workload` any GEMM family's stored workload spec (wide and
gated ones with a row norm included).

Prints, per workload, the best % of the measured copy bandwidth and the best per value of each
knob; writes DIR/decode_gemm_probe.json.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from tritune.kernels.codegen import load_source
from tritune.kernels.device import device_info
from tritune.kernels.family import expr_from_dict, parse_expr
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.tuner.builder import Builder
from tritune.tuner.task import device_limits, device_target, device_task
from tritune.tuner.timing import (
    Timing,
    copy_bandwidth_gbps,
    graph_median_ms,
    operand_sets,
)
from tritune.tuner.worker.candidate import head_to_head, measure_candidate

READ_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def read_all(X, OUT, n, BLOCK: tl.constexpr, PER: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in tl.range(0, PER, num_stages=4):
        offs = (pid * PER + i).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc))
'''


def read_ceiling_ms(nbytes: int) -> float:
    """Median ms of the fastest of a few read-only kernels over `nbytes` of fp16 (graph-timed, L2 cold)."""
    import torch

    read_all = load_source(READ_SOURCE, "read_all")
    n = nbytes // 2
    sets = operand_sets(lambda i: torch.randn(n, device="cuda", dtype=torch.float16), nbytes)
    best = float("inf")
    for block in (1024, 2048, 4096):
        for programs in (132, 264, 528, 1056):
            per = -(-n // (block * programs))
            out = torch.empty(programs, device="cuda")
            calls = [lambda x=x, o=out, p=programs, b=block, q=per: read_all[(p,)](x, o, n, BLOCK=b, PER=q, num_warps=8)
                     for x in sets]
            best = min(best, graph_median_ms(Timing())(calls))
    return best


def weight_elements(expr) -> int:
    """Elements of the weights a GEMM of any contraction family streams (`k` by its widths)."""
    widths = {"wide": lambda: sum(expr.ns), "gated": lambda: 2 * expr.n}.get(expr.op, lambda: expr.n)()
    return widths * expr.k


def parse_grid(grid: str) -> dict[str, list[int]]:
    """A grid 'KNOB=v1,v2;KNOB=v' as {knob: values}."""
    return {name: [int(v) for v in values.split(",")] for name, values in
            (part.split("=") for part in grid.split(";") if part)}


def grid_sample(space, grid: str) -> list:
    """The valid configs of a grid 'KNOB=v1,v2;KNOB=v' (knobs left out: their first value)."""
    import itertools

    chosen = parse_grid(grid)
    axes = [chosen.get(k.name, [k.values[0]]) for k in space.knobs]
    configs = [Config.of(dict(zip([k.name for k in space.knobs], values))) for values in itertools.product(*axes)]
    return [c for c in configs if space.valid(c)]


def probe(expr, configs: int, builder: Builder, info: dict, grid: str | None = None, alternatives: bool = True) -> dict:
    task = device_task(expr, info)
    sample = grid_sample(task.space, grid) if grid else task.space.sample(np.random.default_rng(0), configs)
    futures = builder.submit(expr, task.family.canonical_problem(expr), sample)
    rows = []
    for config, future in zip(sample, futures):
        built = builder.result(future, config)
        if built.status is not None:
            continue
        got = measure_candidate(expr, built.config, 0, Timing())
        if got["status"] == Status.OK:
            rows.append((built.config, got["times"][2]))
    rows.sort(key=lambda r: r[1])
    weight = weight_elements(expr) * 2
    moved = weight + (expr.m * expr.k + expr.m * weight_elements(expr) // expr.k) * 2
    gbps = copy_bandwidth_gbps()
    pct = lambda ms: 100 * moved / (ms * 1e-3) / 1e9 / gbps
    by_knob: dict = defaultdict(dict)
    for config, ms in rows:
        for knob, value in config.items():
            by_knob[knob].setdefault(str(value), round(pct(ms), 1))
    h2h = head_to_head(expr, rows[0][0], 0) if alternatives else {"ours_ms": rows[0][1], "alternatives": {}}
    read_ms = read_ceiling_ms(weight) if alternatives else float("nan")
    return {"shape": expr.describe(), "weight_mb": weight / 1e6, "built_ok": len(rows), "best_ms": rows[0][1],
            "best_pct": pct(rows[0][1]), "best": dict(rows[0][0]), "top5": [(dict(c), ms) for c, ms in rows[:5]], "by_knob": by_knob,
            "head_to_head": h2h, "read_ceiling_ms": read_ms, "read_ceiling_pct": pct(read_ms)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--workload", action="append", default=[])
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--configs", type=int, default=160)
    p.add_argument("--out", required=True)
    p.add_argument("--grid", help="measure this grid of the space instead of a random sample, e.g. "
                   "'BLOCK_M=16;BLOCK_N=32,64;SPLIT_K=1,2,4' (knobs left out take their first value)")
    p.add_argument("--kernels-only", action="store_true", help="no head-to-head and no read ceiling: the sample only")
    args = p.parse_args()
    info = device_info()
    builder = Builder(device_target(info), device_limits(info).shared_bytes)
    results = []
    try:
        exprs = [parse_expr("matmul", shape, args.dtype) for shape in args.shape]
        for expr in exprs + [expr_from_dict(json.loads(w)) for w in args.workload]:
            r = probe(expr, args.configs, builder, info, args.grid, not args.kernels_only)
            shape = r["shape"]
            results.append(r)
            h = r["head_to_head"]
            alts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in h["alternatives"].items())
            print(f"{shape}: {r['weight_mb']:.1f} MB, {r['built_ok']} ok; best {r['best_ms'] * 1e3:.1f} us "
                  f"({r['best_pct']:.0f}% copy BW); head-to-head ours {h['ours_ms'] * 1e3:.1f} us vs {alts}; "
                  f"read ceiling {r['read_ceiling_ms'] * 1e3:.1f} us ({r['read_ceiling_pct']:.0f}%)", flush=True)
            print("   best:", r["best"], "\n   by knob:", json.dumps(r["by_knob"]), flush=True)
            for config, ms in r["top5"]:
                print(f"   {ms * 1e3:.1f} us {config}", flush=True)
    finally:
        builder.close()
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode_gemm_probe.json").write_text(json.dumps({"gpu": info["gpu"], "copy_gbps": copy_bandwidth_gbps(),
                                                                "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
