"""The final table of scripts/bench/model_bench.py, from its merged results (DIR/model_bench.json):
the tuning runs; per model and shape a row per variant; the ratios against torch.compile with
their targets and, over the decode rows, their geometric mean; at decode, the floor (the weights one
step reads, over the copy bandwidth measured in the same profile run) and each variant's GPU time
per step as a multiple of it; the overhead of a call.

    python -m scripts.bench.model_table DIR/model_bench.json [DIR2/model_bench.json ...]

prints the table of several runs' results taken as one (e.g. one run per GPU of a host, each
with its own models): a later file's entry for the same model and shape replaces an earlier's.
"""
from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

from scripts.bench.bench_children import SHAPES, VARIANTS, is_decode

# (ours, theirs, what, target): never slower than torch.compile, and a cheaper compile than max-autotune's
TARGETS = (("tritune", "default", "latency", 1.0), ("tritune-ro", "reduce-overhead", "latency", 1.0),
           ("tritune", "default", "compile", 1.2), ("tritune", "max-autotune", "compile", 0.25))
SHORT = {"tritune": "tr", "tritune-ro": "tr-ro", "default": "def", "reduce-overhead": "ro", "max-autotune": "max"}


def report(results: dict) -> str:
    """The tuning runs; per model and shape a row per variant; the ratios and their targets; the
    decode floor; the overhead."""
    lines = [tune_line(key, t) for key, t in sorted(results.get("tune", {}).items())]
    keys = sorted({*results.get("compile", {}), *results.get("latency", {})})
    head = (f"{'model/shape':15s} {'variant':16s} {'compile s':>9s} {'latency ms':>10s} {'xdefault':>8s} "
            f"{'xred-ovh':>8s} {'tuned/lib/miss':>14s} {'rel err':>8s}")
    lines += [head] * bool(keys)
    for key in keys:
        comp, lat = results.get("compile", {}).get(key, {}), results.get("latency", {}).get(key, {})
        if "error" in lat:
            lines.append(f"{key:15s} latency: {lat['error'][:300]}")
        timed = {**lat.get("variants", {}), "eager": lat.get("eager", {})}
        for variant in [v for v in (*VARIANTS, "eager") if v in comp or timed.get(v)]:
            lines.append(f"{key:15s} {variant:16s} " + row(comp.get(variant, {}), timed.get(variant, {})))
    lines += ratio_table(results, keys) + floor_table(results.get("profile", {}))
    if "overhead" in results:
        lines.append("overhead: " + overhead_line(results["overhead"]))
    return "\n".join(lines)


def decode_key(key: str) -> bool:
    """Whether a "model/shape" key is a decode row (one token per sequence)."""
    shape = key.rpartition("/")[2]
    return shape in SHAPES and is_decode(shape)


def ratio_table(results: dict, keys: list[str]) -> list[str]:
    """Per model and shape each target's ratio (ours / theirs; lower is better), then each ratio's
    geometric mean over the decode rows that have it (with how many)."""
    if not keys:
        return []
    legend = "; ".join(f"{what} {ours}/{theirs} <= {target:.2f}" for ours, theirs, what, target in TARGETS)
    heads = [f"{what[:3]} {SHORT[ours]}/{SHORT[theirs]}" for ours, theirs, what, _ in TARGETS]
    lines = [f"ratios, ours/theirs (lower is better; targets: {legend})",
             f"{'model/shape':15s} " + " ".join(f"{h:>12s}" for h in heads)]
    table = {key: [ratio(results, key, ours, theirs, what) for ours, theirs, what, _ in TARGETS] for key in keys}
    lines += [f"{key:15s} " + " ".join(fmt(r, "12.3f") for r in rs) for key, rs in table.items()]
    decode = [rs for key, rs in table.items() if decode_key(key)]
    means = [geomean([rs[i] for rs in decode]) for i in range(len(TARGETS))]
    cells = [(f"{m:.3f} ({n})" if m is not None else f"- ({n})").rjust(12) for m, n in means]
    return lines + [f"{'decode geomean':15s} " + " ".join(cells)] * bool(decode)


def geomean(values: list[float | None]) -> tuple[float | None, int]:
    """The geometric mean of the values present (None where none is), and how many there are."""
    there = [v for v in values if v is not None]
    return (math.exp(sum(map(math.log, there)) / len(there)) if there else None), len(there)


def floor_us(weight_bytes: int, copy_gbps: float) -> float:
    """µs to read the weights once at the measured copy bandwidth: a decode step's floor."""
    return weight_bytes / (copy_gbps * 1e3)


