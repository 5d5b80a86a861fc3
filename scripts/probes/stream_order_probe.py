"""Why a skinny GEMM's weight stream falls short of a read of the same bytes: the read ceiling
(`decode_gemm_probe.read_ceiling_ms`: a few hundred programs, each reading one contiguous chunk)
against reads in a GEMM's order (one short program per block of weight rows, in row order, as a
GEMV or a BLOCK_M=16 tile walks an [N, K] weight) and torch.mm, over [N, 2048] fp16 weights of
several sizes; every kernel graph-timed back to back, operands rotating (L2 cold).

    python -m scripts.probes.stream_order_probe [--ns 8000,32000,151936] [--k 2048] [--busy 16]

Prints one line per weight size: µs and % of the measured copy bandwidth of each. `--busy N` times
everything again while N processes keep the CPU busy (as a tuning run's compile pool does), and
gives the profiler's kernel time of torch.mm beside its graph-timed time in both states.
"""
from __future__ import annotations

import argparse
import multiprocessing

from scripts.probes.decode_gemm_probe import read_ceiling_ms
from tritune.kernels.codegen import load_source
from tritune.tuner.cli.display import bandwidth
from tritune.tuner.timing import (
    Timing,
    copy_bandwidth_gbps,
    gpu_ms_per_call,
    graph_median_ms,
    operand_sets,
)

SWEEP_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def sweep(W, OUT, K, ROWS: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    rows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    acc = tl.zeros((ROWS, BK), dtype=tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES):
        acc += tl.load(W + rows[:, None] * K + k + tl.arange(0, BK)[None, :]).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc))
'''


def sweep_ms(n: int, k: int, rows: int, bk: int, warps: int, stages: int = 4) -> float:
    """ms per call of reading an [n, k] fp16 weight in row order, `rows` rows per program."""
    import torch

    sweep = load_source(SWEEP_SOURCE, "sweep")
    sets = operand_sets(lambda i: torch.randn(n, k, device="cuda", dtype=torch.float16), n * k * 2)
    out = torch.empty(n // rows, device="cuda")
    calls = [lambda w=w: sweep[(n // rows,)](w, out, k, ROWS=rows, BK=bk, STAGES=stages, num_warps=warps)
             for w in sets]
    return graph_median_ms(Timing())(calls)


def mm_ms(n: int, k: int, m: int = 1) -> float:
    """ms per call of torch.mm(x [m, k], w.T) over an [n, k] fp16 weight."""
    import torch

    sets = operand_sets(lambda i: (torch.randn(m, k, device="cuda", dtype=torch.float16),
                                   torch.randn(n, k, device="cuda", dtype=torch.float16)), n * k * 2)
    return graph_median_ms(Timing())([lambda x=x, w=w: torch.mm(x, w.t()) for x, w in sets])


def mm_kernel_ms(n: int, k: int) -> float:
    """The profiler's kernel time per call of torch.mm(x [1, k], w.T) (no gaps, no host)."""
    import torch

    x, w = torch.randn(1, k, device="cuda", dtype=torch.float16), torch.randn(n, k, device="cuda", dtype=torch.float16)
    return gpu_ms_per_call(lambda: torch.mm(x, w.t()))


def _spin() -> None:
    while True:
        pass


def table(ns: list[int], k: int, gbps: float, label: str) -> None:
    """One line per weight size."""
    for n in ns:
        nbytes = n * k * 2
        pct = lambda ms, b=nbytes: f"{ms * 1e3:.1f} us ({bandwidth({'bytes': b, 'copy_gbps': gbps}, ms)[1]})"
        cells = {"read ceiling": read_ceiling_ms(nbytes), "mm m=1": mm_ms(n, k), "mm m=16": mm_ms(n, k, 16),
                 "mm m=1 kernel (profiler)": mm_kernel_ms(n, k)}
        for rows, bk, warps in ((1, 2048, 4), (4, 512, 2), (16, 256, 4)):
            cells[f"sweep {rows}x{bk}/{warps}w"] = sweep_ms(n, k, rows, bk, warps)
        print(f"{label} N={n} ({nbytes / 1e6:.0f} MB): " + "; ".join(f"{c} {pct(v)}" for c, v in cells.items()),
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ns", default="8000,16000,32000,64000,151936")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--busy", type=int, default=0, help="also time with this many CPU-bound processes running")
    args = p.parse_args()
    gbps = copy_bandwidth_gbps()
    ns = [int(v) for v in args.ns.split(",")]
    print(f"copy bandwidth {gbps:.0f} GB/s")
    table(ns, args.k, gbps, "idle host")
    if args.busy:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]  # end with us
        for s in spinners:
            s.start()
        try:
            table(ns, args.k, gbps, f"{args.busy} busy")
        finally:
            for s in spinners:
                s.terminate()


if __name__ == "__main__":
    main()
