"""Never slower than torch.compile: the zoo's architectures (tritune/tuner/model/zoo.py, random weights) at a
prefill shape (1, 2048, hidden) and two cache-less decode shapes, 16 sequences (`decode`: 16, 1, hidden) and
one (`decode1`: 1, 1, hidden); Inductor's default, max-autotune and reduce-overhead against tritune's
backend, alone and over CUDA graphs. The decode shapes here are steps without a KV cache (each token
attends to itself alone): decode as transformers' generate() runs it, with a static cache of a real
context, is scripts/bench/generate_bench.py's.

    python -m scripts.bench.model_bench --out DIR [--models llama,gpt2,qwen2,neox,bert]
            [--shapes prefill,decode,decode1] [--phases tune,compile,latency,overhead,profile]
            [--db PATH] [--dtype fp16] [--rounds 40]
            [--variants LIST] [--device cuda] [--hidden N] [--child-timeout 300] [--pack FILE.tar.gz]

Variants: default, max-autotune, reduce-overhead (torch.compile's modes), tritune
(backend=tritune.compiler(db)) and tritune-ro (tritune.compiler(db, mode="reduce-overhead")); only with --variants, route and
route-ro take tritune's path into Inductor and replace nothing, sites and sites-ro ignore graph verdicts.
Each phase runs on its own and merges its results into DIR/model_bench.json:

- tune: `python -m tritune tune-model` per model and shape into --db [DIR/tuning.db] (a rerun
  resumes); output in DIR/tune_MODEL_SHAPE.log;
- compile: a subprocess per model, shape and variant [prefill: default, max-autotune, tritune;
  decode: default, reduce-overhead, tritune-ro], with empty Inductor and Triton caches: seconds
  from torch.compile to the end of the first call, error against eager, the backend's sites;
- latency: a subprocess per model and shape compiles its variants [all; at decode not
  max-autotune] and times them and eager in turns (`tritune.tuner.timing.in_turns`), --rounds
  rounds (in each, every variant's mean over ~10 ms of calls back to back, in a shuffled order);
  a ratio is the median over rounds of the two variants' times in the same round (the host's
  speed changes between rounds); it replaces that model and shape's earlier entry;
- overhead: µs per call of a 64x64x64 matmul replayed by tritune and as Inductor's own Triton
  template (15 rounds in turns, each ~0.15 s of calls back to back; medians);
- profile: a subprocess per model and shape runs each variant 20 times under torch's profiler:
  GPU µs and kernels per call, and the costliest kernels; it also records the bytes of the weights
  one step reads (`zoo.weight_bytes`), the device's copy bandwidth (`timing.copy_bandwidth_gbps`,
  measured there) and their ratio, the floor of a decode step (`floor_us`).

The final table comes last (scripts/bench/model_table.py): at decode it gives each variant's GPU
time per step as a multiple of the floor, and the ratios' geometric mean over the decode rows.
Without a GPU (and --device cuda): one line on stderr, exit code 3.
What the subprocesses run is in scripts/bench/bench_children.py.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.bench_children import SHAPES, VARIANTS, hidden_of, is_decode
from scripts.bench.model_table import counts, floor_us, overhead_line, report
from tritune.tuner.timing import paired_ratio

ROOT = Path(__file__).resolve().parents[2]  # the repository: the children run there
MODELS = ("llama", "gpt2", "qwen2", "neox", "bert")
LATENCY_VARIANTS = {"prefill": VARIANTS[:5], "decode": ("default", "reduce-overhead", "tritune", "tritune-ro")}
COMPILE_VARIANTS = {"prefill": ("default", "max-autotune", "tritune"), "decode": ("default", "reduce-overhead", "tritune-ro")}
PHASES = ("tune", "compile", "latency", "overhead", "profile")
FORMAT = "model_bench/2"  # of DIR/model_bench.json


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the database, logs and model_bench.json")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated factories of tritune/tuner/model/zoo.py")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated: " + ", ".join(PHASES))
    p.add_argument("--db", default=None, help="tuning database [default: OUT/tuning.db]")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    p.add_argument("--rounds", type=int, default=40, help="latency rounds (each times every variant once)")
    p.add_argument("--variants", default=None, help="comma-separated subset of " + ", ".join(VARIANTS))
    p.add_argument("--device", default="cuda")
    p.add_argument("--hidden", type=int, default=None, help="hidden size [default: the factory's]")
    p.add_argument("--child-timeout", type=float, default=300.0, help="seconds per subprocess")
    p.add_argument("--pack", default=None, help="after every phase, the whole --out directory (database included) "
                                                 "as this one .tar.gz")
    p.add_argument("--child", default=None, choices=("compile", "latency", "overhead", "profile"), help=argparse.SUPPRESS)
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, known in (("models", MODELS), ("shapes", SHAPES), ("phases", PHASES), ("variants", VARIANTS)):
        items = getattr(args, name).split(",") if getattr(args, name) else None
        if items and any(i not in known for i in items):
            p.error(f"--{name}: {getattr(args, name)!r} is not a comma-separated subset of {', '.join(known)}")
        setattr(args, name, items)
    # absolute: the children run in the repository's root
    args.out = str(Path(args.out).resolve())
    args.db = str(Path(args.db).resolve()) if args.db else str(Path(args.out) / "tuning.db")
    return args


# ----- the parent: subprocesses, merged results

def spawn(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> tuple[int | str, float]:
    """Run cmd, its output streamed to log: (exit code or 'timeout', wall seconds). The child leads
    a process group, so that a timeout (or SIGTERM to this script) stops its workers too."""
    start = time.perf_counter()
    with open(log, "w") as fp:
        proc = subprocess.Popen(cmd, stdout=fp, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):  # the tuner stores, then exits
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                        os.killpg(proc.pid, sig)
                        proc.wait(timeout=grace)
    return rc, time.perf_counter() - start


def tail(log: Path, lines: int = 3) -> str:
    """The last lines of a child's output (a traceback's caret lines left out)."""
    text = [t.strip() for t in log.read_text(errors="replace").splitlines() if t.strip(" ^~")] if log.exists() else []
    return " | ".join(text[-lines:]) or "no output"


def run_child(args: argparse.Namespace, kind: str, model: str, shape: str, variants: list[str], log: Path) -> dict:
    """This script in --child mode with empty Inductor and Triton caches (temporary, removed after):
    its JSON (as far as it got, after a timeout), with an 'error' and its last lines if it failed."""
    cache = Path(tempfile.mkdtemp(prefix=f"model_bench_{kind}_"))
    try:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"),
                   PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
        result_path = cache / "result.json"
        cmd = [sys.executable, "-m", "scripts.bench.model_bench", "--child", kind, "--child-json", str(result_path),
               "--out", args.out, "--models", model, "--shapes", shape, "--variants", ",".join(variants),
               "--db", args.db, "--dtype", args.dtype, "--rounds", str(args.rounds), "--device", args.device]
        rc, wall = spawn(cmd + ["--hidden", str(args.hidden)] * bool(args.hidden), log, args.child_timeout, env)
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if rc != 0:
        why = f"timed out after {args.child_timeout:.0f} s" if rc == "timeout" else f"exit {rc}"
        result["error"] = f"{why}: {tail(log)}"
    return {**result, "process_s": wall}


def phase_tune(args: argparse.Namespace, out: Path, results: dict) -> None:
    for model, shape in itertools.product(args.models, args.shapes):
        summary, log = out / f"tune_{model}_{shape}.json", out / f"tune_{model}_{shape}.log"
        summary.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "tritune", "tune-model", "--model", factory_spec(args, out, model),
               "--input-shape", ",".join(map(str, (*SHAPES[shape], hidden_of(args, model)))),
               "--dtype", args.dtype, "--db", args.db, "--summary-json", str(summary)]
        rc, wall = spawn(cmd, log, 2 * args.child_timeout)  # tuning, then the whole-model check
        data = json.loads(summary.read_text()) if summary.exists() else {}
        results.setdefault("tune", {})[f"{model}/{shape}"] = {
            "exit": rc, "wall_s": wall, "summary": data.get("tasks"), "model_check": data.get("model_check"), "log": str(log)}
        print(f"tune {model}/{shape}: exit {rc}, {wall:.0f} s, {len(data.get('tasks') or [])} tasks (log {log})"
              + (f": {tail(log, 2)}" if rc != 0 else ""), flush=True)
        save(out, results)


def factory_spec(args: argparse.Namespace, out: Path, model: str) -> str:
    """tritune/tuner/model/zoo.py:MODEL, or with --hidden a file in OUT whose factories pass it (tune-model calls
    a factory without arguments)."""
    if not args.hidden:
        return f"tritune/tuner/model/zoo.py:{model}"
    path = out / f"zoo_hidden{args.hidden}.py"
    path.write_text("from tritune.tuner.model import zoo\n\n\n"
                    + "".join(f"def {m}():\n    return zoo.{m}(hidden={args.hidden})\n\n\n" for m in MODELS))
    return f"{path.resolve()}:{model}"


def phase_compile(args: argparse.Namespace, out: Path, results: dict) -> None:
    for model, shape in itertools.product(args.models, args.shapes):
        for variant in args.variants or COMPILE_VARIANTS[step(shape)]:
            r = run_child(args, "compile", model, shape, [variant], out / f"compile_{model}_{shape}_{variant}.log")
            r["site_counts"] = counts(r.get("sites"))
            results.setdefault("compile", {}).setdefault(f"{model}/{shape}", {})[variant] = r
            print(f"compile {model}/{shape} {variant}: " + (r["error"] if "error" in r else f"{r['compile_s']:.1f} s, "
                  f"rel err {r['rel_err']:.1e}" + (f", sites {r['site_counts']}" if r["sites"] is not None else "")), flush=True)
            save(out, results)


def phase_latency(args: argparse.Namespace, out: Path, results: dict) -> None:
    for model, shape in itertools.product(args.models, args.shapes):
        r = run_child(args, "latency", model, shape, list(args.variants or LATENCY_VARIANTS[step(shape)]),
                      out / f"latency_{model}_{shape}.log")
        rows = r.setdefault("variants", {})
        if "eager_ms" in r:
            r["eager"] = {"latency_ms": r["eager_ms"], "rounds_ms": r.get("eager_rounds_ms", [])}
        for v in [*rows.values(), r.get("eager", {})]:
            v["site_counts"] = counts(v.get("sites"))
            for other in ("default", "reduce-overhead"):  # variant / other, paired by round: lower is better
                if v.get("rounds_ms") and rows.get(other, {}).get("rounds_ms"):
                    v[f"x_{other}"] = paired_ratio(v["rounds_ms"], rows[other]["rounds_ms"])
        results.setdefault("latency", {})[f"{model}/{shape}"] = r
        done = ", ".join(f"{k} {v['latency_ms']:.3f} ms" if "latency_ms" in v else f"{k} failed ({v.get('error')})"
                         for k, v in rows.items())
        print(f"latency {model}/{shape}: {r.get('rounds', 0)} rounds, {done or 'nothing timed'}"
              + (f"; {r['error']}" if "error" in r else ""), flush=True)
        save(out, results)


def phase_profile(args: argparse.Namespace, out: Path, results: dict) -> None:
    for model, shape in itertools.product(args.models, args.shapes):
        r = run_child(args, "profile", model, shape, list(args.variants or LATENCY_VARIANTS[step(shape)]),
                      out / f"profile_{model}_{shape}.log")
        if r.get("weight_bytes") and r.get("copy_gbps"):
            r["floor_us"] = floor_us(r["weight_bytes"], r["copy_gbps"])
        results.setdefault("profile", {})[f"{model}/{shape}"] = r
        floor = (f" weights {r['weight_bytes'] / 1e6:.1f} MB, copy {r['copy_gbps']:.0f} GB/s, floor "
                 f"{r['floor_us']:.1f} us per step;" if "floor_us" in r else "")
        print(f"profile {model}/{shape}:{floor}" + (f" {r['error']}" if "error" in r else ""), flush=True)
        for variant, v in r.items():
            if isinstance(v, dict):
                print(f"  {variant}: " + (v["error"] if "error" in v else f"{v['gpu_us']:.1f} GPU us, busy {v.get('busy_us', 0):.1f}, "
                      f"{v['launches']:.0f} kernels per call; " + "; ".join(f"{n} {us:.1f}us x{c:g}" for n, us, c in v["top"])),
                      flush=True)
        save(out, results)


def phase_overhead(args: argparse.Namespace, out: Path, results: dict) -> None:
    results["overhead"] = run_child(args, "overhead", MODELS[0], "decode", ["tritune"], out / "overhead.log")
    print(f"overhead: {overhead_line(results['overhead'])}", flush=True)
    save(out, results)


def step(shape: str) -> str:
    """The key of a shape's variant lists: "decode" for every decode shape, else "prefill"."""
    return "decode" if is_decode(shape) else "prefill"


