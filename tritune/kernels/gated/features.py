"""Cost-model features of gated dual-GEMM configs: the contraction features of one product with
two weight tiles and two accumulators per step, then what only the dual GEMM has."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tritune.kernels.contraction import features as contraction
from tritune.kernels.gated.expr import ACTIVATIONS, Gated
from tritune.schedules.config import Config
from tritune.schedules.space import Limits

EXTRA_FEATURES = ("FUSE", "bias", "activation")
FEATURE_NAMES = contraction.FEATURE_NAMES + EXTRA_FEATURES


def features(expr: Gated, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
    """Feature matrix, one row per config (see FEATURE_NAMES)."""
    base = contraction.features(expr.as_matmul(), limits, configs, b_tiles=2)
    extra = [[c["FUSE"], expr.bias, ACTIVATIONS.index(expr.activation)] for c in configs]
    return np.hstack([base, np.array(extra, dtype=np.float32).reshape(len(configs), len(EXTRA_FEATURES))])


def lift(expr: Gated, rows: np.ndarray) -> np.ndarray:
    """Contraction feature rows of plain GEMM configs as gated rows for `expr`: one product of
    the pair, each weight tile its own MMA (FUSE 0), with the expression's bias and activation."""
    extra = np.array([0, expr.bias, ACTIVATIONS.index(expr.activation)], dtype=np.float32)
    return np.hstack([rows, np.tile(extra, (len(rows), 1))])
