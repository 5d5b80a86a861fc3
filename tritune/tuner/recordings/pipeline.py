"""Writing recordings: a seeded sample of a workload's space built and measured on the GPU through
the real builder and runner (`sample`), the fastest configs of a recording re-timed (`refine`),
recordings of parts of one space joined (`merge`), recordings loaded into a tuning database
(`to_database`). `tune-cli recording sample|refine|merge|import` runs these; nothing here prints:
`describe_sample` and `describe_refine` are the lines the CLI shows."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from tritune.kernels.family import expr_from_dict, family
from tritune.records.database import Database
from tritune.schedules.config import Config
from tritune.schedules.space import Space
from tritune.tuner.recordings.format import Recording, RecordingError, config_line, meta_line
from tritune.tuner.task import device_task
from tritune.tuner.timing import COMPARE, Timing


@dataclass(frozen=True)
class Sampled:
    """A measured sample: its meta line and config lines, and the seconds to start the GPU worker
    and to build and measure."""

    meta: dict
    rows: list[dict]
    startup_s: float
    measure_s: float


@contextmanager
def measuring(timing: Timing, timeout_s: float = 30.0, seed: int = 0) -> Iterator[tuple[Any, Any]]:
    """This host's first GPU worker (timing with `timing`) and the compile pool, stopped at the end
    (at once if measuring failed); `WorkerDied` where there is no GPU."""
    from tritune.tuner.gpus.start import start_gpu

    runner, builder = start_gpu(timing, timeout_s, seed)
    with runner:  # a LocalRunner: its worker is stopped on the way out, killed if measuring failed
        try:
            yield runner, builder
        except BaseException:
            builder.close(now=True)
            raise
        builder.close()


def parse_where(text: str) -> dict[str, int]:
    """'K=V,K=V' (knob values a sample is limited to) -> {K: V}; RecordingError if malformed."""
    try:
        return {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(",") if item)}
    except ValueError:
        raise RecordingError(f"bad --where {text!r}: expected KNOB=INT,KNOB=INT") from None


def sample_configs(space: Space, where: dict[str, int], rng: np.random.Generator, n: int) -> list[Config]:
    """A seeded sample of n valid configs (all of them if fewer), limited to the knob values in `where`."""
    if not where:
        return space.sample(rng, n)
    unknown = set(where) - {k.name for k in space.knobs}
    if unknown:
        raise RecordingError(f"--where: no knob {', '.join(sorted(unknown))} in this space")
    matching = [c for c in (space.config(int(i)) for i in space.valid_indices)
                if all(c[k] == v for k, v in where.items())]
    return [matching[i] for i in sorted(rng.permutation(len(matching))[:n])]


def sample(expr: Any, n: int, seed: int = 0, where: str = "", faults: Sequence[str] = (), timing: Timing = COMPARE,
           timeout_s: float = 20.0, refine_top: int = 0, repeats: int = 5) -> Sampled:
    """Build and measure a seeded sample of the workload's space on this host's GPU (the first
    configs given `faults`, to check isolation), re-time the `refine_top` fastest `repeats` more
    times (a single short measurement can flatter a config by a few %), then time torch."""
    fixed, start = parse_where(where), time.perf_counter()
    with measuring(timing, timeout_s, seed) as (runner, builder):
        info = runner.device_info()
        configs = sample_configs(device_task(expr, info).space, fixed, np.random.default_rng(seed), n)
        configs = [c.replace(fault=f) for c, f in zip(configs, faults)] + configs[len(faults):]
        started = time.perf_counter()
        futures = builder.submit(expr, family(expr.op).canonical_problem(expr), configs)
        rows = []
        for config, future in zip(configs, futures):
            built = builder.result(future, config)
            measured = runner.measure(expr, config, built.compile_s) if built.status is None else None
            rows.append(config_line(built, measured))
        retime(expr, runner, rows, refine_top, repeats)
        done = time.perf_counter()
        builder.close()
        torch_ms = runner.torch_time(expr)[2]
    meta = meta_line(expr, info, torch_ms, seed=seed, space_valid=len(rows),
                     timing_ms=[timing.warmup_ms, timing.rep_ms])
    return Sampled(meta, rows, started - start, done - started)


def retime(expr: Any, runner: Any, rows: list[dict], top: int, repeats: int) -> None:
    """Measure the `top` fastest configs of `rows` `repeats` more times each; each keeps the median
    of all its runs, and its message lists them."""
    ok = sorted((r for r in rows if r["status"] == "OK"), key=lambda r: r["t_median"])[:top]
    for row in ok:
        config = Config.of(row["config"])
        runs = [m.t_median for m in (runner.measure(expr, config) for _ in range(repeats)) if m.ok]
        earlier = json.loads(row["message"]) if row["message"].startswith("[") else [row["t_median"]]
        row["t_median"], row["message"] = float(np.median(earlier + runs)), json.dumps(earlier + runs)


def refine(meta: dict, rows: list[dict], top: int, repeats: int, warmup_ms: float | None = None,
           rep_ms: float | None = None) -> dict:
    """Re-time a recording's `top` fastest configs `repeats` more times each on this host's GPU
    (rows updated in place), and torch three times; with the recording's own timing unless
    `warmup_ms` / `rep_ms` say otherwise. The meta line, updated."""
    own = meta.get("timing_ms") or (COMPARE.warmup_ms, COMPARE.rep_ms)
    timing = Timing(own[0] if warmup_ms is None else warmup_ms, own[1] if rep_ms is None else rep_ms)
    expr = expr_from_dict(meta["workload"])
    ok = sorted((r for r in rows if r["status"] == "OK"), key=lambda r: r["t_median"])[:top]
    configs = [Config.of(r["config"]) for r in ok]
    with measuring(timing) as (runner, builder):
        for config, future in zip(configs, builder.submit(expr, family(expr.op).canonical_problem(expr), configs)):
            builder.result(future, config)  # compiled in parallel up front; the worker then finds them cached
        builder.close()
        retime(expr, runner, ok, top, repeats)
        torch_ms = float(np.median([runner.torch_time(expr)[2] for _ in range(3)]))
    return {**meta, "torch_ms": torch_ms,
            "refined": {"top": top, "repeats": repeats, "timing_ms": [timing.warmup_ms, timing.rep_ms]}}


def merge(parts: Sequence[tuple[dict, list[dict]]]) -> tuple[dict, list[dict]]:
    """Recordings of parts of one space (one workload, one GPU; e.g. sampled `--where` one knob
    value at a time) as one: the first part's meta line, with `torch_ms_parts` (torch's time in
    each part: a drift check) and `space_valid` counting every config."""
    meta = parts[0][0]
    for other, _ in parts[1:]:
        if (other["workload"], other["device"]["gpu"]) != (meta["workload"], meta["device"]["gpu"]):
            raise RecordingError(f"the parts differ in workload or GPU: {other['device']['gpu']}")
    rows = [row for _, part in parts for row in part]
    configs = [json.dumps(r["config"], sort_keys=True) for r in rows]
    if len(set(configs)) != len(configs):
        raise RecordingError("a config is in more than one part")
    return {**meta, "space_valid": len(rows), "torch_ms_parts": [m["torch_ms"] for m, _ in parts],
            "parts": len(parts)}, rows


def to_database(db: Database, recording: Recording) -> int:
    """Add a recording's trials to a tuning database, in recorded order, under the recorded GPU
    and versions (template 'recorded'); how many were new."""
    expr = recording.expr
    db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
    return db.save(expr.key, recording.device_key(), recording.results())


def describe_sample(s: Sampled) -> list[str]:
    """What a sample found: statuses, failures, the best against torch."""
    expr, info, rows, torch_ms = expr_from_dict(s.meta["workload"]), s.meta["device"], s.rows, s.meta["torch_ms"]
    counts = {st: sum(r["status"] == st for r in rows) for st in sorted({r["status"] for r in rows})}
    lines = [f"{expr.describe()} on {info['gpu']} triton {info['triton']} torch {info['torch']}",
             f"startup {s.startup_s:.1f}s, build+measure {s.measure_s:.1f}s for {len(rows)} configs; {counts}"]
    lines += [f"  {r['status']:16s} {r['config']} {r['message'][:100]}" for r in rows if r["status"] != "OK"]
    ok = sorted((r for r in rows if r["status"] == "OK"), key=lambda r: r["t_median"])
    if ok:
        best = ok[0]["t_median"]
        lines += [f"torch {torch_ms:.4f} ms; best {best:.4f} ms = {torch_ms / best:.3f}x torch; configs >= 0.9x "
                  f"torch: {sum(torch_ms / r['t_median'] >= 0.9 for r in ok)}/{len(rows)}; >= 0.98x best: "
                  f"{sum(r['t_median'] <= best / 0.98 for r in ok)}", f"best config {ok[0]['config']}"]
    return lines


def describe_refine(meta: dict, rows: list[dict]) -> str:
    """The re-timed best against torch, how many are within 2% of it, and how much runs spread."""
    ok = sorted((r for r in rows if r["status"] == "OK" and r["message"].startswith("[")), key=lambda r: r["t_median"])
    if not ok:
        return "no config ran correctly: nothing re-timed"
    best, torch_ms = ok[0]["t_median"], meta["torch_ms"]
    spread = [np.ptp(json.loads(r["message"])) / r["t_median"] for r in ok[:20]]
    return (f"{expr_from_dict(meta['workload']).describe()}: torch {torch_ms:.4f} ms; best {best:.4f} ms "
            f"= {torch_ms / best:.3f}x; within 2% of it: {sum(r['t_median'] <= best / 0.98 for r in ok)}; spread "
            f"of the top 20 runs (max-min)/median: median {np.median(spread):.3f}")
