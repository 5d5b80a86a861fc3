"""How fast a few-row GEMM (decode at batch 16) streams its [N, K] weight when the weight is the
MMA's tall operand: y^T = W @ x^T, tiles of BLOCK_N weight rows by the BLOCK_M input rows, so
Hopper's warp-group MMA (64 rows and more) carries 16 input rows in its narrow dimension, against
the contraction template's orientation (the input rows as the MMA's M, mma.sync below 64 rows).
Standalone kernels, split-K with the template's in-kernel fixup, pointer or TMA loads, and ways
of fusing an RMSNorm before the product (NORM, below); every config is checked against float64
and graph-timed over operand sets spanning 3x the L2 (L2 cold).

    python -m scripts.probes.skinny_probe --shapes 16,2048,2048 16,2048,5632 --out DIR
    python -m scripts.probes.skinny_probe --grid 'NORM=0,1,7;SPLIT=1' --shapes 16,3072,2048 --out DIR
"""
from __future__ import annotations

import argparse
import itertools
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import triton
import triton.language as tl

from tritune.kernels.codegen import load_source
from tritune.kernels.contraction import template
from tritune.kernels.contraction.expr import Matmul

# the split-K fixup of the contraction template's generated module, called by the probe's kernel
_split_fixup = load_source(template.source(Matmul(16, 64, 64, trans_b=True)), "_split_fixup")


@triton.jit
def skinny_mm(X, W, Y, WS, LOCKS, G, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr,
              SWAP: tl.constexpr, NORM: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT)
    lo = split * per
    hi = tl.minimum(lo + per, tl.cdiv(K, BLOCK_K))
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if NORM == 4 or NORM == 5:  # the rows' sums of squares first, in a pass of their own over the input rows
        for kk in range(0, tl.cdiv(K, BLOCK_K)):
            xx = tl.load(X + (offs_m % M)[:, None] * K + (kk * BLOCK_K + offs_k)[None, :]).to(tl.float32)
            ss += tl.sum(xx * xx, axis=1)
    if TMA:
        w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
        x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    for k in tl.range(lo, hi, num_stages=STAGES):
        if TMA:
            w = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            x = x_desc.load([0, k * BLOCK_K])
        else:
            w = tl.load(W + (offs_n % N)[:, None] * K + (k * BLOCK_K + offs_k)[None, :])
            x = tl.load(X + (offs_m % M)[:, None] * K + (k * BLOCK_K + offs_k)[None, :])
        if NORM == 1 or NORM == 3:  # the rows' sums of squares
            x32 = x.to(tl.float32)
            ss += tl.sum(x32 * x32, axis=1)
        if NORM == 6:  # ... from a load of their own, so that the tile feeding the MMA stays in its layout
            xs = tl.load(X + offs_m[:, None] * K + (k * BLOCK_K + offs_k)[None, :]).to(tl.float32)
            ss += tl.sum(xs * xs, axis=1)
        if NORM == 7:  # ... by the tensor cores: x @ x^T, whose diagonal they are (fp16 products are exact in fp32)
            sq = tl.dot(x, tl.trans(x), sq)
        if NORM == 1 or NORM == 2 or NORM == 4 or NORM == 6 or NORM == 7:  # the norm weight over the input tile
            g = tl.load(G + k * BLOCK_K + offs_k).to(tl.float32)
            x = (x.to(tl.float32) * g[None, :]).to(x.dtype)
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if SWAP:
        acc = tl.trans(acc)
    if NORM == 7:
        eye = tl.arange(0, BLOCK_M)[:, None] == tl.arange(0, BLOCK_M)[None, :]
        ss = tl.sum(tl.where(eye, sq, 0.0), axis=1)
    if NORM == 1 or NORM >= 3:
        acc = acc * tl.rsqrt(ss / K + 1e-6)[:, None]
    last = True
    if SPLIT > 1:  # the contraction template's in-kernel fixup
        acc, last = _split_fixup(acc, WS, LOCKS, pid_n, split, BLOCK_M, BLOCK_N, SPLIT)
    if last:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(Y + offs_m[:, None] * N + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=mask)


KNOBS = dict(SWAP=(0, 1), BLOCK_N=(16, 32, 64, 128), BLOCK_K=(128, 256), SPLIT=(1, 2, 4, 8), TMA=(0, 1),
             STAGES=(3, 5), num_warps=(4,), NORM=(0,))
# NORM: 0 none; 1 RMSNorm as the contraction template fuses it (the rows' sums of squares and the
# norm weight's scaling of each input tile in the K loop, the rows' scale on the accumulator);
# 2 only the weight's scaling; 3 only the sums of squares and the scale; 4 the sums of squares in
# a pass before the K loop, the weight's scaling in it; 5 only that pass and the scale; 6 as 1,
# the sums of squares from a second load of the input tile; 7 as 1, the sums of squares as the
# diagonal of x @ x^T on the tensor cores


