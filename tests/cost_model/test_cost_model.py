"""Cost model: features, labels, and an XGBoost ranker that learns a known ordering quickly."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from tritune.kernels.contraction.features import FEATURE_NAMES, features
from tritune.cost_model.dataset import labels
from tritune.cost_model.xgb import XGBCostModel
from tritune.kernels.contraction.expr import Matmul
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.schedules.contraction import contraction_space
from tritune.schedules.space import Limits

H100 = Limits.for_capability(9, 0)
EXPR = Matmul(4096, 4096, 4096)


def test_feature_rows_have_the_named_values():
    c = Config.of(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, UNROLL=1)
    row = dict(zip(FEATURE_NAMES, features(EXPR, H100, [c])[0]))
    assert row["log2_BLOCK_M"] == 7 and row["log2_num_warps"] == 3
    assert row["programs"] == np.log2(32 * 16)
    assert row["waves"] == pytest.approx(512 / 132)
    assert row["last_wave_util"] == pytest.approx((512 / 132) / 4)
    assert row["waste_m"] == 0 and row["k_trips"] == 6  # log2(64 trips)
    assert row["shared_bytes"] == pytest.approx(np.log2(3 * (128 + 256) * 64 * 2))
    assert row["acc_regs"] == 128 and row["tile_intensity"] == pytest.approx(128 * 256 / 384)
    odd = dict(zip(FEATURE_NAMES, features(Matmul(3000, 5000, 1000), H100, [c])[0]))
    assert odd["waste_m"] == pytest.approx(1 - 3000 / (24 * 128)) and odd["n_div16"] == 0


def test_labels_are_relative_throughput_and_failures_are_worst():
    c = Config.of(BLOCK_M=16)
    rs = [MeasureResult(c, Status.OK, t_median=2.0), MeasureResult(c, Status.OK, t_median=1.0),
          MeasureResult(c, Status.WRONG_ANSWER)]
    assert labels(rs).tolist() == [0.5, 1.0, 0.0]


def synthetic(n, seed=0):
    """Configs of a real space scored by a known formula of their knobs."""
    space = contraction_space(4096, 4096, 4096, 2, H100)
    configs = space.sample(np.random.default_rng(seed), n)
    truth = np.array([np.log2(c["BLOCK_M"] * c["BLOCK_N"]) - abs(c["num_stages"] - 4) - c["UNROLL"]
                      for c in configs])
    return features(EXPR, H100, configs), (truth - truth.min()) / np.ptp(truth)


@pytest.mark.parametrize("objective", ["rank", "reg"])
def test_model_learns_a_known_ordering(objective):
    X, y = synthetic(600)
    model = XGBCostModel(objective=objective).fit(X[:200], y[:200])
    assert spearmanr(model.predict(X[200:]), y[200:])[0] > 0.85


def test_a_model_that_learned_nothing_would_fail_the_check():
    X, y = synthetic(600)
    shuffled = XGBCostModel().fit(X[:200], np.random.default_rng(0).permutation(y[:200]))
    assert spearmanr(shuffled.predict(X[200:]), y[200:])[0] < 0.5


@pytest.mark.system
def test_groups_keep_workloads_apart_and_bad_objective_is_refused():
    X, y = synthetic(300)
    model = XGBCostModel().fit(X, y, groups=np.repeat([0, 1, 2], 100))
    assert spearmanr(model.predict(X), y)[0] > 0.85
    with pytest.raises(ValueError):
        XGBCostModel(objective="magic")


def _threads(model: XGBCostModel) -> int:
    """The threads the model's booster predicts with."""
    import json

    return int(json.loads(model.booster_.save_config())["learner"]["generic_param"]["nthread"])


def test_small_fits_and_every_prediction_run_on_one_thread_and_predict_the_same():
    X, y = synthetic(300)
    one, two = XGBCostModel(n_jobs=1).fit(X[:200], y[:200]), XGBCostModel(n_jobs=2).fit(X[:200], y[:200])
    assert _threads(one) == _threads(two) == 1  # OpenMP's waiting threads cost CPU a compile pool needs
    assert np.array_equal(one.predict(X[200:]), two.predict(X[200:]))  # a search proposes the same
