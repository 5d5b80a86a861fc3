"""Does programmatic dependent launch hide a weight-streaming kernel's ramp-up inside a CUDA graph?
A chain of skinny GEMMs y_i = x_{i-1} @ W_iᵀ (each reads the previous one's output, as a decode
step's projections do) over distinct weights spanning 2x the L2, captured in one graph, timed by
replays: plain launches against launches with the programmatic-dependence attribute, where each
kernel prefetches its weight slice into L2, waits for the previous kernel (`gdc_wait`) and lets the
next one start (`gdc_launch_dependents`). Also reports whether torch's Inductor has `enable_pdl`.

    python -m scripts.probes.pdl_probe [--model]
    python -m scripts.probes.pdl_probe --db TUNED.db --models llama,gpt2 [--batch 16] [--force-pdl 1,2:128,2:128:last]
        (the backend's early launches: as tuned, none, every contraction at the PDL values given)
"""
from __future__ import annotations

import contextlib
import json
import sys

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def chain_gemm(X, W, Y, M, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
               PDL: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    if PREFETCH:
        # one 128-byte line per pointer: the program's whole weight slice into L2
        lines = tl.arange(0, BLOCK_N)[:, None] * K + tl.arange(0, 4096 // 64)[None, :] * 64
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [W + pid * BLOCK_N * K + lines],
                                  dtype=tl.int32, is_pure=False, pack=1)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    rm = tl.arange(0, 16)
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=4):
        rk = k + tl.arange(0, BLOCK_K)
        a = tl.load(X + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(W + rn[None, :] * K + rk[:, None])
        acc = tl.dot(a, b, acc)
    tl.store(Y + rm[:, None] * N + rn[None, :], acc.to(Y.dtype.element_ty), mask=rm[:, None] < M)
'''


def main() -> None:
    import torch
    import torch._inductor.config as ic

    from tritune.tuner.timing import (
        Timing,
        _replays,  # a probe reads the replay timer directly
        capture,
        copy_bandwidth_gbps,
        warm_up,
    )
    print("inductor enable_pdl:", getattr(ic.triton, "enable_pdl", "absent"), "torch", torch.__version__)
    from tritune.kernels.codegen import load_source

    chain_gemm = load_source(SOURCE, "chain_gemm")
    gbps = copy_bandwidth_gbps()
    for m, d in ((16, 2048), (1, 2048), (16, 4096)):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        layers = max(8, 2 * l2 // (d * d * 2))
        ws = [torch.randn(d, d, device="cuda", dtype=torch.float16) / d**0.5 for _ in range(layers)]
        xs = [torch.randn(m, d, device="cuda", dtype=torch.float16) for _ in range(layers + 1)]
        ref = xs[0]
        for w in ws:
            ref = (ref.float() @ w.float().t()).half()
        floor_us = layers * d * d * 2 / gbps / 1e3
        for block_n in (16, 32):
            for prefetch, pdl in ((0, 0), (0, 1), (1, 1)):
                def step(bn=block_n, pf=prefetch, p=pdl, ws=ws, xs=xs, m=m, d=d):
                    for i, w in enumerate(ws):
                        chain_gemm[(d // bn,)](xs[i], w, xs[i + 1], m, d, d, BLOCK_N=bn, BLOCK_K=128,
                                                   PREFETCH=pf, PDL=p, num_warps=4, launch_pdl=bool(p))
                try:
                    graph = capture([step], 4)
                    warm_up(graph.replay, Timing())
                    ms = sorted(_replays(graph, 50))[25] / 4
                    err = float((xs[-1].float() - ref.float()).norm() / ref.float().norm())
                    print(f"M={m} d={d} x{layers} BLOCK_N={block_n} prefetch={prefetch} pdl={pdl}: "
                          f"{ms * 1e3 / layers:.2f} us/layer, floor {floor_us / layers:.2f}, "
                          f"{floor_us / (ms * 1e3):.0%} of copy BW; rel err {err:.1e}", flush=True)
                except Exception as exc:  # noqa: BLE001 - a probe reports what does not run
                    print(f"M={m} d={d} BLOCK_N={block_n} prefetch={prefetch} pdl={pdl}: FAILED {exc!r}"[:300])


def inductor_pdl() -> None:
    """Inductor reduce-overhead on the zoo llama at decode (batch 16), its PDL codegen off and on:
    wall ms per step (calls back to back) and profiler GPU ms."""
    import torch
    import torch._inductor.config as ic

    from tritune.tuner.model.zoo import llama
    from tritune.tuner.timing import gpu_ms_per_call, in_turns, per_call_ms, step_caller

    model = llama().cuda().half().eval()
    x = torch.randn(16, 1, 2048, device="cuda", dtype=torch.float16)
    fns = {}
    for pdl in (False, True):
        torch._dynamo.reset()
        with ic.patch({"triton.enable_pdl": pdl}), torch.no_grad():
            compiled = torch.compile(model, mode="reduce-overhead")
            fn = step_caller(compiled, [x], True)
            for _ in range(3):
                fn()
        fns[f"pdl={pdl}"] = fn
    with torch.no_grad():
        times = in_turns(fns, per_call_ms, 20)
        for name, fn in fns.items():
            print(f"llama decode 16, Inductor reduce-overhead {name}: wall {sorted(times[name])[10]:.4f} ms, "
                  f"GPU {gpu_ms_per_call(fn):.4f} ms", flush=True)


def tuned_pdl(db: str, models: list[str], rounds: int = 10, batch: int = 16, forced: tuple[str, ...] = ()) -> None:
    """Zoo decoders at decode compiled by the tritune backend in its CUDA-graph mode from a tuned
    database, two ways: sites launched as tuned (`early_launch=True`) and none early (False); and
    for each way in `forced` (`_sites_at_pdl`), every contraction site launched that way.
    Timed in turns: ms per step of steps back to back (GPU-bound when the GPU's step is longer
    than the host's); then per way, under the profiler, the sum of kernel times, the GPU's busy
    time and the span of a step, and one step's timeline (each kernel's start, length, and the
    idle gap before it)."""
    import inspect
    import statistics

    import torch

    import tritune
    from tritune.tuner.model import zoo
    from tritune.tuner.timing import in_turns, per_call_ms, step_caller

    for name in models:
        factory = getattr(zoo, name)
        hidden = inspect.signature(factory).parameters["hidden"].default
        model = factory().cuda().half().eval()
        x = torch.randn(batch, 1, hidden, device="cuda", dtype=torch.float16)
        fns = {}
        for way, early, pdl in [("early=True", True, None), ("early=False", False, None),
                                *((f"every contraction PDL={p}", True, p) for p in forced)]:
            torch._dynamo.reset()
            with torch.no_grad(), _sites_at_pdl(pdl):
                backend = tritune.compiler(db, mode="reduce-overhead", early_launch=early)
                fns[way] = step_caller(torch.compile(model, backend=backend), [x], True)
                for _ in range(3):
                    fns[way]()
        with torch.no_grad():
            times = in_turns(fns, per_call_ms, rounds)
            for way, fn in fns.items():
                print(f"{name} decode {batch}, tritune-ro {way}: steps back to back "
                      f"{statistics.median(times[way]) * 1e3:.1f} us; " + timeline(fn), flush=True)


@contextlib.contextmanager
def _sites_at_pdl(way: str | None):
    """While compiling: every contraction site's tuned config launched as `way` says (None: as
    tuned): "P" (PDL=P), "2:K" (PDL=2, its prefetch reaching K elements along K) or "2:K:last"
    (the same, asking the L2 to keep the prefetched lines: `evict_last`)."""
    from tritune.kernels.contraction import launch
    from tritune.kernels.contraction import template as contraction
    from tritune.kernels.frontend import compiler
    from tritune.kernels.gated import launch as gated_launch
    from tritune.kernels.gated import template as gated

    saved = compiler.rewrite, launch.pdl_constexprs, contraction._TEMPLATE, gated._TEMPLATE
    pdl, reach, last = ([*way.split(":"), "", ""][:3]) if way else (None, "", "")

    def forced(gm, hits, *args):
        def at(spec: str) -> str:
            data = json.loads(spec)
            if data["expr"].get("op") != "attention":  # PDL_K and EVICT_LAST only set the sites apart
                data["config"].update(PDL=int(pdl), PDL_K=int(reach or 0), EVICT_LAST=int(bool(last)))
            return json.dumps(data, sort_keys=True, separators=(",", ":"))
        return saved[0](gm, [(m, at(spec)) for m, spec in hits], *args)

    def constexprs(config):
        found = saved[1](config)
        return {**found, "PDL_K": config.get("PDL_K") or found["PDL_K"]} if found["PDL"] == 2 else found

    if way:
        compiler.rewrite = forced
        launch.pdl_constexprs = gated_launch.pdl_constexprs = constexprs
        if last:
            hint = ("prefetch.global.L2 [$1];", "prefetch.global.L2::evict_last [$1];")
            contraction._TEMPLATE, gated._TEMPLATE = (t.replace(*hint) for t in saved[2:])
    try:
        yield
    finally:
        compiler.rewrite, launch.pdl_constexprs, contraction._TEMPLATE, gated._TEMPLATE = saved
        gated_launch.pdl_constexprs = saved[1]


def timeline(fn, calls: int = 20) -> str:
    """Under the profiler, `calls` calls of `fn`: per call the sum of kernel times, the busy time,
    and the span; then the middle call's kernels (start from its first, length, gap before)."""
    from tritune.tuner.timing import busy_time, gpu_spans

    events = gpu_spans(fn, calls)
    per_call = len(events) // calls
    spans = [(s, e) for s, e, _ in events]
    total = events[-1][1] - events[0][0]
    lines = [f"kernels {sum(e - s for s, e in spans) / calls:.1f}, busy {busy_time(spans) / calls:.1f}, "
             f"span {total / calls:.1f} us per step ({per_call} kernels)"]
    step = events[per_call * (calls // 2):per_call * (calls // 2 + 1)]
    reach = events[per_call * (calls // 2) - 1][1]
    for s, e, kernel in step:
        lines.append(f"    {s - step[0][0]:7.1f} {e - s:6.1f} gap {s - reach:5.1f}  {kernel[:70]}")
        reach = max(reach, e)
    return "\n".join(lines)


if __name__ == "__main__":
    if "--db" in sys.argv:
        tuned_pdl(sys.argv[sys.argv.index("--db") + 1], sys.argv[sys.argv.index("--models") + 1].split(","),
                  batch=int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 16,
                  forced=tuple(sys.argv[sys.argv.index("--force-pdl") + 1].split(","))
                  if "--force-pdl" in sys.argv else ())
        sys.exit(0)
    main()
    if "--model" in sys.argv:
        inductor_pdl()
