"""Simulated annealing and the model-based strategy, driven by a fake model with a known optimum."""
import numpy as np
import pytest

from tritune.records.result import MeasureResult, Status
from tritune.schedules.contraction import contraction_space
from tritune.schedules.space import Limits
from tritune.cost_model.dataset import Prior
from tritune.search import make_strategy
from tritune.search.model_based import diverse_pick
from tritune.search.annealing import SimulatedAnnealing

SPACE = contraction_space(4096, 4096, 4096, 2, Limits.for_capability(9, 0))
TARGET = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "UNROLL": 1,
          "SPLIT_K": 1, "TMA": 0, "PERSISTENT": 1, "WARP_SPEC": 0}
KNOBS = list(TARGET)


def distance(c):
    """How many knob steps a config is from TARGET."""
    return sum(abs(k.values.index(c[k.name]) - k.values.index(TARGET[k.name])) for k in SPACE.knobs)


def knob_rows(configs):
    """Features for the fake model: the knob positions."""
    return np.array([[k.values.index(c[k.name]) for k in SPACE.knobs] for c in configs], dtype=np.float32)


class FakeModel:
    """Predicts minus the distance to TARGET from knob positions; records its fits."""

    def __init__(self):
        self.fits = []
        self.target = np.array([k.values.index(TARGET[k.name]) for k in SPACE.knobs])

    def fit(self, X, y, groups=None, base_margin=None):
        self.fits.append((len(y), len(set(np.asarray(groups).tolist()))))
        self.margins = base_margin
        return self

    def predict(self, X, base_margin=None):
        return -np.abs(np.asarray(X) - self.target).sum(axis=1) + (0 if base_margin is None else base_margin)


def test_annealing_finds_the_optimum_of_a_score():
    assert SPACE.valid(SPACE.config(SPACE.index(SPACE.sample(np.random.default_rng(0), 1)[0])))
    sa = SimulatedAnnealing(SPACE, np.random.default_rng(0), n_chains=16, n_steps=200, patience=200)
    score = lambda cs: -np.array([distance(c) for c in cs], dtype=float)
    top = sa.top(score, 5, exclude=set())
    assert distance(top[0][1]) == 0 and [s for s, _ in top] == sorted((s for s, _ in top), reverse=True)
    assert len(sa.chains) == 16  # chains persist for the next call
    again = sa.top(score, 5, exclude={top[0][1]})
    assert top[0][1] not in {c for _, c in again} and distance(again[0][1]) == 1


def test_model_based_strategy_follows_its_model_and_refits_each_round():
    model = FakeModel()
    s = make_strategy("sa", SPACE, seed=3, features=knob_rows, model=model, plan_size=8, eps=0.0, min_train=8)
    first = s.propose(8)  # nothing measured: random
    s.update([MeasureResult(c, Status.OK, t_median=1.0 + distance(c)) for c in first])
    best_before = min(distance(c) for c in first)
    for _ in range(3):
        batch = s.propose(8)
        assert len(batch) == 8 and not set(batch) & {r.config for r in s.results}
        s.update([MeasureResult(c, Status.OK, t_median=1.0 + distance(c)) for c in batch])
    assert [n for n, _ in model.fits] == [8, 16, 24]  # one refit per round, on everything measured
    assert min(distance(r.config) for r in s.results) < best_before
    assert min(distance(r.config) for r in s.results) <= 1


def test_warm_start_proposes_from_the_prior_then_corrects_it_with_own_trials():
    prior_model, model = FakeModel(), FakeModel()
    prior = Prior(X=np.zeros((5, len(KNOBS)), dtype=np.float32), y=np.linspace(0, 1, 5), groups=np.zeros(5))
    s = make_strategy("sa", SPACE, seed=0, features=knob_rows, model=model, prior_model=prior_model, prior=prior,
                      eps=0.0, plan_size=8)
    batch = s.propose(8)
    assert prior_model.fits == [(5, 1)] and model.fits == []  # the prior's model alone picks the first round
    assert np.mean([distance(c) for c in batch]) < np.mean([distance(c) for c in SPACE.sample(np.random.default_rng(0), 8)])
    s.update([MeasureResult(c, Status.OK, t_median=1.0) for c in batch])
    s.propose(8)
    assert prior_model.fits == [(5, 1)]  # fitted once
    assert model.fits == [(8, 1)]  # own trials only, starting from the prior model's scores
    assert np.allclose(model.margins, prior_model.predict(knob_rows(batch)))


@pytest.mark.system
def test_the_prior_moves_the_first_round_of_the_real_model():
    """XGBoost with a base margin: a prior that rates one knob value best steers the first round to it."""
    space = contraction_space(4096, 4096, 4096, 2, Limits.for_capability(9, 0))
    configs = space.sample(np.random.default_rng(5), 300)
    X = knob_rows(configs)
    y = np.array([float(c["BLOCK_N"] == 256 and c["num_warps"] == 8) for c in configs], dtype=np.float32)
    s = make_strategy("sa", space, seed=0, features=knob_rows, prior=Prior(X, y, np.zeros(len(y))), eps=0.0)
    batch = s.propose(8)
    assert sum(c["BLOCK_N"] == 256 and c["num_warps"] == 8 for c in batch) >= 6, batch


def test_diverse_pick_prefers_new_knob_values():
    configs = SPACE.sample(np.random.default_rng(1), 20)
    ranked = [(float(-i), c) for i, c in enumerate(configs)]
    assert diverse_pick(ranked, 5, weight=0.0) == configs[:5]
    diverse = diverse_pick(ranked, 5, weight=5.0)
    assert diverse[0] == configs[0] and len(set(diverse)) == 5
    covered = lambda cs: len({(k, c[k]) for c in cs for k in c})
    assert covered(diverse) >= covered(configs[:5])