def save(out: Path, results: dict) -> None:
    """Write the merged results (through a rename: a kill never leaves half a file)."""
    (out / "model_bench.json.tmp").write_text(json.dumps(results, indent=2))
    os.replace(out / "model_bench.json.tmp", out / "model_bench.json")


def _terminate(signum, frame) -> None:
    """SIGTERM: exit through the running spawn's cleanup, which stops the child."""
    print("model_bench: terminated (SIGTERM); what finished is in model_bench.json", file=sys.stderr)
    raise SystemExit(128 + signum)


def main() -> None:
    args = parse_args()
    import torch

    if args.child:
        from scripts.bench import bench_children

        return bench_children.run(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("model_bench: no CUDA GPU (torch.cuda.is_available() is False); --device cpu runs the Inductor "
              "variants without one", file=sys.stderr)
        sys.exit(3)
    signal.signal(signal.SIGTERM, _terminate)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model_bench.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if results.get("format") != FORMAT:  # an earlier version's file: start afresh
        results = {"format": FORMAT}
    results["env"] = {"torch": torch.__version__, "python": sys.version.split()[0], "device": args.device,
                      "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    for phase in args.phases or ():
        {"tune": phase_tune, "compile": phase_compile, "latency": phase_latency, "overhead": phase_overhead,
         "profile": phase_profile}[phase](
            args, out, results)
        if args.pack:
            pack(out, Path(args.pack))
    print(report(results))


def pack(out: Path, dest: Path) -> None:
    """The --out directory as one .tar.gz (written aside, then renamed: a call cut short keeps the last
    whole one); between phases no child writes the database, so its files are consistent."""
    import tarfile

    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    tmp.replace(dest)


if __name__ == "__main__":
    main()
