"""Several GPUs pay, or not: one GPU against every GPU of this host, and one Dask GPU host against
two, each whole command timed from empty caches (Triton, Inductor, tritune, a database of its own
per run under a temp dir), then a Dask GPU host SIGKILLed mid-run.

  run1 / run2     tune-cli run --op matmul --shape 4096 --dtype fp16 --trials 128 --verbose [--devices all]
  model1 / model2 tune-cli tune-model --model M (--input-shape 1,2048,2048 | --decode B,C[,N]) --no-check
                  --trials T [--devices all]; M is --model (the zoo's llama), --decode its decode step
  model1x2        model1 with --per-gpu 2: two workloads at once on the first GPU
  check1          model1 with its whole-model check, at tune-model's default budget (--check-trials)
  check1x2        check1 with --per-gpu 2
  dask1 / dask2   the run1 workload through --cluster: a local Dask scheduler in this process and one
                  `tune-cli gpu-host` per GPU (--devices i, --compile-workers C each), started before the command
  daskmodel1 / daskmodel2  model1's command through --cluster, one or two Dask GPU hosts as dask1 / dask2
  kill            dask2's command again; once --kill-at trials are stored, one worker is SIGKILLed:
                  every trial stored before the kill must still be there, the database intact, and the
                  run must complete or stop with one line

Each step prints one line; then a table (whole-command seconds, speed-up over its one-GPU twin, GPU
busy per device, trials stored) and the JSON in --out. GPU busy: `run`'s --verbose table (of the
run's wall); for tune-model (no --verbose) each workload's device-seconds from --summary-json, over
the whole command; the Dask path's GPU seconds stay on its hosts (n/a).

Usage (from the repository's root, on a host with two GPUs; every step in about 12 minutes, or
until --budget-s is spent):
    python -m scripts.bench.devices_bench --out devices.json [--trials 256] [--steps run1,run2,...]
A decoder's decode step, one GPU with its check and each GPU count without:
    python -m scripts.bench.devices_bench --out d.json --model scripts/bench/decoders.py:llama --decode 16,1024,33 \
        --trials 1024 --steps check1,check1x2,model1,model2,daskmodel1,daskmodel2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from scripts.bench.bench_tables import busy_of_model, busy_of_run, last_line, parse_startup, parse_verbose

STEPS = ("run1", "run2", "model1", "model2", "model1x2", "check1", "check1x2", "dask1", "dask2", "daskmodel1",
         "daskmodel2", "kill")
# each step's one-GPU baseline
TWINS = {"run2": "run1", "model2": "model1", "model1x2": "model1", "check1x2": "check1", "dask2": "dask1",
         "daskmodel2": "daskmodel1"}
EXIT_NO_GPU = 3
RUN = ["run", "--op", "matmul", "--shape", "4096", "--dtype", "fp16", "--verbose"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The bench's options; --steps checked against STEPS."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="write the results here (JSON)")
    p.add_argument("--trials", type=int, default=256, help="tune-model's trials (all workloads together)")
    p.add_argument("--model", default="tritune.tuner.model.zoo:llama", help="tune-model's model (its --model)")
    p.add_argument("--decode", default=None, metavar="B,C[,N]",
                   help="tune the model's generate() decode step at batch B, context C (else prefill at 1,2048,2048)")
    p.add_argument("--check-trials", type=int, default=256, help="the check steps' trials")
    p.add_argument("--run-trials", type=int, default=128, help="run's trials (run1, run2, dask*, kill)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"which steps, comma-separated, of {','.join(STEPS)}")
    p.add_argument("--worker-cores", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="compile processes of each Dask GPU host [default: half the cores]")
    p.add_argument("--kill-at", type=int, default=40, help="kill: trials stored before a host is SIGKILLed")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="start no step once this much wall time is spent (the last may take a minute more)")
    p.add_argument("--step-timeout-s", type=float, default=240.0, help="the most one command may take")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, databases)")
    args = p.parse_args(argv)
    unknown = [s for s in args.steps.split(",") if s not in STEPS]
    if unknown:
        p.error(f"unknown step(s) {','.join(unknown)}: pick from {','.join(STEPS)}")
    args.steps = [s for s in STEPS if s in args.steps.split(",")]
    return args


def gpu_count() -> tuple[int, str]:
    """CUDA devices of this host (asked in a child: this process keeps no CUDA context), and why none."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        return 0, (proc.stderr.strip().splitlines() or ["torch failed"])[-1]
    count = int(proc.stdout.split()[-1])
    return count, "" if count else "torch.cuda.is_available() is False"


