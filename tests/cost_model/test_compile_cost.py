"""The compile-time model and the search's trade of predicted speed against compile time."""
import numpy as np
import pytest

from tritune.cost_model.compile_cost import CompileCost, relative_log
from tritune.cost_model.dataset import Prior
from tritune.records.database import Database
from tritune.records.result import DeviceKey
from tritune.schedules.config import Config
from tritune.search import make_strategy
from tritune.search.model_based import COMPILE_WEIGHT, diverse_pick
from tritune.tuner.prior import bundled_prior
from tritune.tuner.recordings import BUNDLED, RecordedBuilder, RecordedRunner, Recording
from tritune.tuner.task import best_of
from tritune.tuner.tuner import Tuner


def rows(n, seed=0):
    """Feature rows whose first column says dear (1) or cheap (0); the others are noise."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, 4)).astype(np.float32)
    X[:, 0] = np.arange(n) % 2
    return X


def seconds(X, scale=1.0):
    """Dear rows compile 8x longer than cheap ones: 1.5 doublings over the typical, 0.5 past the slack."""
    return scale * np.where(X[:, 0] == 1, 4.0, 0.5)


def test_relative_log_puts_each_group_on_its_own_median():
    built, rel = relative_log(np.array([1.0, 4.0, 0.0, 10.0, 40.0, 20.0]), np.array([0, 0, 0, 1, 1, 1]))
    assert built.tolist() == [True, True, False, True, True, True]
    assert rel[:2].tolist() == [-1.0, 1.0] and rel[2] == 0  # a failed build counts for nothing
    assert rel[3:].tolist() == pytest.approx([np.log2(0.5), 1.0, 0.0])


def test_within_twice_the_typical_compile_costs_nothing():
    X = rows(64)
    prior = Prior(X, np.ones(64), np.zeros(64), np.where(X[:, 0] == 1, 1.0, 0.5))  # dear ones take 2x
    dear = CompileCost(prior=prior).dearer(rows(8, seed=1))
    assert dear is not None and (dear < 0.1).all(), dear


def test_nothing_known_predicts_nothing():
    cost = CompileCost()
    assert cost.dearer(rows(4)) is None
    cost.fit(rows(4), seconds(rows(4)))  # fewer than min_train compiles
    assert cost.dearer(rows(4)) is None


def test_the_prior_alone_ranks_dear_configs_on_another_host_speed():
    X = rows(64)
    # two workloads measured on hosts 3x apart: relative times transfer, absolute ones would not
    prior = Prior(X, np.ones(64), np.arange(64) // 32, np.concatenate([seconds(X[:32]), seconds(X[32:], 3.0)]))
    dear = CompileCost(prior=prior).dearer(rows(8, seed=1))
    assert dear is not None
    assert (dear[0::2] < 0.1).all() and (dear[1::2] > 0.3).all(), dear  # three doublings apart, around the median


def test_own_compiles_correct_the_prior():
    X = rows(64)
    prior = Prior(X, np.ones(64), np.zeros(64), seconds(X))
    cost = CompileCost(prior=prior)
    own = rows(16, seed=2)
    cost.fit(own, np.where(own[:, 0] == 1, 0.5, 4.0))  # here the first column's configs are the cheap ones
    dear = cost.dearer(rows(8, seed=3))
    assert dear[0::2].mean() > dear[1::2].mean(), dear


def test_own_compiles_alone_without_a_prior():
    cost = CompileCost(min_train=8)
    own = rows(16)
    cost.fit(own, seconds(own))
    dear = cost.dearer(rows(8, seed=4))
    assert dear[1::2].mean() > dear[0::2].mean() + 0.3, dear


def test_diverse_pick_gives_way_to_a_cheaper_compile_of_near_equal_rank():
    a, b, c = (Config.of({"X": i}) for i in range(3))
    ranked = [(3.0, a), (2.9, b), (1.0, c)]
    assert diverse_pick(ranked, 1, 0.0) == [a]
    assert diverse_pick(ranked, 1, 0.0, np.array([1.0, 0.0, 0.0])) == [b]  # a compiles twice as long
    assert diverse_pick(ranked, 3, 0.0, np.array([1.0, 0.0, 0.0])) == [b, c, a]  # dear, but still taken


@pytest.mark.system
def test_the_search_spends_less_compile_time_for_the_same_best_on_a_recorded_space(tmp_path):
    """Warm sa on the shipped 4096^3 recording (H100 compile times: its warp-specialised tiles
    compile 3x longer than tiles that run as fast), with and without the compile weight: the same
    share of the best, less recorded compile time."""
    rec = Recording.load(BUNDLED / "space_4096_fp16.jsonl.gz")
    task = rec.task(DeviceKey("recorded", "9.0", "-", "-", "-"))
    prior = bundled_prior(task)
    spent, found = {}, {}
    for weight in (0.0, COMPILE_WEIGHT):
        for seed in range(3):
            strategy = make_strategy("sa", task.space, seed=seed, features=task.featurize, prior=prior,
                                     compile_weight=weight)
            db = Database(tmp_path / f"{weight}-{seed}.db")
            history = Tuner(task, strategy, RecordedBuilder(), RecordedRunner(rec), db, batch_size=8).run(64)
            spent[weight] = spent.get(weight, 0.0) + sum(r.compile_s for r in history)
            found.setdefault(weight, []).append(rec.best_ms / best_of(history).t_median)
    assert min(found[COMPILE_WEIGHT]) >= 0.98, found
    assert spent[COMPILE_WEIGHT] < 0.85 * spent[0.0], spent
