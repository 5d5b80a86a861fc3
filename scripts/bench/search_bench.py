"""Compare search strategies: best-at-budget (16/32/64/128 trials) over several seeds, as a fraction
of the best config seen in the whole run and against torch.matmul, and the CPU-seconds a run costs
the tuning process (its search and model fits, every thread); saves a convergence plot (PNG).

Strategies: `sa` is warm-started as `tune-cli run` does it, by the measurements shipped with
tritune for this GPU generation (never those of the workload searched; the database is fresh; an
op with none of its own, a gated pair, learns from the plain GEMMs' as `tuner.prior` lifts them);
`sa/cold` is the same search with no prior.

Live on a GPU (every trial really measured):
    python -m scripts.bench.search_bench --shape 4096 --dtype fp16 --seeds 3 [--warmup-ms 25 --rep-ms 100] --out DIR
Replaying a recorded space on any machine (times come from the recording):
    python -m scripts.bench.search_bench --recorded tritune/tuner/recordings/space_4096_fp16.jsonl.gz --seeds 5 --out DIR
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from tritune.records.database import Database
from tritune.search import make_strategy, strategy_class
from tritune.tuner.prior import prior_for
from tritune.tuner.tuner import Tuner


def environment(args):
    """(task, builder, runner, torch_ms, close) for a live GPU or a recording."""
    if args.recorded:
        from tritune.tuner.recordings import Recording, RecordedBuilder, RecordedRunner

        rec = Recording.load(args.recorded)
        task = rec.task(rec.device_key())
        return task, RecordedBuilder(), RecordedRunner(rec), rec.torch_ms, lambda: None
    from tritune.kernels.family import parse_expr
    from tritune.tuner.gpus.start import start_gpu
    from tritune.tuner.task import device_task
    from tritune.tuner.timing import Timing

    runner, builder = start_gpu(Timing(args.warmup_ms, args.rep_ms))
    task = device_task(parse_expr("matmul", args.shape, args.dtype), runner.device_info())
    torch_ms = runner.torch_time(task.expr)[2]
    return task, builder, runner, torch_ms, lambda: (builder.close(), runner.close())


def trajectory(task, builder, runner, spec: str, seed: int, budget: int) -> list[float]:
    """Best median time so far after each trial, for one strategy ('name' or 'name/cold') and seed
    (fresh database)."""
    name, _, mode = spec.partition("/")
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(Path(tmp) / "b.db")
        prior = None if mode == "cold" else prior_for(db, task)
        strategy = make_strategy(name, task.space, seed=seed, features=task.featurize, prior=prior)
        history = Tuner(task, strategy, builder, runner, db, batch_size=8).run(budget)
    times = [r.t_median if r.ok else np.inf for r in history]
    return np.minimum.accumulate(times).tolist()


def seeds(spec: str, first: int, n: int) -> range:
    """The seeds to run a strategy with: one for a strategy that ignores its seed."""
    return range(first, first + (n if strategy_class(spec.partition("/")[0]).seeded else 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="4096")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--recorded", default=None)
    p.add_argument("--strategies", default="sa,sa/cold,random,grid")
    p.add_argument("--budgets", default="16,32,64,128")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="live: warm-up per trial, ms")
    p.add_argument("--rep-ms", type=float, default=100.0, help="live: timed repetitions per trial, ms")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    task, builder, runner, torch_ms, close = environment(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    specs = args.strategies.split(",")
    runs: dict[str, list] = {spec: [] for spec in specs}
    cpu: dict[str, list] = {spec: [] for spec in specs}  # the process's CPU-seconds per run
    # seed by seed, the strategies in turn: a GPU whose clocks drift over the run drifts for all alike
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for spec in specs:
            if seed in seeds(spec, args.first_seed, args.seeds):
                start = time.process_time()
                runs[spec].append(trajectory(task, builder, runner, spec, seed, max(budgets)))
                cpu[spec].append(time.process_time() - start)
                # kept as it goes: a run cut short by a time limit still leaves its finished seeds
                (Path(args.out) / "search_bench.partial.json").write_text(json.dumps({"torch_ms": torch_ms, "runs": runs}))
    close()
    best = min(min(t) for trajs in runs.values() for t in trajs)
    if args.recorded:
        best = runner.recording.best_ms  # the best of the whole recorded space
    report(task, runs, cpu, budgets, best, torch_ms, Path(args.out), bool(args.recorded))


def report(task, runs, cpu, budgets, best, torch_ms, out: Path, recorded: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    what = "recorded space's best" if recorded else "best seen in this run"
    print(f"{task.expr.describe()} on {task.device.gpu}: best-at-budget / {what} "
          f"(mean, min over seeds) | vs torch.matmul (mean); CPU-s a run (mean)")
    rows = {}
    for name, trajs in runs.items():
        cells = []
        for b in budgets:
            at = np.array([t[min(b, len(t)) - 1] for t in trajs])
            rows.setdefault(name, {})[b] = {"frac_mean": float(np.mean(best / at)), "frac_min": float(np.min(best / at)),
                                           "vs_torch_mean": float(np.mean(torch_ms / at))}
            r = rows[name][b]
            cells.append(f"@{b}: {r['frac_mean']:.3f} ({r['frac_min']:.3f}) | {r['vs_torch_mean']:.3f}x")
        print(f"  {name:8s} " + "   ".join(cells) + f"   {np.mean(cpu[name]):.2f} CPU-s")
    # per-seed best-so-far times (None until a first config ran), to tell a stuck seed from noise
    trajectories = {name: [[t if np.isfinite(t) else None for t in traj] for traj in trajs] for name, trajs in runs.items()}
    (out / "search_bench.json").write_text(json.dumps({"workload": task.expr.to_dict(), "best_ms": best,
                                                       "torch_ms": torch_ms, "recorded": recorded, "rows": rows,
                                                       "cpu_s": cpu,
                                                       "trajectories": trajectories}, indent=1))
    plot(runs, best, task, out / "search_convergence.png", what)


def plot(runs, best, task, path: Path, what: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, trajs in runs.items():
        frac = best / np.array(trajs)
        x = np.arange(1, frac.shape[1] + 1)
        ax.plot(x, frac.mean(axis=0), label=f"{name} (mean of {len(trajs)})")
        ax.fill_between(x, frac.min(axis=0), frac.max(axis=0), alpha=0.15)
    ax.set(xlabel="trials", ylabel=f"best so far / {what}", title=task.expr.describe(), ylim=(0.5, 1.01))
    ax.axhline(0.98, color="grey", lw=0.8, ls="--")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
