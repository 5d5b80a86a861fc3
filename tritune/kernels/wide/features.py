"""Cost-model features of wide-GEMM configs: the contraction features of all outputs side by side,
then what only the wide grid has (its segments, the tiles their edges add)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tritune.kernels.contraction import features as contraction
from tritune.kernels.wide.expr import Wide
from tritune.kernels.wide.launch import ends
from tritune.schedules.config import Config
from tritune.schedules.space import Limits

EXTRA_FEATURES = ("segments", "segment_tiles_n", "segment_waste_n", "bias")
FEATURE_NAMES = contraction.FEATURE_NAMES + EXTRA_FEATURES


def _extra(expr: Wide, c: Config) -> list[float]:
    tiles = ends(expr, c["BLOCK_N"])[-1]  # each segment rounds up on its own
    return [len(expr.ns), tiles, 1 - sum(expr.ns) / (tiles * c["BLOCK_N"]), expr.bias]


def features(expr: Wide, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
    """Feature matrix, one row per config (see FEATURE_NAMES)."""
    base = contraction.features(expr.as_matmul(), limits, configs)
    extra = np.array([_extra(expr, c) for c in configs], dtype=np.float32).reshape(len(configs), len(EXTRA_FEATURES))
    return np.hstack([base, extra])
