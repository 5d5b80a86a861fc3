"""Does Inductor's combo kernel (independent small kernels launched as one) shorten a decode step
that the tritune backend replays from one CUDA graph? A zoo model at a decode shape, compiled from
a tuned database three ways in one process: Inductor reduce-overhead, tritune-ro, and tritune-ro
with `combo_kernels` on in its lowering; each checked against tritune-ro's output, profiled (GPU µs
and launches per step, the costliest kernels) and timed in turns (µs per step back to back).

    python -m scripts.probes.combo_probe --db TUNED.db --models llama --shapes decode1,decode [--rounds 8]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

VARIANTS = ("reduce-overhead", "tritune-ro", "tritune-ro+combo")


def one_shape(db: str, model_name: str, shape: str, rounds: int) -> None:
    import torch
    import torch._inductor.config as inductor_config

    from scripts.bench.bench_children import caller, compile_variant, kernel_profile, model_and_input
    from tritune.tuner.model.check import outputs_rel_error
    from tritune.tuner.timing import in_turns, per_call_ms

    args = argparse.Namespace(models=[model_name], shapes=[shape], hidden=None, dtype="fp16", device="cuda")
    model, x = model_and_input(args)
    fns, outs = {}, {}
    for variant in VARIANTS:
        combo = inductor_config.patch(combo_kernels=True) if variant.endswith("combo") else contextlib.nullcontext()
        compiled, _ = compile_variant(model, variant.split("+")[0], db)
        fns[variant] = caller(compiled, x, "tritune-ro")
        with combo:  # the first calls compile (and capture)
            for _ in range(3):
                outs[variant] = fns[variant]().clone()
    torch.cuda.synchronize()
    for variant in VARIANTS:
        prof = kernel_profile(fns[variant], calls=20, top=12)
        err = outputs_rel_error(outs[variant], outs["tritune-ro"])
        print(f"{model_name}/{shape} {variant}: {prof['gpu_us']:.1f} GPU us, {prof['launches']:.0f} launches, "
              f"rel diff to tritune-ro {err:.1e}")
        for name, us, count in prof["top"]:
            print(f"    {us:6.1f} us x{count:.0f} {name}")
    times = in_turns(fns, per_call_ms, rounds)
    line = ", ".join(f"{v} {statistics.median(t) * 1000:.1f}" for v, t in times.items())
    print(f"SUMMARY {model_name}/{shape} us per step (median of {rounds} rounds): {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--models", default="llama")
    parser.add_argument("--shapes", default="decode1,decode")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    import torch

    with torch.no_grad():
        for model_name in args.models.split(","):
            for shape in args.shapes.split(","):
                one_shape(args.db, model_name, shape, args.rounds)


if __name__ == "__main__":
    main()