def configs(grid: str = "") -> list[dict]:
    from scripts.probes.decode_gemm_probe import parse_grid

    knobs = {**KNOBS, **parse_grid(grid)}
    out = []
    for values in itertools.product(*knobs.values()):
        c = dict(zip(knobs, values))
        if c["SWAP"] and c["BLOCK_N"] < 64:
            continue  # a warp-group MMA is 64 rows or more
        out.append(c)
    return out


def _setup():
    import torch
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _args(m: int, n: int, k: int, split: int, block_n: int):
    import torch
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
    tiles = triton.cdiv(n, block_n)
    ws = torch.empty(tiles * split * 16 * block_n, device="cuda", dtype=torch.float32)
    locks = torch.zeros(tiles, device="cuda", dtype=torch.int32)
    g = 1 + torch.rand(k, device="cuda", dtype=torch.float16)
    return x, w, y, ws, locks, g


def _launch(x, w, y, ws, locks, g, c: dict):
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(n, c["BLOCK_N"]), c["SPLIT"])
    return skinny_mm[grid](x, w, y, ws, locks, g, m, n, k, BLOCK_M=16, **c)


def _build(batch: list[dict]) -> int:
    _setup()
    built = 0
    for c in batch:  # one compile per config: the sizes are not constexpr (all divisible by 16)
        try:
            _launch(*_args(16, 2048, 2048, c["SPLIT"], c["BLOCK_N"]), c)
            built += 1
        except Exception:  # out of shared memory: measure() finds it again and skips it
            pass
    return built


def measure(shape: tuple[int, int, int], c: dict) -> float | None:
    import torch

    from tritune.tuner.timing import Timing, graph_median_ms, operand_sets
    m, n, k = shape
    sets = operand_sets(lambda i: _args(m, n, k, c["SPLIT"], c["BLOCK_N"]), 2 * n * k)
    x, w, y, ws, locks, g = sets[0]
    try:
        _launch(x, w, y, ws, locks, g, c)
    except Exception:  # does not fit the SM
        return None
    xd = x.double() * (g.double() if c["NORM"] in (1, 2, 4, 6, 7) else 1)
    ref = xd @ w.double().T
    if c["NORM"] in (1, 3, 4, 5, 6, 7):
        ref = ref * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    if not torch.allclose(y.double(), ref, atol=2e-2, rtol=2e-2):
        return None
    return graph_median_ms(Timing())([lambda a=a: _launch(*a, c) for a in sets])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shapes", nargs="+", required=True, help="M,N,K (M at most 16)")
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--grid", default="", help="knob values instead of the defaults, e.g. 'NORM=0,1;SPLIT=1'")
    args = p.parse_args()
    from tritune.tuner.timing import copy_bandwidth_gbps
    _setup()
    cs = configs(args.grid)
    with ProcessPoolExecutor(args.jobs) as pool:  # fills Triton's cache; this process then loads from it
        list(pool.map(_build, [cs[i::args.jobs] for i in range(args.jobs)]))
    gbps = copy_bandwidth_gbps()
    results = []
    for text in args.shapes:
        shape = tuple(int(v) for v in text.split(","))
        m, n, k = shape
        rows = [(c, measure(shape, c)) for c in cs]
        wrong = sum(ms is None for _, ms in rows)
        rows = sorted((r for r in rows if r[1] is not None), key=lambda r: r[1])
        pct = lambda ms: 100 * 2 * (n * k + m * k + m * n) / (ms * 1e-3) / 1e9 / gbps
        best_by = {f"{knob}={v}": min((ms for c, ms in rows if c[knob] == v), default=None)
                   for knob in ("SWAP", "NORM") for v in range(8)}
        print(f"{m}x{n}x{k}: {2 * n * k / 1e6:.1f} MB, {len(rows)} ok, {wrong} wrong; best {rows[0][1] * 1e3:.2f} us "
              f"({pct(rows[0][1]):.0f}%) {rows[0][0]}; best by value "
              + ", ".join(f"{key} {v * 1e3:.2f} us ({pct(v):.0f}%)" for key, v in best_by.items() if v), flush=True)
        for c, ms in rows[:4]:
            print(f"   {ms * 1e3:.2f} us {c}", flush=True)
        results.append({"shape": shape, "wrong": wrong, "rows": rows})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "skinny_probe.json").write_text(json.dumps({"copy_gbps": gbps, "results": results}, default=str))


if __name__ == "__main__":
    main()
