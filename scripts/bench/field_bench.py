"""tritune against the field on one matmul, in one process on one GPU: torch.matmul (cuBLAS),
tritune's replayed best (ops.matmul under apply_history_best), and Inductor's max-autotune, once
with every GEMM backend (cuBLAS among them) and once with its Triton templates alone (without CUDA
graphs: those copy each call's inputs into static buffers, 64 MB at 4096^3, which timed
Inductor's own choice of cuBLAS 35% slower than cuBLAS called eagerly). Each is
checked against float64, then all are timed in turns (`tritune.tuner.timing.in_turns`: CUDA
events, L2 flushed; the median of the rounds' medians), so the ratios hold even if the GPU's
clocks drift.

Usage: python -m scripts.bench.field_bench --db tuning.db [--shape 4096] [--dtype fp16] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import tritune
from tritune.kernels.family import family, parse_expr
from tritune.tuner.timing import Timing, in_turns, kernel_median_ms
from tritune.tuner.worker.candidate import rel_error


def mm_every_backend(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x @ y


def mm_triton_only(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x @ y  # a code object of its own, so Dynamo compiles it apart from the one above


def inductor(fn, a: torch.Tensor, b: torch.Tensor, backends: str):
    """fn compiled by max-autotune over the given GEMM backends, and its compile seconds."""
    import torch._inductor.config as inductor_config

    start = time.time()
    with inductor_config.patch(max_autotune_gemm_backends=backends):
        compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
        compiled(a, b)
        torch.cuda.synchronize()
    return compiled, time.time() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--shape", default="4096")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup-ms", type=float, default=5.0)
    p.add_argument("--rep-ms", type=float, default=25.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    expr = parse_expr("matmul", args.shape, args.dtype)
    fam = family(expr.op)
    x = fam.inputs(expr, 123, "cuda")
    a, b = x.args[0][0], x.args[1][0]
    ref = fam.reference(expr, x.args)[0]
    fns, compile_s = {"torch.matmul": lambda: torch.matmul(a, b)}, {}
    with tritune.apply_history_best(args.db):
        fns["tritune (replayed)"] = lambda: tritune.ops.matmul(a, b)
        fns["tritune (replayed)"]()  # the dispatch context is read at call time: keep it open
        for name, fn, backends in (("inductor max-autotune", mm_every_backend, "ATEN,TRITON"),
                                   ("inductor max-autotune, Triton only", mm_triton_only, "TRITON")):
            compiled, compile_s[name] = inductor(fn, a, b, backends)
            fns[name] = lambda compiled=compiled: compiled(a, b)
        errors = {name: rel_error(fn(), ref) for name, fn in fns.items()}
        rounds = in_turns(fns, kernel_median_ms(Timing(args.warmup_ms, args.rep_ms)), args.rounds)
    report(expr, fns, rounds, errors, compile_s, args)


def report(expr, fns, rounds, errors, compile_s, args) -> None:
    ms = {name: float(np.median(t)) for name, t in rounds.items()}
    print(f"{expr.describe()} on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}; {args.rounds} rounds in turn, "
          f"timing {args.warmup_ms}/{args.rep_ms} ms, L2 flushed")
    print(f"{'':38s} {'median ms':>10s} {'vs torch':>9s} {'spread':>7s} {'rel err':>9s} {'compile s':>9s}")
    for name in fns:
        spread = (max(rounds[name]) - min(rounds[name])) / ms[name]
        print(f"{name:38s} {ms[name]:10.4f} {ms['torch.matmul'] / ms[name]:8.3f}x {spread:7.1%} "
              f"{errors[name]:9.1e} {compile_s.get(name, 0):9.0f}")
    if args.json:
        with open(args.json, "w") as fp:
            json.dump({"workload": expr.to_dict(), "gpu": torch.cuda.get_device_name(), "ms": ms,
                       "rounds": rounds, "rel_error": errors, "compile_s": compile_s}, fp, indent=1)


if __name__ == "__main__":
    main()
