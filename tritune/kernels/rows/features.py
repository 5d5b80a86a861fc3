"""Cost-model features of row-reduction (softmax, layernorm) configs: knobs in log2, then what they
imply for the grid, the passes over memory and the work of one thread."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tritune.kernels.expr import DTYPE_BYTES
from tritune.kernels.rows.expr import RowOp
from tritune.schedules.config import Config
from tritune.schedules.space import Limits

KNOB_NAMES = ("ROWS", "BLOCK_N", "num_warps")
DERIVED = (
    "programs", "waves", "last_wave_util", "chunks", "single_pass", "waste_n", "waste_m",
    "per_thread", "thread_bytes", "program_bytes", "chunk_bytes", "occupancy_warps",
    "log_m", "log_n", "dtype_bytes", "n_div8", "n_div16", "vectors",
)
FEATURE_NAMES = tuple(f"log2_{k}" for k in KNOB_NAMES) + DERIVED
MAX_WARPS_PER_SM = 64  # Hopper and Ampere (A100) keep at most 64 resident warps per SM


def config_features(expr: RowOp, limits: Limits, c: Config) -> list[float]:
    """One feature row (see FEATURE_NAMES)."""
    rows, block, warps = c["ROWS"], c["BLOCK_N"], c["num_warps"]
    eb = DTYPE_BYTES[expr.dtype]
    programs = -(-expr.m // rows)
    chunks = -(-expr.n // block)
    waves = programs / limits.sms
    per_thread = rows * block / (32 * warps)
    single = chunks == 1
    passes = 1 if single else 2  # a looping program reads its rows twice
    return [
        *(math.log2(c[k]) for k in KNOB_NAMES),
        math.log2(programs), waves, waves / math.ceil(waves), math.log2(chunks), single,
        1 - expr.n / (chunks * block), 1 - expr.m / (programs * rows),
        per_thread, math.log2(max(per_thread * eb, 1)),
        math.log2(rows * expr.n * eb * (passes + 1)),  # bytes one program moves
        math.log2(block * eb),
        min(MAX_WARPS_PER_SM // warps, math.ceil(waves)) * warps,  # resident warps on a busy SM
        math.log2(expr.m), math.log2(expr.n), eb, expr.n % 8 == 0, expr.n % 16 == 0, expr.vectors,
    ]


def features(expr: RowOp, limits: Limits, configs: Sequence[Config]) -> np.ndarray:
    """Feature matrix, one row per config."""
    return np.array([config_features(expr, limits, c) for c in configs], dtype=np.float32).reshape(
        len(configs), len(FEATURE_NAMES))
