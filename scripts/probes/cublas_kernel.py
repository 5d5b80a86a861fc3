"""Which kernel torch.matmul (cuBLAS) runs for one matmul, with its launch geometry, from the
torch profiler: the name encodes cuBLAS's tile, stages, cluster shape and scheduling; the grid,
block, registers and shared memory say how it occupies the GPU. What tritune's template would
have to match.

Usage (on a GPU): python -m scripts.probes.cublas_kernel [--shape 4096] [--dtype fp16] [--calls 5]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tritune.kernels.family import family, parse_expr

FIELDS = ("grid", "block", "registers per thread", "shared memory", "blocks per SM", "warps per SM")


def kernels(fn, calls: int) -> list[dict]:
    """The GPU kernels `calls` calls of fn launch (after a warm-up), as chrome-trace events."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="4096")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args()
    expr = parse_expr("matmul", args.shape, args.dtype)
    fam = family(expr.op)
    events = kernels(fam.eager(expr, fam.inputs(expr, 0, "cuda")), args.calls)
    print(f"{expr.describe()} on {torch.cuda.get_device_name()}, torch {torch.__version__}: "
          f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs")
    for name in dict.fromkeys(e["name"] for e in events):
        mine = [e for e in events if e["name"] == name]
        durations = sorted(e["dur"] for e in mine)
        print(f"{name}\n  {len(mine)} launches, median {durations[len(durations) // 2]:.1f} us; "
              + ", ".join(f"{k}: {mine[0]['args'].get(k)}" for k in FIELDS))


if __name__ == "__main__":
    main()
