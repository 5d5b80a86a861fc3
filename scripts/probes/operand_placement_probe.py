"""Whether a skinny GEMM's graph-timed speed depends on how its operand sets were made: the tuner's
own sets (`family.inputs`: fp32 randn cast to the dtype, a weight viewed [K, N] from [N, K]) against
clones of them (same values, fresh memory), the same memory refilled with other values, and fresh
fp16 tensors; each timed as torch.matmul (the head-to-head's library call) and as one tuned config,
graph-timed back to back over two operand sets (L2 cold).

    python -m scripts.probes.operand_placement_probe [--n 32000] [--k 2048] [--m 1]
"""
from __future__ import annotations

import argparse

from tritune.kernels.family import expr_from_dict, family
from tritune.schedules.config import Config
from tritune.tuner.cli.display import bandwidth
from tritune.tuner.timing import Timing, copy_bandwidth_gbps, graph_median_ms

GEMV = {"GEMV": 1, "BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 512, "GROUP_M": 1, "PERSISTENT": 0, "SPLIT_K": 1,
        "TMA": 0, "UNROLL": 1, "WARP_SPEC": 0, "num_stages": 6, "num_warps": 2}
MMA = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1, "PERSISTENT": 0, "SPLIT_K": 1, "TMA": 0,
       "UNROLL": 1, "WARP_SPEC": 0, "num_stages": 5, "num_warps": 4}


def variants(expr, fam) -> dict[str, list[tuple]]:
    """Two operand sets per way of making them."""
    import torch

    harness = [fam.inputs(expr, seed, "cuda").args for seed in (1, 2)]
    clones = [tuple(a.clone() if hasattr(a, "clone") else a for a in args) for args in harness]
    refilled = [tuple(a.clone() if hasattr(a, "clone") else a for a in args) for args in harness]
    for args in refilled:
        args[1].copy_(torch.randn(args[1].shape, device="cuda", dtype=args[1].dtype))

    def fresh() -> tuple:
        a, b, c = harness[0][:3]
        w = torch.randn(expr.n, expr.k, device="cuda", dtype=b.dtype)
        return (torch.randn_like(a), w.view(1, expr.n, expr.k).transpose(1, 2), torch.empty_like(c))
    return {"harness": harness, "clones": clones, "refilled": refilled, "fresh fp16": [fresh(), fresh()]}


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=32000)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--m", type=int, default=1)
    args = p.parse_args()
    expr = expr_from_dict({"op": "matmul", "m": args.m, "n": args.n, "k": args.k, "dtype": "fp16",
                           "trans_b": True, "bias": False})
    fam = family(expr.op)
    weight = {"bytes": args.n * args.k * 2, "copy_gbps": copy_bandwidth_gbps()}
    config = Config.of(GEMV if args.m <= 4 else MMA)
    for label, sets in variants(expr, fam).items():
        kernel = fam.kernel(expr, config, fam.problem_of(expr, sets[0]))
        cells = {"matmul": [lambda s=s: torch.matmul(s[0], s[1]) for s in sets],
                 "kernel": [lambda s=s, k=kernel: k(*s) for s in sets]}
        line = []
        for name, calls in cells.items():
            ms = graph_median_ms(Timing())(calls)
            line.append(f"{name} {ms * 1e3:.1f} us ({bandwidth(weight, ms)[1]})")
        print(f"{expr.describe()} {label}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
