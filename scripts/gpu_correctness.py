"""Compiled kernels against a float64 reference on the GPU: every dtype (bf16 included, which the
interpreter computes wrongly), awkward shapes, layouts, batch and every epilogue.

Usage: python scripts/gpu_correctness.py [--out results.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch

from triton.backends.compiler import GPUTarget

from tritune.kernels.build import Kernel, canonical_problem, problem_of
from tritune.kernels.expr import BiasAdd, Gelu, Matmul, Relu, Scale
from tritune.schedules.config import Config
from tritune.tuner.builder import Builder
from tritune.tuner.measure import make_inputs, reference, rel_error, tolerance

SHAPES = [(1, 1, 4096, 4096), (1, 37, 29, 53), (3, 129, 257, 67), (2, 1000, 1, 300), (1, 3000, 5000, 1000)]
EPILOGUES = [(), (BiasAdd(),), (Scale(0.125),), (Relu(),), (Gelu(),), (Gelu("tanh"),),
             (Scale(0.5), BiasAdd(), Gelu("tanh"))]
CONFIGS = [
    Config.of(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, UNROLL=1),
    Config.of(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=4, UNROLL=2),
]


def cases() -> list:
    """(expr, config) pairs: every shape x dtype (layouts rotating), every epilogue x dtype."""
    out = []
    layouts = itertools.cycle(("nn", "tn", "nt", "tt"))
    for (b, m, n, k), dtype in itertools.product(SHAPES, ("fp16", "bf16", "fp32")):
        lay = next(layouts)
        out.append((Matmul(m, n, k, batch=b, dtype=dtype, trans_a=lay[0] == "t", trans_b=lay[1] == "t"), CONFIGS[0]))
    configs = itertools.cycle(CONFIGS)
    for epi, dtype in itertools.product(EPILOGUES, ("fp16", "bf16", "fp32")):
        out.append((Matmul(77, 95, 130, batch=2, dtype=dtype, epilogue=epi), next(configs)))
    return out


def precompile(pairs: list) -> None:
    """Compile every case in parallel first (fills Triton's cache; the checks then load binaries)."""
    major, minor = torch.cuda.get_device_capability()
    builder = Builder(GPUTarget("cuda", major * 10 + minor, 32))
    futures = [(c, builder.submit(e, canonical_problem(e), [c])[0]) for e, c in pairs]
    failed = [r for r in (builder.result(f, c) for c, f in futures) if r.status is not None]
    builder.close()
    for r in failed:
        print(f"build failed: {r.config} {r.message[:300]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows, failures = [], 0
    pairs = cases()
    precompile(pairs)
    for i, (expr, config) in enumerate(pairs):
        x = make_inputs(expr, seed=i)
        Kernel(expr, config, problem_of(expr, x.a, x.b, x.c, x.bias))(x.a, x.b, x.c, x.bias)
        torch.cuda.synchronize()
        err = rel_error(x.c, reference(expr, x))
        ok = err <= tolerance(expr)
        failures += not ok
        rows.append({"case": expr.describe(), "block": f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}",
                     "rel_error": err, "tolerance": tolerance(expr), "ok": ok})
        print(f"{'ok  ' if ok else 'FAIL'} {expr.describe():48s} {rows[-1]['block']:12s} err {err:.2e}", flush=True)
    by_dtype = {d: [r for r in rows if f" {d} " in r["case"] + " "] for d in ("fp16", "bf16", "fp32")}
    for d, rs in by_dtype.items():
        print(f"{d}: {sum(r['ok'] for r in rs)}/{len(rs)} correct, max rel error {max(r['rel_error'] for r in rs):.2e}")
    if args.out:
        with open(args.out, "w") as fp:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, fp, indent=1)
    print(f"{len(rows) - failures}/{len(rows)} cases correct")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