def fresh_env(root: Path, name: str) -> dict:
    """The environment of one step's processes: empty caches of their own, wide tables."""
    base = root / name
    dirs = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITUNE_CACHE_DIR": "tritune",
            "XDG_CACHE_HOME": "xdg"}
    env = {k: v for k, v in os.environ.items() if k != "TRITUNE_DB"}
    for key, sub in dirs.items():
        (base / sub).mkdir(parents=True, exist_ok=True)
        env[key] = str(base / sub)
    return {**env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


# what the commands import; compiled to bytecode once before the first step (see `warm_bytecode`)
IMPORTED = ("torch._dynamo", "torch._inductor.compile_fx", "triton", "transformers", "xgboost", "sklearn",
            "sqlite_utils", "rich", "click")


def warm_bytecode() -> None:
    """Import what the commands import in a process of its own, so that Python's bytecode of the
    installed packages exists before the first step: pip writes it at install, but on a host image
    without it the first step alone compiled it (a decoder's capture took 3.7 s more in a first
    process), and steps compared in one run must start alike. The caches the steps start empty
    are the compilers' (Triton, Inductor, tritune)."""
    code = ("import importlib, sys\nfor name in sys.argv[1:]:\n    try:\n        importlib.import_module(name)\n"
            "    except ImportError:\n        pass\n")
    subprocess.run([sys.executable, "-c", code, *IMPORTED], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)


def tune_cli(args: Sequence[str]) -> list[str]:
    """The command line of `tune-cli ARGS` with this interpreter."""
    return [sys.executable, "-m", "tritune", *args]


def timed(cmd: Sequence[str], env: dict, timeout_s: float, log: Path) -> dict:
    """Run a command to its end (killed past `timeout_s`): its exit code, wall seconds, output."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", _text(exc.stdout), _text(exc.stderr)
    seconds = time.perf_counter() - start
    log.write_text(f"$ {' '.join(cmd)}\n{out}\n--- stderr\n{err}")
    return {"rc": rc, "seconds": round(seconds, 1), "stdout": out, "stderr": err}


def _text(data: Any) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def stored_keys(db: Path) -> list[str]:
    """The config key of every stored trial (read-only; [] before the database exists)."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return [k for (k,) in conn.execute("SELECT config_key FROM trials")]
    except sqlite3.OperationalError:  # not created yet
        return []


def integrity(db: Path) -> str:
    """SQLite's own check of the file ('ok', or what is broken)."""
    with sqlite3.connect(db) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def step_line(name: str, result: dict) -> str:
    """The one line a step prints."""
    if "skipped" in result:
        return f"{name}: skipped ({result['skipped']})"
    busy = ", ".join(f"{d} {f:.0%}" for d, f in result.get("gpu_busy", {}).items()) or "n/a"
    line = f"{name}: {result['seconds']:.1f} s, rc {result['rc']}, {result['trials']} trials stored, GPU busy {busy}"
    if "kill" in result:
        k = result["kill"]
        line += (f"; killed {k['host']} at {k['stored_before']} stored: {k['lost']} lost, integrity {k['integrity']}, "
                 f"{k['outcome']}")
    if result.get("startup"):
        line += "; start-up " + ", ".join(f"{k} {v:.1f} s" for k, v in result["startup"].items())
    return line if result["rc"] == 0 else f"{line}; last line: {result['last_line']}"


def table(results: dict) -> str:
    """The compact table of every step: whole-command seconds, speed-up over its one-GPU twin, GPU
    busy per device, trials stored."""
    rows = [("step", "whole s", "speed-up", "GPU busy per device", "trials", "rc")]
    for name, r in results.items():
        if "skipped" in r:
            rows.append((name, "-", "-", f"skipped: {r['skipped']}", "-", "-"))
            continue
        twin = results.get(TWINS.get(name, ""), {})
        speedup = f"{twin['seconds'] / r['seconds']:.2f}x" if twin.get("seconds") and r["seconds"] else ""
        busy = ", ".join(f"{d} {f:.0%}" for d, f in r.get("gpu_busy", {}).items()) or "n/a"
        rows.append((name, f"{r['seconds']:.1f}", speedup, busy, str(r["trials"]), str(r["rc"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def summarised(run: dict, db: Path, busy: dict) -> dict:
    """A step's result: the command's outcome, trials stored, GPU busy per device."""
    return {"rc": run["rc"], "seconds": run["seconds"], "trials": len(stored_keys(db)), "gpu_busy": busy,
            "last_line": last_line(run["stderr"])}


def step_run(args: argparse.Namespace, root: Path, name: str, timeout_s: float) -> dict:
    """run1 / run2: the 4096^3 workload on the first GPU, or on every GPU of the host."""
    db, out = root / name / "t.db", root / name / "summary.json"
    env = fresh_env(root, name)
    cmd = tune_cli([*run_args(args, db), "--summary-json", str(out),
                    *(["--devices", "all"] if name == "run2" else [])])
    run = timed(cmd, env, timeout_s, root / f"{name}.log")
    tables = parse_verbose(run["stdout"])
    return {**summarised(run, db, busy_of_run(tables)), "verbose": tables[-1] if tables else None,
            "startup": parse_startup(run["stdout"])}


def run_args(args: argparse.Namespace, db: Path) -> list[str]:
    """The arguments of the run steps' command (run1's workload at --run-trials) into `db`."""
    return [*RUN, "--trials", str(args.run_trials), "--db", str(db)]


def model_args(args: argparse.Namespace, name: str, db: Path) -> list[str]:
    """The tune-model arguments of a model, check or daskmodel step: on every GPU (model2), two
    workloads at once (..x2), with the whole-model check (check..) at its own budget."""
    check = name.startswith("check")
    return ["tune-model", "--model", args.model,
            *(["--decode", args.decode] if args.decode else ["--input-shape", "1,2048,2048"]), "--dtype", "fp16",
            "--trials", str(args.check_trials if check else args.trials), "--db", str(db),
            *([] if check else ["--no-check"]), *(["--devices", "all"] if name == "model2" else []),
            *(["--per-gpu", "2"] if name.endswith("x2") else [])]


def step_model(args: argparse.Namespace, root: Path, name: str, timeout_s: float) -> dict:
    """model1 / model2 / model1x2 / check1 / check1x2: tune-model on the first GPU, on every GPU,
    or on the first with two workloads at once; the check steps with the whole-model check."""
    db, out = root / name / "t.db", root / name / "summary.json"
    cmd = tune_cli([*model_args(args, name, db), "--summary-json", str(out)])
    run = timed(cmd, fresh_env(root, name), timeout_s, root / f"{name}.log")
    summary = json.loads(out.read_text()) if out.exists() else {}
    return summarised(run, db, busy_of_model(summary, run["seconds"]))


@contextmanager
def scheduler() -> Iterator[str]:
    """A Dask scheduler in this process on loopback (no workers of its own); its address."""
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", scheduler_port=0,
                           dashboard_address=":0")
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


@contextmanager
def gpu_hosts(address: str, count: int, root: Path, name: str, cores: int, wait_s: float = 120.0) -> Iterator[list]:
    """`count` tune-cli gpu-hosts (GPU i each, `cores` compile processes, caches of their own), once
    each says it serves (RuntimeError past `wait_s`); every one is killed at the end."""
    procs, serving = [], []
    try:
        for i in range(count):
            log = root / f"{name}-host{i}.log"
            cmd = tune_cli(["gpu-host", "--scheduler", address, "--name", f"gpu{i}", "--devices", str(i),
                            "--compile-workers", str(cores)])
            procs.append(subprocess.Popen(cmd, env=fresh_env(root, f"{name}-host{i}"), stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
            serving.append(_drain(procs[-1], log))
        deadline = time.perf_counter() + wait_s
        for i, ready in enumerate(serving):
            if not ready.wait(max(0.0, deadline - time.perf_counter())) or procs[i].poll() is not None:
                raise RuntimeError(f"tune-cli gpu-host gpu{i} is not serving (see {name}-host{i}.log)")
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _drain(proc: subprocess.Popen, log: Path) -> threading.Event:
    """Copy a worker's stderr into its log from a thread (a full pipe would stall it); the event is
    set once it says it serves, or once it ends."""
    ready = threading.Event()

    def copy() -> None:
        with open(log, "w") as out:
            for line in proc.stderr:
                out.write(line)
                if "serving" in line:
                    ready.set()
        ready.set()
    threading.Thread(target=copy, daemon=True).start()
    return ready


def step_dask(args: argparse.Namespace, root: Path, name: str, timeout_s: float) -> dict:
    """dask1 / dask2 / daskmodel1 / daskmodel2: run1's workload or model1's command through one or
    two Dask GPU hosts (started before the timed command: their start is not in its seconds)."""
    db, deadline = root / name / "t.db", time.perf_counter() + timeout_s
    hosts = 2 if name.endswith("2") else 1
    command = model_args(args, "model1", db) if "model" in name else run_args(args, db)
    with scheduler() as address, gpu_hosts(address, hosts, root, name, args.worker_cores, timeout_s):
        cmd = tune_cli([*command, "--cluster", address])
        run = timed(cmd, fresh_env(root, name), max(10.0, deadline - time.perf_counter()), root / f"{name}.log")
    return summarised(run, db, {})


def step_kill(args: argparse.Namespace, root: Path, name: str, timeout_s: float) -> dict:
    """kill: dask2's command, with its second host SIGKILLed once --kill-at trials are stored."""
    db, deadline = root / name / "t.db", time.perf_counter() + timeout_s
    with scheduler() as address, gpu_hosts(address, 2, root, name, args.worker_cores, timeout_s) as hosts:
        cmd = tune_cli([*run_args(args, db), "--cluster", address])
        start, timeout_s = time.perf_counter(), max(10.0, deadline - time.perf_counter())
        outs = [root / f"{name}.out", root / f"{name}.err"]  # files, not pipes: nothing reads them meanwhile
        with open(outs[0], "w") as out, open(outs[1], "w") as err:
            proc = subprocess.Popen(cmd, env=fresh_env(root, name), stdout=out, stderr=err, text=True)
            before = _stored_by(db, args.kill_at, proc, start + timeout_s)
            hosts[1].send_signal(signal.SIGKILL)
            try:
                rc = proc.wait(timeout=max(1.0, start + timeout_s - time.perf_counter()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = "timeout"
    run = {"rc": rc, "seconds": round(time.perf_counter() - start, 1), "stdout": outs[0].read_text(),
           "stderr": outs[1].read_text()}
    return {**summarised(run, db, {}), "kill": kill_verdict(db, before, run)}


def _stored_by(db: Path, n: int, proc: subprocess.Popen, deadline: float) -> set[str]:
    """The trials stored once there are `n` (or once the run ended, or at the deadline)."""
    while True:
        keys = stored_keys(db)
        if len(keys) >= n or proc.poll() is not None or time.perf_counter() > deadline:
            return set(keys)
        time.sleep(0.1)


def kill_verdict(db: Path, before: set[str], run: dict) -> dict:
    """What a kill left: trials stored before it and gone now, the database's integrity, and whether
    the run completed or stopped with one line (no traceback)."""
    after = stored_keys(db)
    one_line = "Traceback" not in run["stderr"] and last_line(run["stderr"]).startswith("tune-cli:")
    outcome = "completed" if run["rc"] == 0 else "stopped with one line" if one_line else "FAILED badly"
    return {"host": "gpu1", "stored_before": len(before), "lost": len(before - set(after)),
            "duplicates": len(after) - len(set(after)), "integrity": integrity(db) if db.exists() else "no database",
            "outcome": outcome}


STEP_FUNCS = {"run1": step_run, "run2": step_run, "model1": step_model, "model2": step_model,
              "model1x2": step_model, "check1": step_model, "check1x2": step_model, "dask1": step_dask,
              "dask2": step_dask, "daskmodel1": step_dask, "daskmodel2": step_dask, "kill": step_kill}


def why_skipped(name: str, gpus: int, spent_s: float, budget_s: float) -> str:
    """Why a step cannot run here now ('' where it can)."""
    if spent_s > budget_s:
        return f"the time budget of {budget_s:.0f} s is spent"
    if name not in ("run1", "model1", "model1x2", "check1", "check1x2", "dask1", "daskmodel1") and gpus < 2:
        return f"this host has {gpus} GPU"
    if name.startswith(("dask", "kill")):
        try:
            import distributed  # noqa: F401
        except ImportError:
            return "dask distributed is not installed"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the steps, print a line each and the table, write the JSON; 3 without a GPU."""
    args = parse_args(argv)
    gpus, why = gpu_count()
    if not gpus:
        print(f"devices_bench: no CUDA GPU on this host ({why}); nothing measured", file=sys.stderr)
        return EXIT_NO_GPU
    warm_bytecode()
    root, begun, results = Path(tempfile.mkdtemp(prefix="tritune_devices_")), time.perf_counter(), {}
    try:
        for name in args.steps:
            spent = time.perf_counter() - begun
            skip = why_skipped(name, gpus, spent, args.budget_s)
            timeout_s = min(args.step_timeout_s, max(30.0, args.budget_s + 60 - spent))
            try:
                results[name] = {"skipped": skip} if skip else STEP_FUNCS[name](args, root, name, timeout_s)
            except Exception as exc:  # noqa: BLE001 - one step's failure is its line; the others go on
                results[name] = {"skipped": f"failed: {type(exc).__name__}: {exc}"}
            print(step_line(name, results[name]), flush=True)
        print(table(results))
        args.out.write_text(json.dumps({"gpus": gpus, "args": {k: str(v) for k, v in vars(args).items()},
                                        "steps": results, "logs": str(root) if args.keep else None}, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
