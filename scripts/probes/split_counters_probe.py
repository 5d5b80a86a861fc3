"""What zeroing split sites' arrival counters in every replay costs a CUDA-graph decode step: zoo
decoders compiled by the tritune backend in its CUDA-graph mode from a tuned database, two ways in
one process: as shipped (split sites call their op's opaque twin, whose counters the capture zeroes
once) and as before (split sites traced into Inductor's code, which zeroes their counters in every
replay). Timed in turns (µs per step of steps back to back), then each way's kernels, busy time
and one step's timeline under the profiler (`pdl_probe.timeline`).

    python -m scripts.probes.split_counters_probe --db TUNED.db --models llama,qwen2 [--batch 16] [--rounds 10]
"""
from __future__ import annotations

import argparse
import inspect
import statistics
from contextlib import contextmanager, nullcontext
from typing import Iterator

from scripts.probes.pdl_probe import timeline


@contextmanager
def zeroed_per_replay() -> Iterator[None]:
    """While open, compiled graphs trace split sites into Inductor's code, as before the twin took
    them (PDL sites keep their twin)."""
    from tritune.kernels.frontend.tuned_op import SiteKind

    shipped = SiteKind.op_for

    def traced(self, spec, captured, early=False):
        import json

        pdl = json.loads(spec)["config"].get("PDL", 0)
        return shipped(self, spec, captured, early) if pdl else self.op
    SiteKind.op_for = traced
    try:
        yield
    finally:
        SiteKind.op_for = shipped


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    p.add_argument("--models", default="llama")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()

    import torch

    import tritune
    from tritune.tuner.model import zoo
    from tritune.tuner.timing import in_turns, per_call_ms, step_caller

    for name in args.models.split(","):
        factory = getattr(zoo, name)
        hidden = inspect.signature(factory).parameters["hidden"].default
        model = factory().cuda().half().eval()
        x = torch.randn(args.batch, 1, hidden, device="cuda", dtype=torch.float16)
        fns, sites = {}, {}
        for way in ("zeroed once", "zeroed per replay"):
            torch._dynamo.reset()
            with torch.no_grad(), (zeroed_per_replay() if way == "zeroed per replay" else nullcontext()):
                backend = tritune.compiler(args.db, mode="reduce-overhead")
                fns[way] = step_caller(torch.compile(model, backend=backend), [x], True)
                for _ in range(3):  # warm-up, capture: the rewrite happens in here
                    fns[way]()
            sites[way] = sum(kind == "tuned" for _, kind in backend.sites)
        with torch.no_grad():
            outs = [fn().float() for fn in fns.values()]
            apart = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()  # split sums may add in another order
            times = in_turns(fns, per_call_ms, args.rounds)
            for way, fn in fns.items():
                print(f"{name} decode {args.batch}, tritune-ro, counters {way} ({sites[way]} tuned sites, outputs "
                      f"{apart:.1e} apart): steps back to back "
                      f"{statistics.median(times[way]) * 1e3:.1f} us; " + timeline(fn), flush=True)


if __name__ == "__main__":
    main()
