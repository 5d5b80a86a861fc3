"""The example transformer block (scripts/example_model.py) on one GPU, in one run:

1. tune (or resume) its contraction workloads into a database, --trials per workload (sa search,
   rounds of 8);
2. per variant, in a subprocess with fresh TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, compile
   torch.compile(backend=tritune.compiler(db)), torch.compile() and torch.compile(mode="max-autotune")
   from a cold cache (time to the end of the first call), check the output against eager, then time
   it warmed up (triton.testing.do_bench medians, L2 flushed, under no_grad; eager timed in each
   subprocess too, to show drift between them);
3. the dispatch overhead of tritune.ops.matmul over launching the same Kernel directly (same tensors,
   a small problem so that the host side bounds both; median per call of many calls), with real
   launches and with the launch stubbed out (the Python path alone).

Prints a compact table last and writes DIR/model_bench.json.

    python scripts/model_bench.py --out DIR [--trials 32] [--hidden 4096] [--tokens 2048] [--dtype fp16]
    python scripts/model_bench.py --overhead-only   # no GPU needed: host path, interpreter, launch stubbed
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEVICE = "cuda"
VARIANTS = ("tritune", "default", "max-autotune")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="model-bench", help="directory for the database, caches and JSON")
    p.add_argument("--db", default=None, help="tuning database [default: OUT/tuning.db]")
    p.add_argument("--trials", type=int, default=32, help="trials per workload (a rerun resumes)")
    p.add_argument("--skip-tune", action="store_true", help="use the database as it is")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--child-timeout", type=float, default=300.0, help="seconds per variant subprocess")
    p.add_argument("--overhead-only", action="store_true", help="only measure the dispatch overhead")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: compile and time one variant
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_model(args: argparse.Namespace) -> tuple:
    """The block with seeded weights, and a seeded input, on the device, in the dtype."""
    import torch

    sys.path.insert(0, str(HERE))
    from example_model import Block

    from tritune.kernels.expr import torch_dtype

    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = Block(args.hidden, args.heads).to(torch_dtype(args.dtype)).eval()
        x = torch.randn(1, args.tokens, args.hidden, dtype=torch_dtype(args.dtype))
    return model, x


# ----- 1. tuning

def tune(args: argparse.Namespace, db_path: Path) -> list[dict]:
    """Extract the block's workloads and tune each with --trials (resuming what is stored)."""
    import torch

    from tritune.kernels.frontend.extract import extract_tasks
    from tritune.records.database import Database
    from tritune.tuner import tune_model
    from tritune.tuner.session import TuneOptions

    model, x = make_model(args)
    tasks = extract_tasks(model, (x,))
    del model, x
    torch.cuda.empty_cache()
    planned = tune_model.plan(tasks, args.trials * len(tasks), floor=args.trials)
    print("\n".join(f"task: {p.task.describe()}, {p.trials} trials" for p in planned), flush=True)
    with Database(db_path) as db:
        summaries = tune_model.tune_all(planned, db, TuneOptions(strategy="sa", seed=0, batch_size=8))
    return [{k: s.get(k) for k in ("workload", "count", "trials", "best_config", "best_median_ms",
                                    "final_ours_ms", "final_torch_ms", "ratio_vs_torch", "wall_s")} for s in summaries]


# ----- 2. one variant, in its own process

def child(args: argparse.Namespace) -> None:
    """Compile one variant from a cold cache, check it against eager, time it; write --child-json."""
    import torch
    from triton.testing import do_bench

    model, x = make_model(args)
    with torch.no_grad():
        ref = model(x)
        compiled, backend = _compile(model, args.child, args.db)
        torch.cuda.synchronize()
        start = time.perf_counter()
        y = compiled(x)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        err = ((y.double() - ref.double()).norm() / ref.double().norm()).item()
        times = {"variant": [], "eager": []}
        for _ in range(5):  # rounds alternate, so slow drift of the clock hits both alike
            times["variant"].append(do_bench(lambda: compiled(x), warmup=100, rep=300, return_mode="median"))
            times["eager"].append(do_bench(lambda: model(x), warmup=100, rep=300, return_mode="median"))
    result = {"variant": args.child, "compile_s": compile_s, "rel_error": err,
              "latency_ms": statistics.median(times["variant"]), "eager_ms": statistics.median(times["eager"]),
              "sites": backend.sites if backend else None}
    Path(args.child_json).write_text(json.dumps(result, indent=2))


def _compile(model, variant: str, db: str) -> tuple:
    """The compiled model, and the tritune backend (whose `sites` the first call fills) or None."""
    import torch

    import tritune

    if variant == "tritune":
        backend = tritune.compiler(db)
        return torch.compile(model, backend=backend), backend
    return (torch.compile(model) if variant == "default" else torch.compile(model, mode=variant)), None


