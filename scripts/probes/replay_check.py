"""Replay on the GPU: tritune.ops.matmul runs the stored best config, matches float64, and costs
little more per call than launching the same compiled kernel directly.

Usage: python -m scripts.probes.replay_check --db tuning.db [--shape 4096] [--dtype fp16]
"""
from __future__ import annotations

import argparse
import warnings

import torch

import tritune
from tritune.kernels.contraction.launch import Kernel, problem_of
from tritune.kernels.expr import torch_dtype
from tritune.kernels.family import family, parse_expr
from tritune.tuner.timing import COMPARE, host_ms_per_launch, time_fn
from tritune.tuner.worker.candidate import rel_error


def host_us_per_call(fn) -> float:
    """The host's µs per asynchronous launch (a tiny problem: the GPU is never the limit)."""
    return 1e3 * host_ms_per_launch(fn)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", required=True)
    p.add_argument("--shape", default="4096")
    p.add_argument("--dtype", default="fp16")
    args = p.parse_args()
    expr = parse_expr("matmul", args.shape, args.dtype)
    fam = family(expr.op)
    x = fam.inputs(expr, 123, "cuda")
    a, b = x.args[0][0], x.args[1][0]
    with tritune.apply_history_best(args.db):
        choice = tritune.ops.explain(a, b)
        y = tritune.ops.matmul(a, b)
        torch.cuda.synchronize()
        err = rel_error(y, fam.reference(expr, x.args)[0])
        ops_ms = time_fn(lambda: tritune.ops.matmul(a, b), COMPARE)[2]
    torch_ms = time_fn(lambda: torch.matmul(a, b), COMPARE)[2]
    print(f"replay {expr.describe()}: source={choice.source} config={choice.config.to_json()}")
    tol = fam.tolerance(expr)
    print(f"  rel error {err:.2e} (tolerance {tol:.0e}) -> {'OK' if err <= tol else 'WRONG'}")
    print(f"  ops.matmul {ops_ms:.4f} ms, torch.matmul {torch_ms:.4f} ms, ratio {torch_ms / ops_ms:.3f}x")
    overhead(args.db, choice.config, args.dtype)


def overhead(db: str, config, dtype: str) -> None:
    """Per-call host cost of ops.matmul against a direct launch of the same compiled kernel."""
    small = parse_expr("matmul", "64", dtype)
    a = torch.randn(64, 64, device="cuda", dtype=torch_dtype(dtype))
    out = torch.empty_like(a)
    kernel = Kernel(small, config, problem_of(small, a, a, out))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 64^3 is not tuned: the nearest shape's config is used
        with tritune.apply_history_best(db):
            tritune.ops.matmul(a, a)
            ops_us = host_us_per_call(lambda: tritune.ops.matmul(a, a))
        plain_us = host_us_per_call(lambda: tritune.ops.matmul(a, a, db=db))
    direct_us = host_us_per_call(lambda: kernel(a, a, out))
    torch_us = host_us_per_call(lambda: torch.matmul(a, a))
    print(f"  host us/call: direct launch {direct_us:.2f}, ops.matmul in apply_history_best {ops_us:.2f} "
          f"(+{ops_us - direct_us:.2f}), ops.matmul(db=) {plain_us:.2f}, torch.matmul {torch_us:.2f}")


if __name__ == "__main__":
    main()
