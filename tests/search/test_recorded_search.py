"""Search strategies compared on real GPU measurements (the recordings shipped with tritune),
through the real loop. `sa` runs as `tune-cli run` runs it: warm-started by the other shipped
recordings (never the one being searched); `sa` cold, with no prior, is checked too."""
from pathlib import Path

import numpy as np
import pytest

from tritune.kernels.contraction.expr import Matmul
from tritune.records.database import Database
from tritune.records.result import DeviceKey
from tritune.search import make_strategy
from tritune.tuner.prior import bundled_prior, prior_for
from tritune.tuner.recordings import BUNDLED, Recording, RecordedBuilder, RecordedRunner
from tritune.tuner.task import Task, best_of
from tritune.tuner.tuner import Tuner

SPACES = Path(__file__).parents[1] / "fixtures" / "spaces"
LEGACY = SPACES / "legacy"
SEEDS = range(5)  # cold sa and random
WARM_SEEDS = range(10)  # warm sa, as `tune-cli run` runs it: >= 0.98 of the best in >= 9 of 10
BUDGET = 64
GATED_BUDGET = 57  # what tune-model's default budget gives the zoo llama's gated pair at 16 rows
WIDE_BUDGET = 38  # and its q/k/v


def best_at_budget(recording, name, seed, tmp_path, prior=None, budget=BUDGET):
    task = recording.task(DeviceKey("recorded", "9.0", "-", "-", "-"))
    strategy = make_strategy(name, task.space, seed=seed, features=task.featurize, prior=prior)
    runner = RecordedRunner(recording)
    db = Database(tmp_path / f"{name}-{seed}-{'warm' if prior else 'cold'}.db")
    history = Tuner(task, strategy, RecordedBuilder(), runner, db, batch_size=8).run(budget)
    assert len(runner.measured) == budget == len(set(runner.measured))
    return recording.best_ms / best_of(history).t_median


@pytest.fixture(scope="module", params=sorted(p.name for p in BUNDLED.glob("*.jsonl.gz")))
def recording(request):
    rec = Recording.load(BUNDLED / request.param)
    task = rec.task(DeviceKey("recorded", "9.0", "-", "-", "-"))
    # search replays the recorded configs that today's space still holds: at least 2000 of them,
    # the recorded best among them (if the space moves further from its recordings, record again)
    assert len(task.space.valid_indices) >= 2000
    assert task.space.valid(rec.best_config)
    return request.param, rec


@pytest.mark.system
def test_warm_sa_finds_98_percent_of_the_best_in_64_trials_in_9_of_10_seeds_and_beats_random(recording, tmp_path):
    _, rec = recording
    prior = bundled_prior(rec.task(DeviceKey("recorded", rec.device["capability"], "-", "-", "-")))
    assert prior is not None and len(np.unique(prior.groups)) == 2  # the other two workloads
    sa = np.array([best_at_budget(rec, "sa", s, tmp_path, prior) for s in WARM_SEEDS])
    cold = np.array([best_at_budget(rec, "sa", s, tmp_path) for s in SEEDS])
    rnd = np.array([best_at_budget(rec, "random", s, tmp_path) for s in SEEDS])
    assert (sa >= 0.98).sum() >= 9, sa
    assert sa.mean() > rnd.mean() and cold.mean() > rnd.mean(), (sa, cold, rnd)


def pipelined(tmp_path, runner, workers):
    """Warm sa on the recording most sensitive to the model's lag (the skinny 16x4096x4096: at 64
    trials, 26 in flight cost 6 of 10 seeds their 98%) at `tune-cli run`'s 128 trials, with a
    pool of `workers` processes and `runner(rec)` measuring: the share of the best each seed
    found, and the most candidates that were in flight."""
    rec = Recording.load(BUNDLED / "space_16x4096x4096_fp16.jsonl.gz")
    task = rec.task(DeviceKey("recorded", "9.0", "-", "-", "-"))
    prior = bundled_prior(rec.task(DeviceKey("recorded", rec.device["capability"], "-", "-", "-")))
    builder = RecordedBuilder()
    builder.workers = workers
    found, deepest = [], 0
    for seed in WARM_SEEDS:
        strategy = make_strategy("sa", task.space, seed=seed, features=task.featurize, prior=prior)
        tuner = Tuner(task, strategy, builder, runner(rec), Database(tmp_path / f"{seed}.db"), batch_size=8)
        found.append(rec.best_ms / best_of(tuner.run(128)).t_median)
        deepest = max(deepest, tuner.most_in_flight)
    return np.array(found), deepest