def run_child(args: argparse.Namespace, variant: str, db_path: Path, out: Path) -> dict:
    """One variant in a subprocess with its own cold Inductor and Triton caches (outside --out, and
    removed afterwards: they are large)."""
    cache = Path(tempfile.mkdtemp(prefix=f"model_bench_{variant}_"))
    try:
        return _child_process(args, variant, db_path, out, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _child_process(args: argparse.Namespace, variant: str, db_path: Path, out: Path, cache: Path) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    result_path = out / f"variant_{variant}.json"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", variant, "--child-json", str(result_path), "--db", str(db_path),
           "--hidden", str(args.hidden), "--heads", str(args.heads), "--tokens", str(args.tokens),
           "--dtype", args.dtype]
    print(f"compiling and timing {variant} (cold caches in {cache})", flush=True)
    start = time.perf_counter()
    log = out / f"variant_{variant}.log"  # the subprocess's output, e.g. the backend's list of misses
    try:
        proc = subprocess.run(cmd, env=env, timeout=args.child_timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired as exc:
        # partial output; subprocess gives it as bytes here even in text mode
        log.write_bytes(b"".join(x if isinstance(x, bytes) else x.encode() for x in (exc.stdout, exc.stderr) if x))
        return {"variant": variant, "error": f"timed out after {args.child_timeout:.0f} s"}
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"variant": variant, "error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    return {**json.loads(result_path.read_text()), "process_s": time.perf_counter() - start}


# ----- 3. dispatch overhead

def dispatch_overhead(db_path: Path, stub: bool, calls: int = 2000, repeats: int = 15) -> dict:
    """Median µs per call of tritune.ops.matmul (a tuned record, found in an apply_history_best
    context) and of the same Kernel launched directly, on one small problem."""
    import torch

    from tritune.kernels import codegen, ops
    from tritune.kernels.contraction.launch import DEFAULT, Kernel, problem_of
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key
    from tritune.records.database import Database
    from tritune.records.dispatch import apply_history_best
    from tritune.records.result import MeasureResult, Status

    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(64, 64, dtype=torch.float16, device=device) for _ in range(2))
    out = torch.empty(64, 64, dtype=torch.float16, device=device)
    expr = ops.contraction_expr(a, b, ())
    with Database(db_path) as db:  # the op's exact workload, "tuned": the path a tuned model takes
        db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        db.save(expr.key, device_key(device_info(), "matmul"), [MeasureResult(DEFAULT, Status.OK, 1.0, 1.0, 1.0, 1.0)])
    launch = codegen.Launcher.__call__
    with apply_history_best(db_path):
        ops.matmul(a, b)
        choice = ops.explain(a, b)
        kernel = Kernel(choice.expr, choice.config, problem_of(choice.expr, a, b, out))
        kernel(a, b, out)
        if stub:
            codegen.Launcher.__call__ = lambda self, *args: None
        try:
            times = _alternate({"ops": lambda: ops.matmul(a, b), "direct": lambda: kernel(a, b, out)}, calls, repeats)
        finally:
            codegen.Launcher.__call__ = launch
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"launch": "stubbed" if stub else "real", "device": device, "ops_us": med["ops"], "source": choice.source,
            "direct_us": med["direct"], "overhead_us": med["ops"] - med["direct"]}


def _alternate(fns: dict, calls: int, repeats: int) -> dict[str, list[float]]:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            sync()
            times[name].append((time.perf_counter_ns() - start) / calls / 1e3)
    return times


# ----- report

def table(results: dict) -> str:
    """The compact final table: tuned workloads, then per variant compile time, latency, ratios,
    correctness and tuned call sites, then the dispatch overhead."""
    from tritune.kernels.contraction.expr import Matmul

    lines = [f"tuned {Matmul.from_dict(t['workload']).describe()} x{t['count']}: {t['trials']} trials, "
             f"{t['final_ours_ms']:.4f} ms vs torch {t['final_torch_ms']:.4f} ms ({t['ratio_vs_torch']:.3f}x)"
             for t in results.get("tuning", []) if t.get("final_ours_ms")]
    rows = {r["variant"]: r for r in results.get("variants", [])}
    head = f"{'variant':14s} {'compile s':>9s} {'latency ms':>10s} {'eager ms':>9s} {'rel err':>8s}  tuned sites"
    lines += [head] * bool(rows)
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"{name:14s} failed: {r['error']}")
            continue
        sites = r.get("sites")
        tuned = f"{sum(s == 'tuned' for _, s in sites)}/{len(sites)}" if sites is not None else "-"
        lines.append(f"{name:14s} {r['compile_s']:9.1f} {r['latency_ms']:10.3f} {r['eager_ms']:9.3f} "
                     f"{r['rel_error']:8.1e}  {tuned}")
    ours = rows.get("tritune", {})
    for other, lat_target, compile_target in (("default", 1.0, None), ("max-autotune", 1.02, 0.2)):
        theirs = rows.get(other, {})
        if "latency_ms" in ours and "latency_ms" in theirs:
            latency, build = ours["latency_ms"] / theirs["latency_ms"], ours["compile_s"] / theirs["compile_s"]
            lines.append(f"tritune / {other}: latency {latency:.3f}x (target <= {lat_target}), compile time "
                         f"{build:.2f}x" + (f" (target <= {compile_target})" if compile_target else ""))
    for o in results.get("overhead", []):
        lines.append(f"dispatch ({o['launch']} launch, {o['device']}): ops.matmul {o['ops_us']:.2f} us, Kernel "
                     f"{o['direct_us']:.2f} us per call: +{o['overhead_us']:.2f} us (target <= 5)")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.child:
        return child(args)
    import torch

    if not torch.cuda.is_available():
        if not args.overhead_only:
            print("model_bench: no CUDA GPU (torch.cuda.is_available() is False); --overhead-only runs without one",
                  file=sys.stderr)
            sys.exit(3)
        os.environ["TRITON_INTERPRET"] = "1"  # read when tritune is first imported, below
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db_path = Path(args.db) if args.db else out / "tuning.db"
    results: dict = {"args": vars(args), "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    if not args.overhead_only:
        start = time.perf_counter()
        results["tuning"] = [] if args.skip_tune else tune(args, db_path)
        results["tune_s"] = time.perf_counter() - start
        results["variants"] = [run_child(args, v, db_path, out) for v in args.variants.split(",")]
    results["overhead"] = [dispatch_overhead(out / "overhead.db", stub=True)]
    if torch.cuda.is_available():
        results["overhead"].append(dispatch_overhead(out / "overhead.db", stub=False))
    (out / "model_bench.json").write_text(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":  # the tuner's worker processes are spawned: they import this file too
    main()
