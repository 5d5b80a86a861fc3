"""Per-token time of transformers' `generate()` with a static KV cache, compiled as users compile it
(`compile_config=CompileConfig(...)`): Inductor (CompileConfig's default: `mode="reduce-overhead"`)
beside tritune (`CompileConfig(backend=tritune.compiler(db))`, the same mode), one model and decode
shape per run, every variant in this one process, timed in turns.

    python -m scripts.bench.generate_bench --model scripts/bench/decoders.py:llama --batch 16 \\
        --context 1024,4096 [--new-tokens 32] [--db DB] [--tune [--trials 256] [--check]] [--rounds 5] \\
        [--variants inductor,tritune] [--out FILE.json]

Contexts are measured in increasing order in this one process: generate() sizes a model's static
cache by the longest call it has made, so each context gets the cache it would alone; compiled code
is dropped between contexts (a changed cache length would otherwise recompile with dynamic shapes).

- per token: (time of generate() for 1 + N new tokens - time for 1) / N, greedy, `min_new_tokens`
  set, the same random prompt of CONTEXT tokens per sequence; medians over rounds, and the ratio
  of the two variants' times in the same round (`timing.paired_ratio`);
- GPU per token: the same difference of the GPU's busy time under torch's profiler; the rest of
  the wall time is the host's (generate()'s own loop, launches) and is reported as its share;
- floor: bytes of every weight and of the keys and values up to CONTEXT, read once, at the
  measured copy bandwidth (`timing.copy_bandwidth_gbps`);
- check: 32 steps teacher-forced (`decode.teacher_forced`), each variant's logits and its cache
  afterwards against eager's.

`--tune` first runs `tune-cli tune-model --decode BATCH,CONTEXT,N+1` into --db (without its
whole-model check unless `--check`): the decode step tuned is the one these generate() calls
compile (the cache as long as generate() makes it for CONTEXT and N+1 new tokens).
Each variant runs on its own copy of the model (generate() keeps one compiled call per model).
Without a GPU: one line on stderr, exit code 3.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tritune.tuner.model.decode import (DecodeShape, cache_bytes, cache_tensors, causal_lm, random_prompt,
                                        static_generate, teacher_forced)
from tritune.tuner.model.load import build, load_factory
from tritune.tuner.model.zoo import weight_bytes
from tritune.tuner.timing import busy_time, copy_bandwidth_gbps, gpu_spans, in_turns, paired_ratio
from tritune.tuner.worker.candidate import rel_error

VARIANTS = ("inductor", "tritune")
FORCED_STEPS = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a causal LM's factory: pkg.module:factory or file.py:factory")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--context", required=True, help="prompt tokens per sequence: one or more, comma-separated")
    p.add_argument("--new-tokens", type=int, default=32, help="N: the decode steps timed per generate() call")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--db", default="tuning.db")
    p.add_argument("--tune", action="store_true", help="tune the decode step first (tune-cli tune-model --decode)")
    p.add_argument("--trials", type=int, default=256)
    p.add_argument("--check", action="store_true", help="with --tune: tune-model's whole-model check too")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None, help="also write the results here (JSON)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke run of the script itself
    return p.parse_args(argv)


def tune(args: argparse.Namespace, context: int) -> dict:
    """tune-cli tune-model of the decode step these generate() calls compile; its wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", "tritune", "tune-model", "--model", args.model, "--dtype", args.dtype,
               "--decode", f"{args.batch},{context},{args.new_tokens + 1}", "--trials", str(args.trials),
               "--db", args.db, "--summary-json", str(summary), *([] if args.check else ["--no-check"])]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(done.stdout[-4000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
        row = {"tune_s": time.perf_counter() - start, "tune_exit": done.returncode}
        if summary.exists():  # each task's head-to-head, kept whole (the printed table is cut above)
            row["tasks"] = [_head_to_head(t) for t in json.loads(summary.read_text())["tasks"]]
    return row


def _head_to_head(task: dict) -> dict:
    """One tuned task's head-to-head from tune-model's summary: times, alternatives, GB/s."""
    keep = ("workload", "trials", "final_ours_ms", "alternatives_ms", "best_alternative",
            "ratio_vs_best_alternative", "bytes", "copy_gbps", "timed_as")
    return {k: task.get(k) for k in keep}


def compile_config(variant: str, db: str):
    """The CompileConfig a user passes to generate() for this variant."""
    from transformers import CompileConfig

    import tritune

    return CompileConfig() if variant == "inductor" else CompileConfig(backend=tritune.compiler(db))


class Variant:
    """One way to compile generate()'s decode step, on its own copy of the model."""

    def __init__(self, name: str, lm, db: str) -> None:
        self.name, self.lm, self.db, self.prompt, self.config = name, lm, db, None, None

    def generate(self, new: int):
        return static_generate(self.lm, self.prompt, new, self.config)

    def per_token_ms(self, new: int) -> float:
        """One round: (time of 1 + new tokens - time of 1) / new."""
        times = []
        for n in (1, 1 + new):
            _sync()
            start = time.perf_counter()
            self.generate(n)
            _sync()
            times.append(time.perf_counter() - start)
        return (times[1] - times[0]) * 1e3 / new

    def gpu_per_token_ms(self, new: int) -> float:
        """The GPU's busy time of 1 + new tokens less that of 1, per token (profiler)."""
        busy = [busy_time([(s, e) for s, e, _ in gpu_spans(lambda n=n: self.generate(n), 1)]) for n in (1, 1 + new)]
        return (busy[1] - busy[0]) / 1e3 / new


def forced_errors(variants: list[Variant], eager_lm, prompt, steps: int) -> dict:
    """Each variant's worst relative error of a step's logits, and of the cache after the steps,
    against eager's, over `steps` teacher-forced steps."""
    import torch

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, eager_lm.config.vocab_size, (prompt.shape[0], steps), generator=g).to(prompt.device)
    ref_logits, ref_cache = teacher_forced(eager_lm, prompt, tokens)
    upto = prompt.shape[1] + steps - 1  # the last forced token is never run through the model
    errors = {}
    for v in variants:
        logits, cache = teacher_forced(v.lm, prompt, tokens, v.config)
        errors[v.name] = {"logits": _worst(logits, ref_logits),
                          "cache": _worst(cache_tensors(cache, upto), cache_tensors(ref_cache, upto))}
    return errors


def _worst(outs: list, refs: list) -> float:
    """The largest relative error (the runner's `rel_error`) of a list of tensors against another."""
    return max(rel_error(o, r.double()) for o, r in zip(outs, refs))


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def models(args: argparse.Namespace) -> tuple:
    """The model (seeded random weights) and each variant's copy of it."""
    model, _ = build(load_factory(args.model), [], args.dtype, args.device, "random")
    base = causal_lm(model)
    return base, [Variant(name, copy.deepcopy(base), args.db) for name in args.variants.split(",")]


def measure(args: argparse.Namespace, context: int, base, variants: list[Variant]) -> dict:
    """Every variant compiled (first calls) for this context, checked, then timed in turns."""
    import torch

    shape = DecodeShape(args.batch, context, args.new_tokens + 1)
    prompt = random_prompt(base, shape)
    row = {"model": args.model, "batch": args.batch, "context": context, "new_tokens": args.new_tokens,
           "first_call_s": {}, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device}
    for v in variants:  # the database is read once tuned (a compiler opens it as it is made)
        v.prompt, v.config = prompt, compile_config(v.name, v.db)
        start = time.perf_counter()
        v.generate(1 + args.new_tokens)  # the largest call first: generate() keeps its cache length after it
        row["first_call_s"][v.name] = time.perf_counter() - start
        v.generate(1)
    row["cache_len"] = {v.name: int(v.lm._previous_max_cache_length) for v in variants
                        if hasattr(v.lm, "_previous_max_cache_length")}
    row["forced_error"] = forced_errors(variants, base, prompt, min(FORCED_STEPS, args.new_tokens))
    times = in_turns({v.name: (lambda v=v: v.per_token_ms(args.new_tokens)) for v in variants}, lambda f: f(),
                     args.rounds)
    row["per_token_ms"] = {name: statistics.median(t) for name, t in times.items()}
    if "inductor" in times and "tritune" in times:
        row["speedup"] = 1 / paired_ratio(times["tritune"], times["inductor"])
    row["gpu_per_token_ms"] = {v.name: v.gpu_per_token_ms(args.new_tokens) for v in variants}
    row["host_share"] = {n: 1 - row["gpu_per_token_ms"][n] / ms for n, ms in row["per_token_ms"].items()}
    row["weight_bytes"], row["cache_bytes"] = weight_bytes(base), cache_bytes(base, shape)
    row["copy_gbps"] = copy_bandwidth_gbps()
    row["floor_ms"] = (row["weight_bytes"] + row["cache_bytes"]) / (row["copy_gbps"] * 1e6)
    return row


def table(row: dict) -> str:
    """One line per variant: per-token wall and GPU ms, x floor, host share, errors."""
    lines = [f"{row['model']} batch {row['batch']} context {row['context']} (cache {row.get('cache_len')}), "
             f"floor {row['floor_ms']:.3f} ms ({(row['weight_bytes'] + row['cache_bytes']) / 1e6:.0f} MB at "
             f"{row['copy_gbps']:.0f} GB/s); tritune / inductor speed-up {row.get('speedup', float('nan')):.3f}x",
             "variant | ms/token | GPU ms/token | x floor (GPU) | host share | logits err | cache err | first call s"]
    for name, ms in row["per_token_ms"].items():
        gpu, err = row["gpu_per_token_ms"][name], row["forced_error"][name]
        lines.append(f"{name} | {ms:.3f} | {gpu:.3f} | {gpu / row['floor_ms']:.2f} | {row['host_share'][name]:.0%} | "
                     f"{err['logits']:.2e} | {err['cache']:.2e} | {row['first_call_s'][name]:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("generate_bench: no CUDA GPU here", file=sys.stderr)
        sys.exit(3)
    rows, (base, variants) = [], models(args)
    for context in sorted(int(c) for c in args.context.split(",")):
        torch._dynamo.reset()  # else the new cache length recompiles with dynamic shapes, as it would for a user
        row = tune(args, context) if args.tune else {}
        row.update(measure(args, context, base, variants))
        rows.append(row)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=2))
        print(table(row), flush=True)


if __name__ == "__main__":
    main()