@pytest.mark.system
def test_warm_sa_keeps_its_quality_with_the_pipeline_a_16_process_pool_fills(tmp_path):
    """At `tune-cli run`'s budget of 128 trials, a pool of 16 processes keeps up to 24 candidates in
    flight (`tuner.in_flight_target`): the model lags three rounds behind, not one. The same bar:
    >= 0.98 of the best in >= 9 of 10 seeds."""
    found, deepest = pipelined(tmp_path, RecordedRunner, 16)
    assert deepest > 2 * 8, deepest
    assert (found >= 0.98).sum() >= 9, found


class TwoGPUs(RecordedRunner):
    """The recording served as two GPUs would measure it (the loop counts two GPUs' share of the
    budget in flight), one candidate at a time so that the search stays deterministic."""

    gpus = 2


@pytest.mark.system
def test_warm_sa_keeps_its_quality_with_the_pipeline_two_gpus_and_a_32_process_pool_fill(tmp_path):
    """Two GPUs (`run --devices all` on a host of 32 cores) keep up to 40 candidates in flight at
    128 trials (each GPU an eighth of the budget, 32, and a round more): the same bar, >= 0.98 of
    the best in >= 9 of 10 seeds (measured: 10 of 10 on each shipped recording)."""
    found, deepest = pipelined(tmp_path, TwoGPUs, 32)
    assert deepest == 2 * 128 // 8 + 8, deepest
    assert (found >= 0.98).sum() >= 9, found


@pytest.mark.system
def test_cold_sa_on_the_normed_gated_decode_space_at_tune_models_budget(tmp_path):
    """The whole space of a decode gate/up pair read through an RMSNorm (llama's 16x5632x2048; H100,
    every one of its 3680 configs measured): 13 configs within 5% of the best, 6 within 2%. At the
    57 trials tune-model's default budget gives it, cold sa (no gated measurements to learn from)
    found 0.906-0.998 of the best (mean 0.967) before the space's weight-streaming seeds; with them,
    0.973-1.0 (mean 0.997). The seeds' tiles were chosen with this recording and the q/k/v one
    below in view; the skinny GEMM's test is their check on a space they were not chosen from."""
    rec = Recording.load(SPACES / "gated_16x5632x2048_rmsnorm_fp16.jsonl.gz")
    assert len(rec.task(DeviceKey("recorded", "9.0", "-", "-", "-")).space.valid_indices) == len(rec.rows)
    sa = np.array([best_at_budget(rec, "sa", s, tmp_path, budget=GATED_BUDGET) for s in range(10)])
    rnd = np.array([best_at_budget(rec, "random", s, tmp_path, budget=GATED_BUDGET) for s in range(10)])
    assert sa.mean() >= 0.99 and sa.min() >= 0.95 and sa.mean() > rnd.mean(), (sa, rnd)


@pytest.mark.system
def test_sa_on_the_gated_decode_space_warm_started_by_the_plain_gemm_recordings(tmp_path):
    """With no gated measurements to learn from, a gated search learns from the plain GEMMs'
    (`Family.prior_from`): here the three shipped matmul recordings, lifted into gated features.
    On the recorded llama pair at tune-model's 57 trials, sa then found 0.972-1.0 of the best
    (mean 0.990) where cold it found 0.906-0.998 (mean 0.967), both before the space's seeds;
    with them, 1.0 in every seed (cold: the test above)."""
    rec = Recording.load(SPACES / "gated_16x5632x2048_rmsnorm_fp16.jsonl.gz")
    task = rec.task(DeviceKey("recorded", rec.device["capability"], "-", "-", "-"))
    prior = prior_for(Database(tmp_path / "fresh.db"), task)
    assert len(np.unique(prior.groups)) == len(list(BUNDLED.glob("*.jsonl.gz")))
    assert prior.X.shape[1] == task.featurize([rec.best_config]).shape[1]
    sa = np.array([best_at_budget(rec, "sa", s, tmp_path, prior, budget=GATED_BUDGET) for s in range(10)])
    assert sa.mean() >= 0.985 and sa.min() >= 0.95, sa


