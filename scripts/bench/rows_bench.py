"""softmax and layernorm on a GPU: tune each workload, then time the best tuned kernel against torch
eager and torch.compile (default mode) on the same inputs, in one run; prints a compact table last
and writes JSON.

Usage: python -m scripts.bench.rows_bench [--trials 48] [--dtype fp16] [--only 0,2] [--rounds 3] [--out DIR]

Tuning is `tune-cli run`'s, one workload after the other on one GPU worker and compile pool
(`tritune.tuner.run.tune_all`; a fresh database in --out, `sa` warm-started from the workloads
tuned before). The comparison then runs in this process: each round times ours, eager and compiled
in turns (`tritune.tuner.timing.in_turns`, each a median by CUDA events with L2 flushed before every
run); medians of the rounds.
Bandwidth counts the bytes each op must move: read x, write y (and the layernorm weight and bias).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from tritune.kernels.family import Operands, family
from tritune.kernels.rows.expr import LayerNorm, RowOp, Softmax
from tritune.records.database import Database
from tritune.schedules.config import Config
from tritune.tuner.gpus.start import TuneOptions
from tritune.tuner.run import tune_all
from tritune.tuner.timing import COMPARE, in_turns, kernel_median_ms
from tritune.tuner.worker.candidate import rel_error

# (op, M, N): a 4k-vocabulary/attention-like softmax, many short rows, a GPT-2 vocabulary (odd N),
# transformer hidden sizes for layernorm
SHAPES = (("softmax", 4096, 4096), ("softmax", 8192, 1024), ("softmax", 2048, 50257),
          ("layernorm", 8192, 4096), ("layernorm", 4096, 1024))
OPS = {"softmax": Softmax, "layernorm": LayerNorm}


def compiled(expr: RowOp, x: Operands) -> Callable[[], Any]:
    """torch.compile (default mode, static shapes: one graph per workload) of the eager op."""
    if isinstance(expr, LayerNorm):
        fn = torch.compile(lambda a, w, b: F.layer_norm(a, (expr.n,), w, b, expr.eps), dynamic=False)
        args = x.args[:3]
    else:
        fn = torch.compile(lambda a: torch.softmax(a, -1), dynamic=False)
        args = x.args[:1]
    return lambda: fn(*args)


def compare(expr: RowOp, config: dict, rounds: int) -> dict:
    """Check ours, eager and compiled against float64, then median times of the three alternated."""
    fam = family(expr.op)
    x = fam.inputs(expr, seed=1234, device="cuda")
    ref = fam.reference(expr, x.args)
    kernel = fam.kernel(expr, Config.of(config), fam.problem_of(expr, x.args))
    kernel(*x.args)
    torch.cuda.synchronize()
    runs = {"ours": lambda: kernel(*x.args), "eager": fam.eager(expr, x), "compiled": compiled(expr, x)}
    start = time.time()
    errors = {"ours": rel_error(x.out, ref), "eager": rel_error(runs["eager"](), ref),
              "compiled": rel_error(runs["compiled"](), ref)}  # the first compiled call compiles
    compile_s = time.time() - start
    ms = {name: statistics.median(t) for name, t in in_turns(runs, kernel_median_ms(COMPARE), rounds).items()}
    return {"tolerance": fam.tolerance(expr), "torch_compile_s": compile_s,
            **{f"{k}_rel_error": v for k, v in errors.items()}, **{f"{k}_ms": v for k, v in ms.items()},
            **{f"{k}_tbps": fam.rate(expr, v)[0] for k, v in ms.items()},
            "x_eager": ms["eager"] / ms["ours"], "x_compiled": ms["compiled"] / ms["ours"]}


def table(rows: list[dict]) -> str:
    """The compact final table: times in ms, bandwidth in TB/s, ratios = their time / ours (>1: we win)."""
    lines = [f"{'workload':26s} {'trials':>6s} {'ours':>8s} {'eager':>8s} {'compile':>8s} {'x eager':>7s} "
             f"{'x compile':>9s} {'TB/s':>5s} {'eagerTB/s':>9s} {'err':>8s}  best config"]
    for r in rows:
        if r["best_config"] is None:
            lines.append(f"{r['describe']:26s} {r['trials']:6d}  no correct candidate ({r['space_valid']} valid)")
            continue
        c = r["best_config"]
        mode = "1-pass" if c["BLOCK_N"] >= r["workload"]["n"] else "2-pass"
        lines.append(f"{r['describe']:26s} {r['trials']:6d} {r['ours_ms']:8.4f} {r['eager_ms']:8.4f} "
                     f"{r['compiled_ms']:8.4f} {r['x_eager']:7.3f} {r['x_compiled']:9.3f} {r['ours_tbps']:5.2f} "
                     f"{r['eager_tbps']:9.2f} {r['ours_rel_error']:8.1e}  "
                     f"rows={c['ROWS']} BLOCK_N={c['BLOCK_N']} w{c['num_warps']} {mode}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=48)
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--only", default=None, help="comma-separated indices into SHAPES (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="rows-bench")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    picked = [SHAPES[int(i)] for i in args.only.split(",")] if args.only else list(SHAPES)
    exprs = [OPS[op](m, n, args.dtype) for op, m, n in picked]
    for stale in out.glob("rows.db*"):
        stale.unlink()  # a fresh database: a rerun must tune, not resume
    start = time.time()
    tuned = tune_all(exprs, Database(out / "rows.db"), TuneOptions(trials=args.trials, seed=args.seed, batch_size=16))
    tune_s = time.time() - start
    rows = []
    for expr, t in zip(exprs, tuned):
        row = {"describe": expr.describe(), "bytes": expr.bytes, **t}
        if t["best_config"] is not None:
            row.update(compare(expr, t["best_config"], args.rounds))
        rows.append(row)
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "trials": args.trials, "tune_s": tune_s,
            "wall_s": time.time() - start}
    (out / "rows_bench.json").write_text(json.dumps({"device": info, "rows": rows}, indent=1))
    print(json.dumps(info))
    print(table(rows))


if __name__ == "__main__":
    main()
