"""Accuracy metrics of a cost model's scores against measured throughput (higher is better in both)."""
from __future__ import annotations

import numpy as np
from scipy.stats import kendalltau, spearmanr


def spearman(pred: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation."""
    return float(spearmanr(pred, y)[0])


def kendall(pred: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b."""
    return float(kendalltau(pred, y)[0])


def pairwise_accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    """Fraction of pairs with different measured values that the scores order the same way."""
    pred, y = np.asarray(pred, float), np.asarray(y, float)
    dy = np.sign(y[:, None] - y[None, :])
    dp = np.sign(pred[:, None] - pred[None, :])
    pairs = np.triu(dy != 0, k=1)
    return float((dy == dp)[pairs].mean()) if pairs.any() else float("nan")


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values (ties broken by position)."""
    return np.argsort(-np.asarray(values), kind="stable")[:k]


def recall_at_k(pred: np.ndarray, y: np.ndarray, k: int) -> float:
    """How many of the truly best k the model also puts in its top k, as a fraction of k."""
    k = min(k, len(y))
    return len(set(top_k(pred, k)) & set(top_k(y, k))) / k


def peak_at_k(pred: np.ndarray, y: np.ndarray, k: int) -> float:
    """Best measured value among the model's top k over the best measured value (1 = no regret)."""
    return float(np.max(np.asarray(y)[top_k(pred, k)]) / np.max(y))


def failure_auc(pred: np.ndarray, ok: np.ndarray) -> float:
    """ROC AUC of the scores at telling runnable (ok) configs from failing ones; nan if one class."""
    from sklearn.metrics import roc_auc_score

    ok = np.asarray(ok, bool)
    return float(roc_auc_score(ok, pred)) if 0 < ok.sum() < len(ok) else float("nan")


def all_metrics(pred: np.ndarray, y: np.ndarray, ok: np.ndarray | None = None) -> dict[str, float]:
    """Every metric at once; ranking metrics over runnable configs only."""
    pred, y = np.asarray(pred, float), np.asarray(y, float)
    ok = np.ones(len(y), bool) if ok is None else np.asarray(ok, bool)
    p, t = pred[ok], y[ok]
    return {
        "spearman": spearman(p, t), "kendall": kendall(p, t), "pairwise": pairwise_accuracy(p, t),
        "recall@10": recall_at_k(p, t, 10), "peak@1": peak_at_k(p, t, 1), "peak@10": peak_at_k(p, t, 10),
        "failure_auc": failure_auc(pred, ok),
    }
