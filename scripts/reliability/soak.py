"""Soak a long tuning run: thousands of trials with the GPU worker killed and restarted every N
trials (an injected out-of-bounds store), and the tuning process's RSS, the worker's RSS and the
GPU's memory sampled as it goes: all three must stay flat.

Usage: python -m scripts.reliability.soak [--trials 2000] [--op conv2d --shape 8,28,28,64,64,3,3] [--restart-every 100] [--json OUT]
(short timing per trial, 1 ms warm-up and 5 ms of repetitions: the soak is about the host, not speed)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from tritune.kernels.family import parse_expr
from tritune.records.database import Database
from tritune.search import make_strategy
from tritune.tuner.gpus.start import start_gpu
from tritune.tuner.task import device_task
from tritune.tuner.timing import Timing
from tritune.tuner.tuner import Tuner


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process in MB (0 if it is gone)."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def gpu_mb() -> float:
    """Memory in use on GPU 0, in MB, as nvidia-smi reports it."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True)
    return float(out.stdout.split()[0]) if out.returncode == 0 else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--op", default="conv2d")
    p.add_argument("--shape", default="8,28,28,64,64,3,3")
    p.add_argument("--restart-every", type=int, default=100)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    db = Database(Path(tempfile.mkdtemp()) / "soak.db")
    runner, builder = start_gpu(Timing(1.0, 5.0), timeout_s=20.0)
    task = device_task(parse_expr(args.op, args.shape, "fp16"), runner.device_info())
    start, samples, done = time.time(), [], 0
    with runner:
        while done < args.trials:
            goal = min(done + args.restart_every, args.trials)
            # each leg starts with a candidate that loses the CUDA context: the worker is replaced
            strategy = make_strategy("random", task.space, seed=len(samples))
            history = Tuner(task, strategy, builder, runner, db, batch_size=32, faults=("oob",)).run(goal)
            done = len(history)
            samples.append({"trials": done, "wall_s": round(time.time() - start, 1), "host_rss_mb": round(rss_mb(), 1),
                            "worker_rss_mb": round(rss_mb(runner._proc.pid) if runner._proc else 0.0, 1),
                            "gpu_mb": gpu_mb(), "restarts": runner.restarts})
            print(json.dumps(samples[-1]), flush=True)
        builder.close()
    first, last = samples[0], samples[-1]
    print(f"{last['trials']} trials in {last['wall_s']} s, {last['restarts']} worker restarts; host RSS "
          f"{first['host_rss_mb']} -> {last['host_rss_mb']} MB, worker RSS {first['worker_rss_mb']} -> "
          f"{last['worker_rss_mb']} MB, GPU {first['gpu_mb']} -> {last['gpu_mb']} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(samples, indent=1))


if __name__ == "__main__":
    main()
