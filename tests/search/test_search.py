"""Contract tests run for every registered strategy, plus the registry itself."""
import pytest

from functools import partial

from tritune.kernels.contraction.features import features
from tritune.kernels.contraction.expr import Matmul
from tritune.records.result import MeasureResult, Status
from tritune.schedules.contraction import contraction_space
from tritune.schedules.space import Limits
from tritune.search import REGISTRY
from tritune.search import make_strategy as _make

H100 = Limits.for_capability(9, 0)
SPACE = contraction_space(512, 384, 256, 2, H100)


def make_strategy(name, space, seed=0):
    """Every strategy gets what the tuner gives it: the task's feature function."""
    return _make(name, space, seed=seed, features=partial(features, Matmul(512, 384, 256), H100))


def fake_results(configs):
    return [MeasureResult(c, Status.OK, t_median=float(i + 1)) for i, c in enumerate(configs)]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.system) if n == "sa" else n  # a long search
                                  for n in sorted(REGISTRY)])
def test_proposals_are_valid_distinct_and_never_repeat(name):
    s = make_strategy(name, SPACE, seed=1)
    seen = set()
    for _ in range(4):
        batch = s.propose(16)
        assert len(batch) == 16 and len(set(batch)) == 16
        assert all(SPACE.valid(c) for c in batch)
        assert not seen & set(batch)
        seen |= set(batch)
        s.update(fake_results(batch))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.system) if n == "sa" else n  # a long search
                                  for n in sorted(REGISTRY)])
def test_stored_results_are_not_proposed_again(name):
    first = make_strategy(name, SPACE, seed=2).propose(10)
    resumed = make_strategy(name, SPACE, seed=2)
    resumed.update(fake_results(first))
    assert not set(resumed.propose(10)) & set(first)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_same_seed_same_proposals(name):
    assert make_strategy(name, SPACE, seed=7).propose(12) == make_strategy(name, SPACE, seed=7).propose(12)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_exhausting_the_space_returns_fewer_then_none(name):
    tiny = contraction_space(1, 1, 1, 2, H100)
    s = make_strategy(name, tiny, seed=0)
    got = s.propose(1000)
    assert len(got) == len(tiny.valid_indices)
    assert s.propose(5) == []


def test_random_differs_by_seed_and_grid_is_in_index_order():
    assert make_strategy("random", SPACE, seed=1).propose(8) != make_strategy("random", SPACE, seed=2).propose(8)
    grid = make_strategy("grid", SPACE).propose(8)
    assert [SPACE.index(c) for c in grid] == [int(i) for i in SPACE.valid_indices[:8]]


def test_unknown_strategy_names_the_known_ones():
    with pytest.raises(ValueError, match="random"):
        _make("annealing-by-hand", SPACE)
    with pytest.raises(ValueError, match="features"):
        _make("sa", SPACE)


@pytest.mark.system
def test_a_search_resumed_from_trials_outside_its_space_learns_from_them_and_proposes_within_it():
    # stored trials whose configs the space does not hold (another run's knob values, e.g. a deeper
    # pipeline; the fastest among them): the model learns from them, but annealing neither starts
    # from them nor walks around them
    import numpy as np

    from tritune.kernels.family import family
    from tritune.schedules.config import Config

    fam, expr = family("matmul"), Matmul(16, 2048, 5632, trans_b=True)
    plain = fam.space(expr, H100)
    sample = plain.sample(np.random.default_rng(0), 13)
    outside = [Config.of(dict(c), num_stages=12) for c in sample[:3]]
    results = [MeasureResult(c, Status.OK, 0.01, 0.01, 0.01, 0.01) for c in outside]
    results += [MeasureResult(c, Status.OK, 0.02, 0.02, 0.02 + i / 1000, 0.02) for i, c in enumerate(sample[3:])]
    strategy = _make("sa", plain, seed=0, features=lambda cs: fam.features(expr, H100, cs))
    strategy.update(results)
    proposed = strategy.propose(16)
    assert len(proposed) == 16 and all(plain.in_product(c) and plain.valid(c) for c in proposed)
    assert not plain.in_product(outside[0]) and outside[0] not in proposed
