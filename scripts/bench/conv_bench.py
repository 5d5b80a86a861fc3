"""conv2d on a GPU: tune ResNet-like layers, then time the best tuned kernel against torch (cuDNN,
channels_last) on the same inputs, in one run; prints a compact table last and writes JSON.

Usage: python -m scripts.bench.conv_bench [--trials 48] [--dtype fp16] [--layers 0,1,..] [--out DIR]

Tuning is `tune-cli run`'s, one layer after the other on one GPU worker and compile pool
(`tritune.tuner.run.tune_all`; fresh database in --out, `sa` warm-started from the layers
tuned before). The final comparison runs in this process: each round
times ours, cuDNN with its default heuristics and cuDNN with `cudnn.benchmark=True` (its own
autotuning) in turns on the same tensors (`tritune.tuner.timing.in_turns`, each a median by CUDA
events with L2 flushed); medians of the rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tritune.kernels.conv.expr import Conv2d
from tritune.kernels.family import family
from tritune.records.database import Database
from tritune.schedules.config import Config
from tritune.tuner.gpus.start import TuneOptions
from tritune.tuner.run import tune_all
from tritune.tuner.timing import COMPARE, in_turns, kernel_median_ms
from tritune.tuner.worker.candidate import rel_error

# (name, N, H, W, C, K, R, S, stride, padding): ResNet-50-like layers at batch 32
LAYERS = (
    ("conv2_3x3", 32, 56, 56, 64, 64, 3, 3, 1, 1),
    ("conv3_3x3", 32, 28, 28, 128, 128, 3, 3, 1, 1),
    ("conv4_3x3", 32, 14, 14, 256, 256, 3, 3, 1, 1),
    ("conv2_1x1", 32, 56, 56, 256, 64, 1, 1, 1, 0),
    ("stem_7x7", 32, 224, 224, 3, 64, 7, 7, 2, 3),
)


def compare(expr: Conv2d, config: dict, rounds: int = 5) -> dict:
    """Check the tuned kernel, then median times of it and of cuDNN (default, benchmark) alternated."""
    fam = family(expr.op)
    x = fam.inputs(expr, seed=1234, device="cuda")
    kernel = fam.kernel(expr, Config.of(config), fam.problem_of(expr, x.args))
    kernel(*x.args)
    torch.cuda.synchronize()
    err = rel_error(x.out, fam.reference(expr, x.args))
    eager = fam.eager(expr, x)
    torch.backends.cudnn.benchmark = True
    eager()  # cuDNN's own search runs on the first call: keep it out of the timings
    runs = {"ours": lambda: kernel(*x.args), "cudnn": cudnn(eager, False), "cudnn_bench": cudnn(eager, True)}
    ms = {k: statistics.median(v) for k, v in in_turns(runs, kernel_median_ms(COMPARE), rounds).items()}
    torch.backends.cudnn.benchmark = False
    return {"rel_error": err, "tolerance": fam.tolerance(expr), **{f"{k}_ms": v for k, v in ms.items()},
            "ratio_vs_cudnn": ms["cudnn"] / ms["ours"], "ratio_vs_cudnn_bench": ms["cudnn_bench"] / ms["ours"],
            "ours_tflops": expr.flops / ms["ours"] / 1e9, "cudnn_tflops": expr.flops / ms["cudnn"] / 1e9}


def cudnn(eager, benchmark: bool):
    """The eager conv with cuDNN's own autotuning on or off (a flag it reads at each call)."""
    def run():
        torch.backends.cudnn.benchmark = benchmark
        return eager()
    return run


def table(rows: list[dict]) -> str:
    """The compact final table (times in ms, ratios = cuDNN time / ours: above 1 means faster)."""
    head = f"{'layer':11s} {'gemm MxNxK':>20s} {'trials':>6s} {'ours':>8s} {'cuDNN':>8s} {'cuDNN-b':>8s} " \
           f"{'x cuDNN':>7s} {'x cuDNN-b':>9s} {'TFLOP/s':>7s} {'err':>8s}  best config"
    lines = [head]
    for r in rows:
        gemm = "x".join(map(str, r["gemm"]))
        if r["best_config"] is None:
            lines.append(f"{r['name']:11s} {gemm:>20s} {r['trials']:6d}  no correct candidate ({r['space_valid']} valid)")
            continue
        c = r["best_config"]
        cfg = f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} g{c['GROUP_M']} w{c['num_warps']} s{c['num_stages']} u{c['UNROLL']}"
        lines.append(f"{r['name']:11s} {gemm:>20s} {r['trials']:6d} {r['ours_ms']:8.4f} {r['cudnn_ms']:8.4f} "
                     f"{r['cudnn_bench_ms']:8.4f} {r['ratio_vs_cudnn']:7.3f} {r['ratio_vs_cudnn_bench']:9.3f} "
                     f"{r['ours_tflops']:7.1f} {r['rel_error']:8.1e}  {cfg}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=48)
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--layers", default=None, help="comma-separated indices into LAYERS (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="conv-bench")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    picked = [LAYERS[int(i)] for i in args.layers.split(",")] if args.layers else list(LAYERS)
    exprs = [Conv2d(*layer[1:8], stride=layer[8], padding=layer[9], dtype=args.dtype) for layer in picked]
    db_path = out / "conv.db"
    for stale in out.glob("conv.db*"):
        stale.unlink()  # a fresh database: a rerun must tune, not resume
    start = time.time()
    tuned = tune_all(exprs, Database(db_path), TuneOptions(trials=args.trials, seed=args.seed, batch_size=16))
    rows = []
    for layer, expr, t in zip(picked, exprs, tuned):
        row = {"name": layer[0], "describe": expr.describe(), "gemm": expr.gemm, **t}
        if t["best_config"] is not None:
            row.update(compare(expr, t["best_config"]))
        rows.append(row)
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "triton": __import__("triton").__version__, "trials": args.trials, "wall_s": time.time() - start}
    (out / "conv_bench.json").write_text(json.dumps({"device": info, "rows": rows}, indent=1))
    print(json.dumps(info))
    print(table(rows))


if __name__ == "__main__":
    main()
