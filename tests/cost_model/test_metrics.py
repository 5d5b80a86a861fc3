"""Each accuracy metric on small hand-made cases with known answers."""
import math

import numpy as np
import pytest

from tritune.cost_model import metrics as m

Y = np.array([1.0, 2.0, 3.0, 4.0, 5.0])


def test_perfect_reversed_and_known_rank_correlations():
    assert m.spearman(Y, Y) == pytest.approx(1.0) and m.spearman(-Y, Y) == pytest.approx(-1.0)
    assert m.kendall(Y, Y) == pytest.approx(1.0)
    swapped = np.array([2.0, 1.0, 3.0, 4.0, 5.0])  # one discordant pair of 10
    assert m.kendall(swapped, Y) == pytest.approx(0.8)
    assert m.spearman(swapped, Y) == pytest.approx(1 - 6 * 2 / (5 * 24))


def test_pairwise_accuracy_counts_ordered_pairs():
    assert m.pairwise_accuracy(Y, Y) == 1.0 and m.pairwise_accuracy(-Y, Y) == 0.0
    assert m.pairwise_accuracy(np.array([2.0, 1.0, 3.0, 4.0, 5.0]), Y) == pytest.approx(0.9)
    assert m.pairwise_accuracy(np.array([1.0, 1.0]), np.array([1.0, 2.0])) == 0.0  # a tie is not an order
    assert math.isnan(m.pairwise_accuracy(Y, np.ones(5)))


def test_recall_and_peak_at_k():
    pred = np.array([5.0, 4.0, 3.0, 2.0, 1.0])  # the model ranks the worst first
    assert m.recall_at_k(pred, Y, 2) == 0.0 and m.recall_at_k(Y, Y, 2) == 1.0
    assert m.recall_at_k(np.array([1.0, 2.0, 3.0, 5.0, 4.0]), Y, 2) == 1.0
    assert m.recall_at_k(np.array([1.0, 5.0, 3.0, 4.0, 2.0]), Y, 2) == 0.5
    assert m.peak_at_k(pred, Y, 1) == pytest.approx(1 / 5)
    assert m.peak_at_k(pred, Y, 5) == 1.0


def test_failure_auc():
    ok = np.array([True, True, False, False])
    assert m.failure_auc(np.array([0.9, 0.8, 0.1, 0.2]), ok) == 1.0
    assert m.failure_auc(np.array([0.1, 0.2, 0.9, 0.8]), ok) == 0.0
    assert math.isnan(m.failure_auc(np.array([1.0, 2.0]), np.array([True, True])))


def test_all_metrics_rank_only_runnable_configs():
    y = np.array([0.0, 0.5, 1.0, 0.0])
    ok = np.array([False, True, True, False])
    pred = np.array([-1.0, 0.2, 0.9, -2.0])
    got = m.all_metrics(pred, y, ok)
    assert got["spearman"] == pytest.approx(1.0) and got["peak@1"] == 1.0 and got["failure_auc"] == 1.0