def floor_table(profile: dict) -> list[str]:
    """Per decode row of the profile phase: the weights read per step, the copy bandwidth, the
    floor, and each variant's GPU µs per step (its busy time, where the profile has it: early
    launches overlap) with its multiple of the floor."""
    rows = {k: r for k, r in sorted(profile.items()) if decode_key(k)}
    variants = [v for v in VARIANTS if any(isinstance(r.get(v), dict) for r in rows.values())]
    if not rows:
        return []
    lines = [f"{'decode floor':15s} {'weight MB':>9s} {'copy GB/s':>9s} {'floor us':>8s} "
             + " ".join(f"{v + ' us, xfloor':>22s}" for v in variants)]
    for key, r in rows.items():
        floor = floor_us(r["weight_bytes"], r["copy_gbps"]) if r.get("weight_bytes") and r.get("copy_gbps") else None
        cells = [fmt(r.get("weight_bytes") and r["weight_bytes"] / 1e6, "9.1f"), fmt(r.get("copy_gbps"), "9.1f"),
                 fmt(floor, "8.1f")]
        for v in variants:
            us = r.get(v, {}).get("busy_us", r.get(v, {}).get("gpu_us"))
            cells.append(f"{fmt(us, '14.1f')} " + (f"{us / floor:6.2f}x" if us and floor else f"{'-':>7s}"))
        lines.append(f"{key:15s} " + " ".join(cells) + (f"  [{r['error'][:200]}]" if "error" in r else ""))
    return lines


def counts(sites) -> dict | None:
    """How many sites of each kind (tuned, library, miss) a backend reported."""
    return None if sites is None else dict(Counter(kind for _, kind in sites))


def row(c: dict, t: dict) -> str:
    """One variant's cells: c from the compile phase, t from the latency phase."""
    sites = c.get("site_counts") if c.get("site_counts") is not None else t.get("site_counts")
    tuned = "-" if sites is None else "/".join(str(sites.get(k, 0)) for k in ("tuned", "library", "miss"))
    cells = [fmt(c.get("compile_s"), "9.1f"), fmt(t.get("latency_ms"), "10.3f"), fmt(t.get("x_default"), "8.3f"),
             fmt(t.get("x_reduce-overhead"), "8.3f"), f"{tuned:>14s}", fmt(t.get("rel_err", c.get("rel_err")), "8.1e")]
    errors = "; ".join(f"{p}: {r['error'][:200]}" for p, r in (("compile", c), ("latency", t)) if "error" in r)
    return " ".join(cells) + (f"  [{errors}]" if errors else "")


def tune_line(key: str, t: dict) -> str:
    """Exit, wall time, sites that chose the library, and the chosen implementations' time against
    the fastest alternatives', summed over the model's contractions."""
    tasks = [s for s in t.get("summary") or [] if s.get("final_ours_ms")]
    ours, alt = (sum(s["count"] * s[k] for s in tasks) for k in ("final_ours_ms", "best_alternative_ms"))
    library = sum(s["count"] for s in tasks if "library" in (s.get("best_config") or {}))
    checks = "; ".join(f"{c['mode']}: " + (c["error"][:100] if "error" in c else f"{c['winner']} "
                       f"({c['inductor_ms'] / c['tritune_ms']:.3f}x)" if c.get("winner") else "nothing tuned")
                       for c in t.get("model_check") or [])
    return f"tune {key}: exit {t['exit']}, {t['wall_s']:.0f} s, {len(t.get('summary') or [])} tasks" + (
        f", {library}/{sum(s['count'] for s in tasks)} sites chose the library; contractions {ours:.3f} ms "
        f"vs the best alternatives {alt:.3f} ms" if tasks else "") + (f"; whole-model check: {checks}" if checks else "")


def ratio(results: dict, key: str, ours: str, theirs: str, what: str) -> float | None:
    """Compile seconds over compile seconds; latencies paired by round (see model_bench's latency phase)."""
    rows = results.get(what, {}).get(key, {})
    if what == "latency":
        return rows.get("variants", {}).get(ours, {}).get(f"x_{theirs}")
    a, b = rows.get(ours, {}).get("compile_s"), rows.get(theirs, {}).get("compile_s")
    return a / b if a is not None and b else None


def overhead_line(r: dict) -> str:
    why = "; ".join(v if k == "error" else f"{k}: {v}" for k, v in r.items() if k.endswith("error"))
    if "overhead_us" not in r:
        timed = "".join(f"; {k[:-3]} {v:.2f} us per call" for k, v in r.items() if k.endswith("_us"))
        return "failed: " + (why or "no result") + timed
    extern = f", Inductor's default (extern mm) {r['extern_us']:.2f} us" if "extern_us" in r else ""
    return (f"tritune {r['tritune_us']:.2f} us, Inductor's Triton mm {r['inductor_us']:.2f} us{extern} per call: "
            f"{r['overhead_us']:+.2f} us (target <= 1.00); our kernel in the code: {r['tritune_as_intended']}, "
            f"Inductor's template in its code: {r['inductor_as_intended']}; sites {counts(r['sites'])}")


def fmt(value, spec: str) -> str:
    return format(value, spec) if value is not None else "-".rjust(int(spec.split(".")[0] or 1))


def merged(results: list[dict]) -> dict:
    """Several model_bench.json results as one: each phase's entries (by model and shape) together,
    a later file's replacing an earlier's; the other fields from the last file that has them."""
    out: dict = {}
    for r in results:
        for key, value in r.items():
            if key in ("tune", "compile", "latency", "profile"):
                out.setdefault(key, {}).update(value)
            else:
                out[key] = value
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python -m scripts.bench.model_table DIR/model_bench.json [...]", file=sys.stderr)
        return 2
    try:
        results = [json.loads(Path(path).read_text()) for path in paths]
    except (OSError, ValueError) as exc:
        print(f"model_table: {exc}", file=sys.stderr)
        return 2
    print(report(merged(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
