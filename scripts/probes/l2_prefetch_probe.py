"""Can a decode step keep the memory busy between its weight streams? A skinny GEMM's weight does
not depend on anything before it, so it can be asked into L2 while the small kernels before it
(norms, rotary, attention: latency-bound, the DRAM idle) run. A chain of layers, each a few small
elementwise kernels then y = x @ W_iᵀ (cuBLAS), distinct weights spanning 2× the L2, captured in
one CUDA graph and timed by replays; the weight of layer i asked into L2 (up to --cap MB of it):

  none    no prefetch
  inline  a prefetch kernel in the stream before layer i's small kernels
  side    the same kernel on a side stream forked there (runs beside the small kernels)
  early   on a side stream forked before layer i-1's GEMM (beside that GEMM and the small kernels)

and two ways to ask: `bulk` (cp.async.bulk.prefetch.L2, one instruction per chunk) and `line`
(prefetch.global.L2, one per 128-byte line).

    python -m scripts.probes.l2_prefetch_probe [--cap 24]
"""
from __future__ import annotations

import sys

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def prefetch_l2(W, nbytes, CHUNK: tl.constexpr, PER_PROG: tl.constexpr, BULK: tl.constexpr):
    # byte offsets of this program's chunks, the last ones pulled back inside the buffer
    i = tl.program_id(0) * PER_PROG + tl.arange(0, PER_PROG)
    if BULK:
        start = tl.minimum(i.to(tl.int64) * CHUNK, nbytes - CHUNK)
        size = tl.full((PER_PROG,), CHUNK, tl.int32)
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;", "=r,l,r",
                                  [W.to(tl.pointer_type(tl.int8)) + start, size], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        start = tl.minimum(i.to(tl.int64) * 128, nbytes - 128)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l",
                                  [W.to(tl.pointer_type(tl.int8)) + start], dtype=tl.int32,
                                  is_pure=False, pack=1)
'''


def _prefetcher(kernel, bulk: bool):
    """A call asking the first `nbytes` of a tensor into L2."""
    chunk, per_prog = (65536, 16) if bulk else (128, 1024)

    def ask(w, nbytes: int) -> None:
        units = -(-nbytes // chunk)
        kernel[(-(-units // per_prog),)](w, nbytes, CHUNK=chunk, PER_PROG=per_prog, BULK=int(bulk),
                                         num_warps=4 if not bulk else 1)
    return ask


def _step(ws, xs, ys, mode: str, ask, cap: int, fillers: int):
    """One pass over the layers, as captured: small kernels then the GEMM, prefetches by `mode`."""
    import torch

    cur = torch.cuda.current_stream()
    side = torch.cuda.Stream() if mode in ("side", "early") else None

    def on_side(w) -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ask(w, min(cap, w.numel() * w.element_size()))

    def run() -> None:
        if mode == "early":
            on_side(ws[0])
        for i, w in enumerate(ws):
            if mode == "inline":
                ask(w, min(cap, w.numel() * w.element_size()))
            elif mode == "side":
                on_side(w)
            for _ in range(fillers):
                xs[i].mul_(1.0001)
            if mode == "early" and i + 1 < len(ws):
                on_side(ws[i + 1])
            torch.mm(xs[i], w.t(), out=ys[i])
        if side is not None:
            cur.wait_stream(side)
    return run


def main() -> None:
    import torch

    from tritune.kernels.codegen import load_source
    from tritune.tuner.timing import Timing, _replays, capture, copy_bandwidth_gbps, warm_up

    cap = int(float(sys.argv[sys.argv.index("--cap") + 1]) * 2**20) if "--cap" in sys.argv else 24 * 2**20
    kernel = load_source(SOURCE, "prefetch_l2")
    gbps = copy_bandwidth_gbps()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"copy bandwidth {gbps:.0f} GB/s, L2 {l2 / 2**20:.0f} MB, prefetch cap {cap / 2**20:.0f} MB", flush=True)
    rows = []
    for m, n, k in ((16, 2048, 2048), (16, 2048, 5632), (16, 11264, 2048), (1, 2048, 2048)):
        wbytes = n * k * 2
        layers = max(6, 2 * l2 // wbytes + 1)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(layers)]
        xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(layers)]
        ys = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(layers)]
        floor = wbytes / gbps / 1e3
        for fillers in (0, 3):
            for mode, how in (("none", "-"), ("inline", "bulk"), ("inline", "line"), ("side", "bulk"),
                              ("side", "line"), ("early", "bulk")):
                try:
                    ask = _prefetcher(kernel, how == "bulk") if how != "-" else None
                    graph = capture([_step(ws, xs, ys, mode, ask, cap, fillers)], 4)
                    warm_up(graph.replay, Timing())
                    us = sorted(_replays(graph, 40))[20] / 4 / layers * 1e3
                    rows.append((f"{m}x{n}x{k}", fillers, mode, how, us, floor))
                    print(f"{m}x{n}x{k} ({wbytes / 1e6:.1f} MB) fillers={fillers} {mode:6s} {how:4s}: "
                          f"{us:6.2f} us/layer (floor {floor:.2f}, {floor / us:.0%})", flush=True)
                except Exception as exc:  # noqa: BLE001 - a probe reports what does not run
                    print(f"{m}x{n}x{k} fillers={fillers} {mode} {how}: FAILED {exc!r}"[:300], flush=True)
    # the fillers alone, to see what the GEMM added
    x = torch.randn(16, 2048, device="cuda", dtype=torch.float16)
    graph = capture([lambda: [x.mul_(1.0001) for _ in range(3)]], 20)
    warm_up(graph.replay, Timing())
    print(f"3 small kernels alone: {sorted(_replays(graph, 40))[20] / 20 * 1e3:.2f} us", flush=True)


if __name__ == "__main__":
    main()
