"""The fusion targets on a GPU: fused blocks alone, tritune's tuned fusion against Inductor's
default and max-autotune, timed in turns; then the zoo decoders through scripts.bench.model_bench.

    python -m scripts.bench.fusion_bench --out DIR [--blocks gated,gelu,residual,qkv] [--phases tune,latency,models]
            [--trials 192] [--rounds 15] [--dtype fp16] [--models llama,gpt2] [--device cuda|cpu]

Blocks (also factories for `tune-cli tune-model --model scripts/bench/fusion_bench.py:gated_block ...`):
- gated: silu(x @ Wgᵀ) * (x @ Wuᵀ), x [2048, 2048], Wg and Wu [8192, 2048] (target: >= 1.15x
  Inductor default, >= 1.10x max-autotune);
- gelu: GPT-2's MLP up-projection, gelu_new(x @ W + b) with its GELU written as pointwise ops,
  x [2048, 1024], W [1024, 4096] as Conv1D stores it;
- residual: x + h @ Wᵀ, a down projection and the residual add after it, h [2048, 4096] -> 1024;
- qkv: Llama's q, k and v projections of x [2048, 2048] (q 2048 wide, k and v 512): one wide
  kernel against three cuBLAS calls.

Phases, each merging its results into DIR/fusion_bench.json:
- tune: `python -m tritune tune-model` per block into --db [DIR/tuning.db] (--trials each; a rerun
  resumes), log in DIR/tune_BLOCK.log;
- latency: per block, eager, Inductor's default, max-autotune (without CUDA graphs: one block's
  kernels alike), tritune (backend=tritune.compiler(db): each site's verdict decides) and kernel
  (the best tuned kernel of each site even where the library won: what the kernels must beat),
  compiled in this process and timed in turns (`tritune.tuner.timing.in_turns`, each round ~10 ms
  of calls back to back), --rounds rounds; a speed-up is the median over rounds of the other's
  time over ours in the same round;
- models: scripts.bench.model_bench --phases tune,latency --shapes prefill for --models into
  DIR/models with the same database; the decoder targets read from its rounds (llama: >= 1.05x
  default, >= 1.03x max-autotune; gpt2: >= 1.03x default).

--device cpu runs the latency phase at small sizes under Triton's interpreter (fp32, no
max-autotune), each site's workload stored with its default config: a check of this script and
of the replay, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve()
BLOCKS = ("gated", "gelu", "residual", "qkv")
PHASES = ("tune", "latency", "models")
VARIANTS = ("eager", "default", "max-autotune", "tritune", "kernel")
SIZES = {"cuda": {"tokens": 2048, "gated": (2048, 8192), "gelu": (1024, 4096), "residual": (4096, 1024),
                  "qkv": (2048, 512)},
         "cpu": {"tokens": 33, "gated": (40, 72), "gelu": (24, 56), "residual": (56, 24), "qkv": (40, 16)}}
# (what, ours, theirs, at least this speed-up): the fusion targets
TARGETS = (("gated", "tritune", "default", 1.15), ("gated", "tritune", "max-autotune", 1.10),
           ("llama/prefill", "tritune", "default", 1.05), ("llama/prefill", "tritune", "max-autotune", 1.03),
           ("gpt2/prefill", "tritune", "default", 1.03))


def blocks():
    """The block modules (torch imported only when a block is built)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class GatedBlock(nn.Module):
        """silu(x @ Wgᵀ) * (x @ Wuᵀ): the first half of Llama's MLP."""

        def __init__(self, hidden: int, inner: int) -> None:
            super().__init__()
            self.gate, self.up = nn.Linear(hidden, inner, bias=False), nn.Linear(hidden, inner, bias=False)

        def forward(self, x):
            return F.silu(self.gate(x)) * self.up(x)

    class GeluBlock(nn.Module):
        """gelu_new(x @ W + b) as GPT-2 writes it, W [K, N] as its Conv1D stores it."""

        def __init__(self, hidden: int, inner: int) -> None:
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.randn(hidden, inner) * 0.02), nn.Parameter(torch.zeros(inner))

        def forward(self, x):
            h = torch.addmm(self.bias, x, self.weight)
            return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))

    class ResidualBlock(nn.Module):
        """x + h @ Wᵀ: a down projection and the residual add after it."""

        def __init__(self, inner: int, hidden: int) -> None:
            super().__init__()
            self.down = nn.Linear(inner, hidden, bias=False)

        def forward(self, x, h):
            return x + self.down(h)

    class QkvBlock(nn.Module):
        """x @ Wqᵀ, x @ Wkᵀ, x @ Wvᵀ: Llama's attention projections (grouped-query: k and v narrower)."""

        def __init__(self, hidden: int, kv: int) -> None:
            super().__init__()
            self.q = nn.Linear(hidden, hidden, bias=False)
            self.k, self.v = nn.Linear(hidden, kv, bias=False), nn.Linear(hidden, kv, bias=False)

        def forward(self, x):
            return self.q(x), self.k(x), self.v(x)

    return {"gated": GatedBlock, "gelu": GeluBlock, "residual": ResidualBlock, "qkv": QkvBlock}


