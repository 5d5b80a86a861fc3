"""Search strategies compared on real H100 measurements (recorded spaces), through the real loop."""
from pathlib import Path

import numpy as np
import pytest

from tritune.records.database import Database
from tritune.records.result import DeviceKey
from tritune.search import make_strategy
from tritune.tuner.recorded import Recording, RecordedBuilder, RecordedRunner
from tritune.tuner.tuner import Tuner, best_of

SPACES = Path(__file__).parent / "fixtures" / "spaces"
SEEDS = range(5)
BUDGET = 64


def best_at_budget(recording, name, seed, tmp_path):
    task = recording.task(DeviceKey("recorded", "9.0", "-", "-", "-"))
    strategy = make_strategy(name, task.space, seed=seed, features=task.featurize)
    runner = RecordedRunner(recording)
    db = Database(tmp_path / f"{name}-{seed}.db")
    history = Tuner(task, strategy, RecordedBuilder(), runner, db, batch_size=8).run(BUDGET)
    assert len(runner.measured) == BUDGET == len(set(runner.measured))
    return recording.best_ms / best_of(history).t_median


@pytest.fixture(scope="module", params=sorted(p.name for p in SPACES.glob("*.jsonl.gz")))
def recording(request):
    rec = Recording.load(SPACES / request.param)
    task = rec.task(DeviceKey("recorded", "9.0", "-", "-", "-"))
    # the recording holds the whole space: if the space changes, record again
    assert {task.space.config(int(i)) for i in task.space.valid_indices} == set(rec.rows)
    return request.param, rec


def test_sa_finds_98_percent_of_the_best_in_64_trials_and_beats_random(recording, tmp_path, request):
    name, rec = recording
    if name.startswith("space_3000x5000x1000"):
        # one config within 2% of the best (2 stages x unroll 4 x 8 warps on 256x64x32): the model
        # does not single it out in 64 trials yet (0/5 seeds); strict, so the day it does, this fails
        request.applymarker(pytest.mark.xfail(strict=True, reason="odd-sized space: needle not found"))
    sa = np.array([best_at_budget(rec, "sa", s, tmp_path) for s in SEEDS])
    rnd = np.array([best_at_budget(rec, "random", s, tmp_path) for s in SEEDS])
    assert (sa >= 0.98).sum() >= 4, sa
    assert sa.mean() > rnd.mean(), (sa, rnd)
