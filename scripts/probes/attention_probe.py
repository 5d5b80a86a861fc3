"""Decode attention on this GPU: configs of the attention space at a few decode shapes (all of them,
or a seeded sample), each checked against float64 and timed as the tuner's worker times it
(CUDA-graph replays over operand sets), the fastest then timed in turns against torch's SDPA (the
backend torch picks) and torch.compile's lowering of it (`head_to_head`).

    python -m scripts.probes.attention_probe [--dtype fp16] [--configs 64] [--shape NAME]

Prints, per shape, the best config's time and bandwidth (the bytes the op must move) and the
alternatives' times.
"""
from __future__ import annotations

import argparse

import numpy as np

from tritune.kernels.attention.expr import Attention
from tritune.kernels.family import family
from tritune.records.result import Status
from tritune.schedules.space import Limits
from tritune.tuner.timing import Timing
from tritune.tuner.worker.candidate import head_to_head, measure_candidate

# Llama (hidden 2048: 16 query heads over 4 k/v heads, as transformers folds them, head dim 128)
# over the zoo's one key and over caches; one long sequence; GPT-2 (hidden 1024) over a cache
SHAPES = {
    "llama-k1": dict(batch=16, heads=4, lq=4, lk=1, d=128, mask="{dtype}", mask_dims="b"),
    # as the backend's site reads it: 4 query heads a k/v head, q and k rotated in the kernel
    "llama-k1-site": dict(batch=16, heads=16, lq=1, lk=1, d=128, mask="{dtype}", mask_dims="b", out_order="bqhd",
                          group=4, rope_q=128, rope_k=128),
    # the same with the rotary tables computed in the kernel from positions and frequencies: the
    # site's own form, then with a position per row (every row's angles computed)
    "llama-k1-site-pos": dict(batch=16, heads=16, lq=1, lk=1, d=128, mask="{dtype}", mask_dims="b", out_order="bqhd",
                              group=4, rope_q=128, rope_k=128, rope_pos="i64", rope_freq="{dtype}"),
    "llama-k1-site-pos-rows": dict(batch=16, heads=16, lq=1, lk=1, d=128, mask="{dtype}", mask_dims="b",
                                   out_order="bqhd", group=4, rope_q=128, rope_k=128, rope_dims="n", rope_pos="i64"),
    "llama-k1024-site": dict(batch=16, heads=16, lq=1, lk=1024, d=128, mask="{dtype}", mask_dims="bk", group=4,
                             rope_q=128),
    "llama-k1024": dict(batch=16, heads=4, lq=4, lk=1024, d=128, mask="{dtype}", mask_dims="bk"),
    "llama-k4096": dict(batch=16, heads=4, lq=4, lk=4096, d=128, mask="{dtype}", mask_dims="bk"),
    "one-k4096": dict(batch=1, heads=32, lq=1, lk=4096, d=128),
    "gpt2-k1024": dict(batch=16, heads=16, lq=1, lk=1024, d=64, mask="{dtype}", mask_dims="bk", out_order="bqhd"),
}


def expression(name: str, dtype: str) -> Attention:
    """The attention of one of SHAPES in a dtype."""
    fields = {k: v.format(dtype=dtype) if k in ("mask", "rope_freq") else v for k, v in SHAPES[name].items()}
    return Attention(**fields, dtype=dtype)


def probe(expr: Attention, configs: int, limits: Limits) -> dict:
    """The fastest of the space's configs (a seeded sample of `configs` where there are more) and its
    head-to-head."""
    space = family(expr.op).space(expr, limits)
    valid = [space.config(int(i)) for i in space.valid_indices]
    sample = valid if len(valid) <= configs else space.sample(np.random.default_rng(0), configs)
    times = []
    for config in sample:
        got = measure_candidate(expr, config, 0, Timing())
        if got["status"] == Status.OK:
            times.append((got["times"][2], config))
    ms, best = min(times, key=lambda t: t[0])
    return {"ms": ms, "config": best, "measured": len(times), "of": len(valid), "h2h": head_to_head(expr, best, 0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--configs", type=int, default=64)
    p.add_argument("--shape", action="append", choices=sorted(SHAPES))
    args = p.parse_args()
    import torch

    props = torch.cuda.get_device_properties(0)
    limits = Limits(props.shared_memory_per_block_optin, props.multi_processor_count)
    for name in args.shape or SHAPES:
        expr = expression(name, args.dtype)
        r = probe(expr, args.configs, limits)
        h = r["h2h"]
        alts = ", ".join(f"{k} {v * 1e3:.2f} us" for k, v in h["alternatives"].items())
        print(f"{name}: {expr.describe()}: best of {r['measured']} (space {r['of']}) {r['ms'] * 1e3:.2f} us "
              f"({expr.bytes / (r['ms'] * 1e-3) / 1e9:.0f} GB/s) {dict(r['config'])}; head-to-head ours "
              f"{h['ours_ms'] * 1e3:.2f} us vs {alts}", flush=True)


if __name__ == "__main__":
    main()
