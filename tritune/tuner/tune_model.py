"""`tune-cli tune-model`: the workloads of a model (contractions with their fused epilogues, gated
pairs act(x @ W1ᵀ) * (x @ W2ᵀ) as one `gated` workload each), one trial budget shared among them,
and each tuned in turn by `session.tune` (progress and a table per task).

The model comes from a factory, `pkg.module:factory` or `path/to/file.py:factory`, built on the
meta device and given uninitialised storage on the device it would run on (no weights are
initialised, nothing is computed), then captured by `tritune.extract_tasks`.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tritune.kernels.expr import ExprError, check_dtype, parse_dims, torch_dtype
from tritune.kernels.family import expr_from_dict
from tritune.kernels.frontend.extract import first_line

MIN_TRIALS = 16  # each task gets at least this many (when the budget allows): a first round plus a model fit


class ModelError(ValueError):
    """A model spec, input shape or dtype that cannot be used (the message is one line)."""


@dataclass(frozen=True)
class Planned:
    """One task of the model and the trials it gets."""

    task: Any  # extract.ModelTask
    trials: int
    share: float  # of the model's contraction FLOPs


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by 'pkg.module:factory' or 'path/to/file.py:factory'."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ModelError(f"bad --model {spec!r}: expected pkg.module:factory or path/to/file.py:factory")
    try:
        module = _load_file(where) if where.endswith(".py") else importlib.import_module(where)
    except ModelError:
        raise
    except Exception as exc:  # any import-time failure of the user's module
        raise ModelError(f"cannot import {where!r}: {first_line(exc)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ModelError(f"{where!r} has no callable {name!r}")
    return factory


def _load_file(path: str) -> Any:
    if not Path(path).is_file():
        raise ModelError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"tritune_model_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_shapes(texts: Sequence[str]) -> list[tuple[int, ...]]:
    """'1,2048,4096' (or 1x2048x4096) per model input -> shapes."""
    try:
        return [tuple(parse_dims(t, range(1, 9), "up to 8 sizes")) for t in texts]
    except ExprError as exc:
        raise ModelError(str(exc).replace("--shape", "--input-shape")) from None


def build(factory: Callable[[], Any], shapes: Sequence[tuple[int, ...]], dtype: str, device: str) -> tuple[Any, tuple]:
    """The model (uninitialised storage on `device`, in `dtype`, eval mode) and empty inputs of those shapes."""
    import torch

    try:
        check_dtype(dtype)
    except ExprError as exc:
        raise ModelError(str(exc)) from None
    try:
        with torch.device("meta"):
            model = factory()
        if not isinstance(model, torch.nn.Module):
            raise ModelError(f"the factory returned a {type(model).__name__}, not a torch.nn.Module")
        model = model.to_empty(device=device).to(torch_dtype(dtype)).eval()
    except ModelError:
        raise
    except Exception as exc:  # the user's constructor
        raise ModelError(f"the model factory failed: {first_line(exc)}") from None
    inputs = tuple(torch.empty(s, dtype=torch_dtype(dtype), device=device) for s in shapes)
    return model, inputs


def model_tasks(spec: str, input_shapes: Sequence[str], dtype: str, device: str | None = None) -> list:
    """Load, build and capture a model: its tasks (ModelError for anything the user can fix)."""
    import torch

    from tritune.kernels.frontend.extract import ExtractError, extract_tasks

    shapes = parse_shapes(input_shapes)
    model, inputs = build(load_factory(spec), shapes, dtype, device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        tasks = extract_tasks(model, inputs)
    except ExtractError as exc:
        raise ModelError(str(exc)) from None
    if not tasks:
        raise ModelError("the model runs no contraction (mm, addmm, bmm, baddbmm, matmul, linear) tritune can tune")
    return tasks


def plan(tasks: Sequence[Any], total: int, floor: int = MIN_TRIALS) -> list[Planned]:
    """Share `total` trials: each task gets min(floor, total // tasks), the rest goes by share of the
    model's FLOPs (where its time goes); largest share first, so that later tasks warm-start from it."""
    flops = sum(t.flops for t in tasks)
    base = min(floor, total // len(tasks))
    extra = [(total - base * len(tasks)) * t.flops / flops for t in tasks]
    trials = [base + int(e) for e in extra]
    # largest remainders get the trials that rounding down left over
    for i in sorted(range(len(tasks)), key=lambda i: int(extra[i]) - extra[i])[:total - sum(trials)]:
        trials[i] += 1
    planned = [Planned(t, n, t.flops / flops) for t, n in zip(tasks, trials)]
    return sorted(planned, key=lambda p: -p.task.flops)


def plan_table(planned: Sequence[Planned]) -> Any:
    """The plan as a table: workload, count, FLOP share, trials."""
    from rich.table import Table

    table = Table(title="tune-model: tasks")
    for col in ("#", "workload", "count", "FLOPs", "trials", "not fused"):
        table.add_column(col, justify="left" if col in ("workload", "not fused") else "right")
    for i, p in enumerate(planned, 1):
        table.add_row(str(i), p.task.expr.describe(), str(p.task.count), f"{p.share:.0%}", str(p.trials),
                      ", ".join(p.task.unfused))
    return table


def result_table(summaries: Sequence[dict]) -> Any:
    """The model's workloads after tuning: the best found (a tritune kernel, or the library where it
    won) against the fastest alternative without tritune, and what a compiled model will run."""
    from rich.table import Table

    table = Table(title="tuned workloads: the best against the fastest alternative (timed in turns)")
    for col in ("workload", "count", "best", "ms", "fastest alternative", "ms", "speed-up", "compiled model runs"):
        table.add_column(col)
    for s in summaries:
        expr = expr_from_dict(s["workload"])
        if not s.get("best_config"):
            table.add_row(expr.describe(), str(s["count"]), "nothing ran", "", "", "", "", "Inductor's choice")
            continue
        library = s["best_config"].get("library")
        table.add_row(expr.describe(), str(s["count"]), f"library {library}" if library else "tritune kernel",
                      f"{s['final_ours_ms']:.4f}", s["best_alternative"], f"{s['best_alternative_ms']:.4f}",
                      f"{s['ratio_vs_best_alternative']:.3f}x", "Inductor's choice" if library else "tritune kernel")
    return table


def tune_all(planned: Sequence[Planned], db: Any, options: Any, gpu: Any = None) -> list[dict]:
    """Tune each planned task with its trials (`session.tune_all`, which resumes stored ones) on a
    started GPU session (else one of its own); summaries."""
    from tritune.tuner import display
    from tritune.tuner.session import tune_all

    todo = [(i, p) for i, p in enumerate(planned, 1) if p.trials > 0]

    def announce(j: int, expr: Any, trials: int) -> None:
        i, p = todo[j]
        display.console.print(f"[bold]task {i}/{len(planned)}[/bold]: {p.task.describe()}, {trials} trials")

    summaries = tune_all([p.task.expr for _, p in todo], db, options, [p.trials for _, p in todo], announce, gpu)
    return [{"count": p.task.count, **s} for (_, p), s in zip(todo, summaries)]


def check(spec: str, input_shapes: Sequence[str], dtype: str, db_path: Any) -> list[dict]:
    """The whole model compiled with and without its tuned kernels, timed in each mode (a child
    process); graph verdicts stored; the table printed; the per-mode results."""
    from tritune.settings import SETTINGS
    from tritune.tuner import display
    from tritune.tuner.model_check import check_model, check_table

    if SETTINGS.fake_gpu:  # a stand-in GPU has nothing to compile a model for
        display.console.print("the whole-model check needs a real GPU: skipped")
        return []
    display.console.print("[bold]checking the whole model[/bold]: compiled by Inductor, with and without the tuned kernels")
    results = check_model(spec, input_shapes, dtype, db_path)
    display.out.print(check_table(results))
    return results