@pytest.mark.system
def test_cold_sa_on_the_normed_wide_decode_space_at_tune_models_budget(tmp_path):
    """The TMA-free half of a decode q/k/v space read through an RMSNorm (llama's 16x(2048+512+512)x2048;
    H100, all 2528 of its configs measured): one config stands out, 7.95 us (BLOCK_N 32, BLOCK_K
    256, 6 stages, 2 warps), the next 8.34 us. At the 38 trials tune-model gives it, cold sa found
    0.805-0.924 of it (mean 0.875; random 0.820) before the space's weight-streaming seeds; the
    first seed is that config. In-sample: the seeds were chosen with this recording in view."""
    rec = Recording.load(SPACES / "wide_16x3072x2048_rmsnorm_fp16_tma0.jsonl.gz")
    sa = np.array([best_at_budget(rec, "sa", s, tmp_path, budget=WIDE_BUDGET) for s in range(10)])
    rnd = np.array([best_at_budget(rec, "random", s, tmp_path, budget=WIDE_BUDGET) for s in range(10)])
    assert sa.mean() >= 0.95 and sa.mean() > rnd.mean() + 0.04, (sa, rnd)


@pytest.mark.system
def test_cold_sa_on_a_skinny_gemm_the_seeds_were_not_chosen_from(tmp_path):
    """The shipped 16x4096x4096 recording (a sample of its space: its deepest weight-streaming
    pipelines are 5 stages at BLOCK_K 256, and 2 at BLOCK_N 16), searched cold at decode's small
    budgets. Before the space's weight-streaming seeds: 0.880 of the best at 24 trials (min
    0.808), 0.963 at 38 (min 0.878); random 0.865 at 24. With them: 0.946 (min 0.913) and 0.994."""
    rec = Recording.load(BUNDLED / "space_16x4096x4096_fp16.jsonl.gz")
    found = {budget: np.array([best_at_budget(rec, "sa", s, tmp_path / str(budget), budget=budget) for s in range(10)])
             for budget in (24, 38)}
    assert found[24].mean() >= 0.93 and found[24].min() >= 0.9 and found[38].mean() >= 0.98, found


@pytest.mark.xfail(strict=True, reason="plain-tiling odd space: its one config within 2% is not predictable")
@pytest.mark.system
def test_legacy_plain_tiling_odd_space(tmp_path):
    """The odd shape over plain tiling (before TMA and the persistent loop; H100). Its best, 256x64x32
    on 8 warps with 2 stages and unroll 4, is 7x faster than the same tile on 4 warps and 1.5x faster
    than on 16: no neighbour hints at it, and sa finds it in 1 of 10 seeds (as random does). Strict:
    the day a model singles it out, this fails and the marker goes."""
    rec = Recording.load(LEGACY / "space_3000x5000x1000_plain_fp16.jsonl.gz")
    sa = np.array([best_at_budget(rec, "sa", s, tmp_path) for s in SEEDS])
    assert (sa >= 0.98).sum() >= 4, sa


def test_the_shipped_prior_leaves_out_the_tuned_workload_and_other_gpu_generations():
    recs = {r.expr.key: r for r in (Recording.load(p) for p in BUNDLED.glob("*.jsonl.gz"))}
    some = next(iter(recs.values()))
    task = lambda expr, cap: Task(expr, DeviceKey("any", cap, "-", "-", "-"), some.limits)
    own = bundled_prior(task(some.expr, "9.0"))
    assert len(own.y) == sum(len(r.rows) for k, r in recs.items() if k != some.expr.key)
    other = bundled_prior(task(Matmul(1024, 2048, 512), "9.0"))
    assert len(np.unique(other.groups)) == len(recs) and other.y.max() == 1.0
    assert bundled_prior(task(some.expr, "8.0")) is None  # an A100 learns nothing from Hopper timings


def test_merge_recordings_joins_parts_and_refuses_overlaps(tmp_path, capsys):
    import gzip
    import json

    from tritune.tuner.cli import main

    src = LEGACY / "space_4096_plain_fp16.jsonl.gz"
    with gzip.open(src, "rt") as fp:
        meta, rows = fp.readline(), fp.readlines()
    parts = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path, chunk in zip(parts, (rows[:300], rows[300:])):
        path.write_text(meta + "".join(chunk))
    out = tmp_path / "all.jsonl.gz"
    main(["recording", "merge", str(out), *map(str, parts)])
    merged, original = Recording.load(out), Recording.load(src)
    assert merged.rows == original.rows and merged.expr == original.expr
    with gzip.open(out, "rt") as fp:
        assert json.loads(fp.readline())["meta"]["space_valid"] == len(rows)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["recording", "merge", str(out), str(parts[0]), str(parts[0])])
    assert stop.value.code == 2 and capsys.readouterr().err == "tune-cli: a config is in more than one part\n"