def input_shapes(block: str, device: str) -> list[tuple[int, ...]]:
    """The block's input shapes at the device's sizes."""
    sizes = SIZES[device]
    a, b = sizes[block]
    return [(sizes["tokens"], b), (sizes["tokens"], a)] if block == "residual" else [(sizes["tokens"], a)]


def gated_block():
    """`--model scripts/bench/fusion_bench.py:gated_block --input-shape 2048,2048`."""
    return blocks()["gated"](*SIZES["cuda"]["gated"])


def gelu_block():
    """`--model scripts/bench/fusion_bench.py:gelu_block --input-shape 2048,1024`."""
    return blocks()["gelu"](*SIZES["cuda"]["gelu"])


def qkv_block():
    """`--model scripts/bench/fusion_bench.py:qkv_block --input-shape 2048,2048`."""
    return blocks()["qkv"](*SIZES["cuda"]["qkv"])


def residual_block():
    """`--model scripts/bench/fusion_bench.py:residual_block --input-shape 2048,1024 --input-shape 2048,4096`."""
    return blocks()["residual"](*SIZES["cuda"]["residual"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the database, logs and fusion_bench.json")
    p.add_argument("--blocks", default=",".join(BLOCKS), help="comma-separated: " + ", ".join(BLOCKS))
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated: " + ", ".join(PHASES))
    p.add_argument("--db", default=None, help="tuning database [default: OUT/tuning.db]")
    p.add_argument("--trials", type=int, default=192, help="tune-model trials per block")
    p.add_argument("--rounds", type=int, default=15, help="latency rounds (each times every variant once)")
    p.add_argument("--dtype", default=None, choices=("fp16", "bf16", "fp32"), help="[fp16; fp32 with --device cpu]")
    p.add_argument("--models", default="llama,gpt2", help="zoo models for the models phase")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = p.parse_args(argv)
    for name, known in (("blocks", BLOCKS), ("phases", PHASES)):
        values = [v for v in getattr(args, name).split(",") if v]
        if not values or set(values) - set(known):
            p.error(f"--{name}: comma-separated names of {', '.join(known)}")
        setattr(args, name, values)
    args.dtype = args.dtype or ("fp32" if args.device == "cpu" else "fp16")
    if args.device == "cpu" and set(args.phases) - {"latency"}:
        p.error("--device cpu runs the latency phase only (--phases latency)")
    return args


def phase_tune(args: argparse.Namespace, out: Path, results: dict) -> None:
    """tune-model per block (its whole-model check is the latency phase here)."""
    for block in args.blocks:
        log, summary = out / f"tune_{block}.log", out / f"tune_{block}.json"
        shapes = [arg for s in input_shapes(block, "cuda") for arg in ("--input-shape", ",".join(map(str, s)))]
        cmd = [sys.executable, "-m", "tritune", "tune-model", "--model", f"{HERE}:{block}_block",
               *shapes, "--dtype", args.dtype, "--trials", str(args.trials), "--no-check", "--db", args.db,
               "--summary-json", str(summary)]
        with open(log, "w") as fp:
            rc = subprocess.call(cmd, stdout=fp, stderr=subprocess.STDOUT)
        tasks = json.loads(summary.read_text()).get("tasks", []) if summary.exists() else []
        results.setdefault("tune", {})[block] = {"exit": rc, "tasks": tasks, "log": str(log)}
        print(f"tune {block}: exit {rc}, " + "; ".join(_task_line(t) for t in tasks), flush=True)
        save(out, results)


def _task_line(t: dict) -> str:
    best = t.get("best_config") or {}
    won = f"library {best['library']}" if best.get("library") else "tritune kernel"
    ratio = t.get("ratio_vs_best_alternative", 0)
    return f"{t['workload'].get('op')} best {won}, {ratio:.3f}x {t.get('best_alternative')}"


def phase_latency(args: argparse.Namespace, out: Path, results: dict) -> None:
    """Each block's variants compiled here and timed in turns."""
    import torch

    for block in args.blocks:
        torch._dynamo.reset()
        r = time_block(args, block, out)
        results.setdefault("latency", {})[block] = r
        times = (f"{k} {v['ms']:.4f} ms" if "ms" in v else f"{k} failed ({v.get('error')})" for k, v in r.items())
        print(f"latency {block}: " + ", ".join(times), flush=True)
        save(out, results)


def build(args: argparse.Namespace, block: str) -> tuple:
    """The block (seeded random weights, eval, in --dtype on --device) and its seeded inputs."""
    from tritune.tuner.model import load

    factory = partial(blocks()[block], *SIZES[args.device][block])
    return load.build(factory, input_shapes(block, args.device), args.dtype, args.device, weights="random")


def time_block(args: argparse.Namespace, block: str, out: Path) -> dict:
    """Every variant of one block: rel error against eager, the backend's sites, ms, per-round times."""
    import torch

    import tritune
    from scripts.bench.bench_children import seed_defaults
    from tritune.errors import first_line
    from tritune.tuner.model.check import outputs_rel_error
    from tritune.tuner.timing import in_turns, per_call_ms

    model, x = build(args, block)
    with torch.no_grad():
        ref = model(*x)
        if args.device == "cpu":
            seed_defaults(tritune.extract_tasks(model, x), args.db)
        kernels = kernel_db(args.db, out / f"kernels_{block}.db")
        fns, rows = {}, {}
        for variant in VARIANTS if args.device == "cuda" else ("eager", "default", "tritune", "kernel"):
            try:
                fn, backend = compiled(model, variant, args.db, kernels)
                y = fn(*x)
                fns[variant] = lambda fn=fn: fn(*x)
                rows[variant] = {"rel_err": outputs_rel_error(y, ref), "sites": backend.sites if backend else None}
            except Exception as exc:  # noqa: BLE001 - one variant that fails must not cost the others
                rows[variant] = {"error": first_line(exc)}
        for name, times in in_turns(fns, per_call_ms, args.rounds).items():
            rows[name]["rounds_ms"] = times
    for row in rows.values():
        if row.get("rounds_ms"):
            row["ms"] = sorted(row["rounds_ms"])[len(row["rounds_ms"]) // 2]
    return rows


def compiled(model, variant: str, db: str, kernels: str) -> tuple:
    """The variant's callable, and the tritune backend (its sites) or None."""
    import torch

    import tritune

    if variant == "eager":
        return model, None
    if variant in ("default", "max-autotune"):
        return torch.compile(model, mode=None if variant == "default" else "max-autotune-no-cudagraphs"), None
    backend = tritune.compiler(db if variant == "tritune" else kernels)
    return torch.compile(model, backend=backend, fullgraph=True), backend


def kernel_db(db: str, path: Path) -> str:
    """A database holding, for every workload of `db` on this GPU, its fastest tritune kernel only."""
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key
    from tritune.records.database import Database

    path.unlink(missing_ok=True)
    with Database(db) as src, Database(path) as dst:
        for key, op, dtype, spec in src.workloads():
            device = device_key(device_info(), op)
            kernels = [r for r in src.trials(key, device) if r.ok and r.config.library is None]
            if kernels:
                dst.add_workload(key, op, dtype, spec)
                dst.save(key, device, [min(kernels, key=lambda r: r.t_median)])
    return str(path)


def phase_models(args: argparse.Namespace, out: Path, results: dict) -> None:
    """model_bench's tune and latency phases at the prefill shape, sharing the database."""
    cmd = [sys.executable, "-m", "scripts.bench.model_bench", "--out", str(out / "models"), "--models", args.models,
           "--shapes", "prefill", "--phases", "tune,latency", "--db", args.db, "--dtype", args.dtype,
           "--rounds", str(args.rounds)]
    rc = subprocess.call(cmd, cwd=HERE.parents[2])  # the repository's root
    bench_json = out / "models" / "model_bench.json"
    latency = json.loads(bench_json.read_text()).get("latency", {}) if bench_json.exists() else {}
    results["models"] = {"exit": rc, "latency": {k: v.get("variants", {}) for k, v in latency.items()}}
    save(out, results)


def speedup(rows: dict, ours: str, theirs: str) -> float | None:
    """theirs / ours, the median over rounds of the two times taken in the same round."""
    from tritune.tuner.timing import paired_ratio

    a, b = rows.get(ours, {}).get("rounds_ms"), rows.get(theirs, {}).get("rounds_ms")
    return 1 / paired_ratio(a, b) if a and b else None


def report(results: dict, targets: bool = True) -> str:
    """Every block's speed-ups over Inductor's variants, then the targets (not for CPU numbers)."""
    lines = []
    for block, rows in results.get("latency", {}).items():
        for ours in ("tritune", "kernel"):
            ratios = {t: speedup(rows, ours, t) for t in ("eager", "default", "max-autotune")}
            row = rows.get(ours, {})
            sites, err = row.get("sites"), row.get("rel_err")
            lines.append(f"{block} {ours}: " + ", ".join(f"{r:.3f}x {t}" for t, r in ratios.items() if r)
                         + (f"; rel err {err:.1e}" if err is not None else f"; {row.get('error', 'not run')}")
                         + (f"; sites {sorted({k for _, k in sites})}" if sites else ""))
    for what, ours, theirs, target in TARGETS if targets else ():
        rows = results.get("latency", {}).get(what) or results.get("models", {}).get("latency", {}).get(what, {})
        got = speedup(rows, ours, theirs)
        verdict = "not measured" if got is None else f"{got:.3f}x ({'met' if got >= target else 'MISSED'})"
        lines.append(f"target {what}: {ours} >= {target:.2f}x {theirs}: {verdict}")
    return "\n".join(lines)


def save(out: Path, results: dict) -> None:
    (out / "fusion_bench.json.tmp").write_text(json.dumps(results, indent=2))
    os.replace(out / "fusion_bench.json.tmp", out / "fusion_bench.json")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.db = str(Path(args.db or out / "tuning.db").resolve())
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when tritune is first imported: before any of it
    elif not _has_gpu():
        sys.exit("fusion_bench: no CUDA device (use --device cpu for the interpreter's check)")
    path = out / "fusion_bench.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for phase in args.phases:
        {"tune": phase_tune, "latency": phase_latency, "models": phase_models}[phase](args, out, results)
    print(report(results, targets=args.device == "cuda"))


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
