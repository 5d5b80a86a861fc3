"""Does a GEMV without tensor cores stream a decode weight faster than the MMA template? For a few
rows (M ≤ 16) each program loads a [BLOCK_N, BLOCK_K] tile of the weight (stored [N, K], as
nn.Linear keeps it) straight into registers, multiplies it by the rows of x and reduces along K:
no shared memory, so many programs fit on an SM and keep many loads in flight. A grid of its
knobs, each checked against float64 and graph-timed over operand sets spanning 3× the L2 (L2 cold),
against cuBLAS (torch.mm) and the read ceiling; and cuBLAS with the weight warm in L2.

    python -m scripts.probes.gemv_probe
"""
from __future__ import annotations

import itertools

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def gemv(X, W, Y, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
         EVEN_K: tl.constexpr, STAGES: tl.constexpr, LATE: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = rn % N  # rows past the edge wrap onto valid ones: the loads need no N mask
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        ks = k + rk
        if EVEN_K:
            w = tl.load(W + rw[:, None].to(tl.int64) * K + ks[None, :])
            x = tl.load(X + rm[:, None] * K + ks[None, :], mask=rm[:, None] < M, other=0.0)
        else:
            w = tl.load(W + rw[:, None].to(tl.int64) * K + ks[None, :], mask=ks[None, :] < K, other=0.0)
            x = tl.load(X + rm[:, None] * K + ks[None, :], mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        prod = x[:, None, :].to(tl.float32) * w[None, :, :].to(tl.float32)
        if LATE:
            acc3 += prod
        else:
            acc += tl.sum(prod, axis=2)
    if LATE:
        acc = tl.sum(acc3, axis=2)
    tl.store(Y + rm[:, None] * N + rn[None, :], acc.to(Y.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))
'''


def grid(m: int) -> list[dict]:
    if m == 1:
        axes = dict(BLOCK_N=(2, 4, 8, 16), BLOCK_K=(256, 512), num_warps=(4, 8), STAGES=(1, 3), LATE=(0, 1))
    else:
        axes = dict(BLOCK_N=(4, 8, 16), BLOCK_K=(128, 256, 512), num_warps=(4,), STAGES=(1, 3), LATE=(0,))
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def main() -> None:
    import torch

    from scripts.probes.decode_gemm_probe import read_ceiling_ms
    from tritune.kernels.codegen import load_source
    from tritune.tuner.timing import Timing, copy_bandwidth_gbps, graph_median_ms, operand_sets

    gemv = load_source(SOURCE, "gemv")
    gbps = copy_bandwidth_gbps()
    timed = graph_median_ms(Timing())
    print(f"copy bandwidth {gbps:.0f} GB/s", flush=True)
    for m, n, k in ((1, 2048, 2048), (1, 3072, 2048), (1, 2048, 5632), (1, 11264, 2048), (1, 32000, 2048),
                    (2, 2048, 5632), (4, 2048, 5632), (8, 2048, 5632), (16, 2048, 5632), (4, 2048, 2048)):
        nbytes = n * k * 2
        pct = lambda ms: f"{ms * 1e3:.1f} us ({nbytes / (ms * 1e-3) / 1e9 / gbps:.0%})"
        sets = operand_sets(lambda i: (torch.randn(m, k, device="cuda", dtype=torch.float16),
                                       torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5,
                                       torch.empty(m, n, device="cuda", dtype=torch.float16)), nbytes)
        x, w, _ = sets[0]
        ref = x.double() @ w.double().t()
        lib = timed([lambda s=s: torch.mm(s[0], s[1].t(), out=s[2]) for s in sets])
        warm = timed([lambda s=sets[0]: torch.mm(s[0], s[1].t(), out=s[2])])
        results = []
        for cfg in grid(m):
            knobs = {key: v for key, v in cfg.items() if key != "num_warps"}
            even = k % cfg["BLOCK_K"] == 0
            launch = lambda s, c=knobs, e=even, nw=cfg["num_warps"]: gemv[(-(-n // c["BLOCK_N"]),)](
                s[0], s[1], s[2], m, n, k, BLOCK_M=max(1, m), EVEN_K=e, num_warps=nw, **c)
            try:
                launch(sets[0])
                err = float((sets[0][2].double() - ref).abs().max() / ref.abs().max())
                if err > 1e-2:
                    print(f"  {cfg}: WRONG (max rel err {err:.1e})", flush=True)
                    continue
                results.append((timed([lambda s=s: launch(s) for s in sets]), cfg, err))
            except Exception as exc:  # noqa: BLE001 - a probe reports what does not build or run
                print(f"  {cfg}: FAILED {exc!r}"[:200], flush=True)
        results.sort(key=lambda r: r[0])
        best_ms, best, err = results[0]
        print(f"{m}x{n}x{k} ({nbytes / 1e6:.1f} MB): gemv best {pct(best_ms)} {best} err {err:.1e}; "
              f"cuBLAS {pct(lib)}, warm in L2 {pct(warm)}; read ceiling {pct(read_ceiling_ms(nbytes))}", flush=True)
        for ms, cfg, _ in results[1:4]:
            print(f"    {pct(ms)} {cfg}", flush=True)


if __name__ == "__main__":
    main()
