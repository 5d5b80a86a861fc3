"""XGBoost cost model: ranks configs by predicted throughput (higher is better)."""
from __future__ import annotations

import numpy as np

# XGBoost's ranking objectives read labels as integer relevance grades: relative throughputs in
# [0, 1] are binned into this many grades (without binning every label but the best became 0).
RANK_GRADES = 31
# a fit on fewer rows than this runs on one thread, as every prediction does: a workload's own few
# hundred trials fitted no faster on two threads, for 1.4-1.7x the CPU-seconds (OpenMP's waiting
# threads), which a GPU host's compile pool needs; the prior's thousands of rows fit 1.6x faster on two
SMALL_FIT_ROWS = 2000


class XGBCostModel:
    """Gradient-boosted trees, scikit-learn style: hyper-parameters here, learned state in `booster_`.

    objective "rank" trains pairwise ranking within each group (one group per workload); "reg"
    regresses the label directly. `base_margin` (fit and predict alike) is a starting score per
    row, e.g. another model's prediction: the trees then learn corrections to it. `n_jobs` threads
    fit `SMALL_FIT_ROWS` rows or more; smaller fits and every prediction run on one.
    """

    def __init__(self, objective: str = "rank", n_estimators: int = 150, max_depth: int = 6,
                 learning_rate: float = 0.15, subsample: float = 0.9, min_child_weight: float = 1.0,
                 seed: int = 0, n_jobs: int = 2) -> None:
        if objective not in ("rank", "reg"):
            raise ValueError(f"objective must be 'rank' or 'reg', got {objective!r}")
        self.objective, self.n_estimators, self.max_depth = objective, n_estimators, max_depth
        self.learning_rate, self.subsample, self.min_child_weight = learning_rate, subsample, min_child_weight
        self.seed, self.n_jobs = seed, n_jobs

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None,
            base_margin: np.ndarray | None = None) -> "XGBCostModel":
        """Train on feature rows X and labels y (higher is better); groups separate workloads."""
        import xgboost as xgb

        X, y = np.asarray(X, dtype=np.float32), np.asarray(y, dtype=np.float32)
        threads = 1 if len(y) < SMALL_FIT_ROWS else self.n_jobs
        groups = np.zeros(len(y), dtype=np.int64) if groups is None else np.asarray(groups)
        order = np.argsort(groups, kind="stable")  # xgboost wants each ranking group contiguous
        label = np.floor(np.clip(y, 0, 1) * RANK_GRADES) if self.objective == "rank" else y
        # nthread: DMatrix otherwise takes every core, and on a host whose cores are compiling it
        # took 17 ms per matrix (most of the proposal time on the H100 host)
        dtrain = xgb.DMatrix(X[order], label=label[order], nthread=threads,
                             base_margin=None if base_margin is None else np.asarray(base_margin)[order])
        params = {"objective": "reg:squarederror"}
        if self.objective == "rank":
            dtrain.set_group(np.unique(groups[order], return_counts=True)[1])
            # "mean" samples pairs across the whole group; the default "topk" only near the top,
            # which learned little from a few dozen trials on the H100 recordings
            params = {"objective": "rank:pairwise", "lambdarank_pair_method": "mean",
                      "lambdarank_num_pair_per_sample": 8}
        params.update({
            "max_depth": self.max_depth, "eta": self.learning_rate, "subsample": self.subsample,
            "min_child_weight": self.min_child_weight, "seed": self.seed, "nthread": threads,
            "verbosity": 0,
        })
        self.booster_ = xgb.train(params, dtrain, num_boost_round=self.n_estimators)
        self.booster_.set_param({"nthread": 1})  # for predict: a few dozen rows at a time
        return self

    def predict(self, X: np.ndarray, base_margin: np.ndarray | None = None) -> np.ndarray:
        """Scores, higher meaning faster; comparable only within one workload for 'rank'."""
        # in place: no DMatrix per call (the search scores a few dozen configs at a time, hundreds of times)
        return self.booster_.inplace_predict(np.asarray(X, dtype=np.float32), base_margin=base_margin)
