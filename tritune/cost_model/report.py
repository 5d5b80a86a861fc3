"""`tune-cli report`: cost-model accuracy from the tuning database, as a table, JSON and HTML + PNGs."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from tritune.cost_model.evaluate import (Dataset, convergence, cross_validate, learning_curve, load_datasets,
                                         transfer)
from tritune.cost_model.xgb import XGBCostModel
from tritune.records import files
from tritune.records.database import Database

SIZES = (16, 32, 64, 128, 256, 512, 1024)
SHOWN = ("spearman", "kendall", "pairwise", "recall@10", "peak@1", "peak@10", "failure_auc")
HEADERS = ("ρ", "τ", "pairs", "R@10", "peak@1", "peak@10", "fail AUC")
# every file a report may write (transfer.png only with two workloads or more)
FILES = ("report.json", "report.html", "scatter.png", "learning_curve.png", "transfer.png", "convergence.png")


class ReportError(ValueError):
    """Nothing to report on; the message is one line for the user."""


def build(db: Database, op: str | None = None, min_trials: int = 32, folds: int = 5, repeats: int = 3,
          sizes: Sequence[int] = SIZES, seed: int = 0) -> tuple[dict, list[Dataset], dict]:
    """All numbers of the report (JSON-ready), the datasets, and out-of-fold scores per dataset."""
    if op is not None and not db.workloads(op):
        known = sorted({w[1] for w in db.workloads()})
        raise ReportError(f"no workloads of op {op!r} in {db.path}; stored ops: {', '.join(known) or 'none'}")
    try:
        sets = load_datasets(db, op, min_trials)
    except (KeyError, ValueError, TypeError) as exc:  # a stored config or spec its op cannot read
        raise ReportError(f"cannot read the trials in {db.path}: a stored workload or config is damaged "
                          f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not sets:
        raise ReportError(f"no workload in {db.path} has {min_trials} or more trials on one device "
                          f"(tune with --trials {min_trials} or more, or lower --min-trials)")
    make = lambda: XGBCostModel(seed=seed)  # noqa: E731 - a factory of fresh models
    result, scores = {"workloads": {}}, {}
    for ds in sets:
        cv, scores[ds.name] = cross_validate(ds, make, folds, seed)
        result["workloads"][ds.name] = {
            "device": ds.device.gpu, "trials": int(len(ds.y)), "ok": int(ds.ok.sum()), "cross_validation": cv,
            "learning_curve": {str(n): m for n, m in learning_curve(ds, make, sizes, repeats, seed).items()},
        }
    result["transfer"] = transfer(sets, make) if len(sets) > 1 else None
    return result, sets, scores


def table(result: dict):
    """The terminal table: cross-validated metrics per workload, and transfer to it."""
    from rich.table import Table

    t = Table(title="cost model accuracy (k-fold cross-validation within each workload)",
              caption="ρ Spearman, τ Kendall, pairs: pairwise order accuracy, R@10: recall of the true top 10, "
                      "peak@k: best of the model's top k / best; transfer: trained on the other shapes")
    t.add_column("workload", no_wrap=True)
    for col in ("trials", *HEADERS, "transfer ρ"):
        t.add_column(col, justify="right")
    held = (result.get("transfer") or {}).get("held_out", {})
    for name, w in result["workloads"].items():
        cv = w["cross_validation"]
        t.add_row(name.replace("matmul ", ""), str(w["trials"]), *(_num(cv[m]) for m in SHOWN),
                  _num(held[name]["spearman"]) if name in held else "-")
    return t


def _num(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.3f}"


def clean(obj):
    """The result with NaN (a metric that is undefined, e.g. no failures) as None, for strict JSON."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return None if isinstance(obj, float) and obj != obj else obj


def write(result: dict, sets: list[Dataset], scores: dict, out: Path) -> list[Path]:
    """report.json, report.html and its PNG plots in `out` (made if missing), put there together
    once all are written (`records.files.filled`): a report stopped midway leaves `out` as it was."""
    with files.filled(out) as stage:
        (stage / "report.json").write_text(json.dumps(clean(result), indent=1, allow_nan=False))
        plots = _plots(result, sets, scores, stage)
        (stage / "report.html").write_text(_html(result, plots))
    return [out / "report.json", out / "report.html", *(out / p.name for p in plots)]


def _plots(result: dict, sets: list[Dataset], scores: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.8), squeeze=False)
    for ax, ds in zip(axes[0], sets):
        ax.scatter(scores[ds.name][ds.ok], ds.y[ds.ok], s=6, alpha=0.5)
        ax.set(title=ds.name, xlabel="predicted score (out of fold)", ylabel="measured throughput / best")
    paths.append(_save(fig, out / "scatter.png"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, w in result["workloads"].items():
        n = [int(k) for k in w["learning_curve"]]
        for ax, metric in zip(axes, ("spearman", "recall@10")):
            ax.plot(n, [w["learning_curve"][str(k)][metric] for k in n], marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set(xticks=n, xticklabels=[str(k) for k in n], xlabel="training trials", ylabel=metric,
                   title=f"learning curve: {metric}")
            ax.minorticks_off()
    axes[0].legend(fontsize=7)
    paths.append(_save(fig, out / "learning_curve.png"))
    if result["transfer"]:
        paths.append(_transfer_plot(result["transfer"], out / "transfer.png"))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for ds in sets:
        ax.plot(np.arange(1, len(ds.times) + 1), convergence(ds), label=ds.name)
    ax.set(xlabel="trial", ylabel="best so far / best", title="stored tuning runs", xscale="log")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "convergence.png"))
    return paths


def _transfer_plot(tr: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(tr["names"]) + 3, 1.3 * len(tr["names"]) + 2))
    im = ax.imshow(np.array(tr["matrix"]), vmin=-1, vmax=1, cmap="RdBu")
    short = [n.replace("matmul ", "") for n in tr["names"]]
    ax.set(xticks=range(len(short)), yticks=range(len(short)), xlabel="tested on", ylabel="trained on",
           title="transfer: Spearman ρ")
    ax.set_xticklabels(short, rotation=30, ha="right", fontsize=7)
    ax.set_yticklabels(short, fontsize=7)
    for (i, j), v in np.ndenumerate(np.array(tr["matrix"])):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _html(result: dict, plots: list[Path]) -> str:
    held = (result.get("transfer") or {}).get("held_out", {})
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{w['trials']}</td>"
        + "".join(f"<td>{_num(w['cross_validation'][m])}</td>" for m in SHOWN)
        + f"<td>{_num(held[name]['spearman']) if name in held else '-'}</td></tr>"
        for name, w in result["workloads"].items())
    head = "".join(f"<th>{m}</th>" for m in ("workload", "trials", *HEADERS, "transfer ρ"))
    images = "".join(f'<h2>{p.stem.replace("_", " ")}</h2><img src="{p.name}" alt="{p.stem}">' for p in plots)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tritune cost-model report</title>"
            f"<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;text-align:right}}"
            f"img{{max-width:100%}}</style></head><body><h1>Cost-model accuracy</h1>"
            f"<p>k-fold cross-validation within each workload; numbers in report.json.</p>"
            f"<table><tr>{head}</tr>{rows}</table>{images}</body></html>")
