"""`tune-cli tune-model`'s plan: the workloads of a model (contractions with their fused epilogues,
gated pairs act(x @ W1ᵀ) * (x @ W2ᵀ) as one `gated` workload each, projections of one input as one
`wide` workload) share one trial budget, by where the model's FLOPs go (`plan`); each is then
tuned in turn by the run (`tuner.run.tune_all`), which resumes what is stored.

The model comes from a factory (`model.load`), captured by `tritune.extract_tasks`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tritune.tuner.run import SILENT, Report, tune_all

MIN_TRIALS = 16  # each task gets at least this many (when the budget allows): a first round plus a model fit


@dataclass(frozen=True)
class Planned:
    """One task of the model and the trials it gets."""

    task: Any  # extract.ModelTask
    trials: int
    share: float  # of the model's contraction FLOPs


def plan(tasks: Sequence[Any], total: int, floor: int = MIN_TRIALS) -> list[Planned]:
    """Share `total` trials: each task gets min(floor, total // tasks), the rest in proportion to the
    square root of its share of the model's FLOPs (where its time goes); largest share first, so
    that later tasks warm-start from it.

    Why the root: a search's shortfall from the best it would find falls off about as 1 / trials,
    and the split that minimises the model's summed shortfall, sum(share / trials), gives each task
    trials in proportion to the root of its share. So measured at decode: LM heads holding 42-64% of
    the FLOPs came within 3% of their best in 2-12 of their 83-140 trials, while the gated, q/k/v
    and output projections still improved in their last few."""
    weights = [math.sqrt(t.flops) for t in tasks]
    flops = sum(t.flops for t in tasks)
    base = min(floor, total // len(tasks))
    extra = [(total - base * len(tasks)) * w / sum(weights) for w in weights]
    trials = [base + int(e) for e in extra]
    # largest remainders get the trials that rounding down left over
    for i in sorted(range(len(tasks)), key=lambda i: int(extra[i]) - extra[i])[:total - sum(trials)]:
        trials[i] += 1
    planned = [Planned(t, n, t.flops / flops) for t, n in zip(tasks, trials)]
    return sorted(planned, key=lambda p: -p.task.flops)


def tune_planned(planned: Sequence[Planned], db: Any, options: Any, gpu: Any = None, report: Report = SILENT,
                 announce: Callable[[int, int, Planned, int], None] | None = None) -> list[dict]:
    """Tune each planned task with its trials (`run.tune_all`, which resumes stored ones) on a
    started GPU session (else one of its own); summaries, each with the task's count.
    `announce(i, n, planned, trials)` runs as the i-th of n tasks starts."""
    todo = [(i, p) for i, p in enumerate(planned, 1) if p.trials > 0]

    def started(j: int, expr: Any, trials: int) -> None:
        if announce is not None:
            announce(todo[j][0], len(planned), todo[j][1], trials)

    summaries = tune_all([p.task.expr for _, p in todo], db, options, [p.trials for _, p in todo], started, gpu, report)
    return [{"count": p.task.count, **s} for (_, p), s in zip(todo, summaries)]
