"""Cost-model features of conv2d configs: the contraction features of the GEMM view, then what
only a convolution has (the loop mode, channels, filter taps, real K trips and waste, input reuse)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tritune.kernels.contraction import features as contraction
from tritune.kernels.conv.expr import Conv2d
from tritune.kernels.conv.template import rs_outer
from tritune.schedules.config import Config
from tritune.schedules.space import Limits

EXTRA_FEATURES = ("rs_outer", "log2_c", "taps", "k_trips_conv", "waste_k_conv", "input_reuse")
FEATURE_NAMES = contraction.FEATURE_NAMES + EXTRA_FEATURES


def features(expr: Conv2d, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
    """Feature matrix, one row per config (see FEATURE_NAMES)."""
    return np.hstack([contraction.features(expr.as_matmul(), limits, configs), _extras(expr, configs)])


def _extras(expr: Conv2d, configs: Sequence[Config]) -> np.ndarray:
    rows = []
    taps, reduction = expr.r * expr.s, expr.gemm[2]
    reuse = taps / (expr.stride[0] * expr.stride[1])  # how often each input pixel is read per filter
    for config in configs:
        bk = config["BLOCK_K"]
        outer = rs_outer(expr, config)
        trips = taps * (expr.c // bk) if outer else -(-reduction // bk)
        rows.append([outer, np.log2(expr.c), taps, np.log2(trips), 1 - reduction / (trips * bk), reuse])
    return np.array(rows, dtype=np.float32).reshape(len(configs), len(EXTRA_FEATURES))
