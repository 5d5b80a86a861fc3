"""Cost-model features of attention configs: knobs in log2, then what they imply for the grid, the
key loop, the padding of each tile and the work of one thread."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tritune.kernels.attention.expr import Attention
from tritune.kernels.attention.launch import block_d, block_m
from tritune.kernels.expr import DTYPE_BYTES
from tritune.schedules.attention import split_keys
from tritune.schedules.config import Config
from tritune.schedules.space import Limits

KNOB_NAMES = ("BLOCK_N", "num_warps", "num_stages", "SPLIT")
DERIVED = (
    "DOT", "programs", "waves", "last_wave_util", "trips", "waste_m", "waste_n", "waste_d", "per_thread",
    "tile_bytes", "program_bytes", "log_lq", "log_lk", "log_d", "dtype_bytes", "mask", "mask_dims", "causal",
)
FEATURE_NAMES = tuple(f"log2_{k}" for k in KNOB_NAMES) + DERIVED


def config_features(expr: Attention, limits: Limits, c: Config) -> list[float]:
    """One feature row (see FEATURE_NAMES)."""
    n, warps, dot, split = c["BLOCK_N"], c["num_warps"], c["DOT"], c.get("SPLIT", 1)
    rows = expr.lq * expr.group  # a program's query rows: every query head of its group
    m, d, eb = block_m(rows, dot), block_d(expr.d), DTYPE_BYTES[expr.dtype]
    programs = expr.batch * expr.kv_heads * split
    waves = programs / limits.sms
    trips = split_keys(expr.lk, n, split) // n  # key blocks of one program
    values = m * n * d if not dot else m * d + m * n + 2 * n * d
    return [
        *(math.log2(c.get(k, 1)) for k in KNOB_NAMES),
        dot, math.log2(programs), waves, waves / math.ceil(waves), math.log2(trips),
        1 - rows / m, 1 - expr.lk / (trips * n * split), 1 - expr.d / d,
        values / (32 * warps), math.log2(n * d * eb),
        math.log2(2 * expr.lk * expr.d * eb / split),  # k and v bytes one program streams
        math.log2(rows), math.log2(expr.lk), math.log2(expr.d), eb,
        ["none", "bool", *DTYPE_BYTES].index(expr.mask or "none"), len(expr.mask_dims), expr.causal,
    ]


def features(expr: Attention, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
    """Feature matrix, one row per config."""
    return np.array([config_features(expr, limits, c) for c in configs], dtype=np.float32).reshape(
        len(configs), len(FEATURE_NAMES))
