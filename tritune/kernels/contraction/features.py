"""Cost-model features of contraction configs: knobs in log2, then what they imply for the grid,
padding, the K loop, shared memory, registers and occupancy, so trees generalise within and
across shapes."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import walk
from tritune.kernels.expr import DTYPE_BYTES
from tritune.schedules.config import Config
from tritune.schedules.contraction import REGS_PER_SM, RESERVED_REGS, compute_warps, shared_estimate
from tritune.schedules.space import Limits

KNOB_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "UNROLL")
DERIVED = (
    "tiles_m", "tiles_n", "programs", "waves", "last_wave_util", "waste_m", "waste_n", "waste_k",
    "k_trips", "trips_per_stage", "shared_bytes", "shared_frac", "acc_regs", "programs_per_sm",
    "occupancy_warps", "tile_intensity", "bytes_per_flop_tile", "dtype_bytes",
    "log_m", "log_n", "log_k", "log_batch", "m_div16", "n_div16", "k_div16", "trans_a", "trans_b",
    "log2_SPLIT_K", "TMA", "PERSISTENT", "m_div8", "n_div8", "k_div8", "WARP_SPEC",
    "operand_regs", "thread_regs", "epi_steps", "epi_bytes_per_out", "epi_tile_regs", "PDL",
    "GEMV",
)
FEATURE_NAMES = tuple(f"log2_{k}" for k in KNOB_NAMES) + DERIVED


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@lru_cache(maxsize=64)  # once per expression, not once per config
def epilogue_cost(expr: Matmul) -> tuple[int, float, int]:
    """(steps, bytes the epilogue's extra inputs add per output element, full [M, N] input tiles):
    a residual's loads cost as much memory traffic as the output's store, and its tile sits in
    registers beside the accumulator."""
    steps = walk(expr.epilogue)
    size = {"mn": 1.0, "m": 1.0 / expr.n, "n": 1.0 / expr.m}  # vectors are read once per row or column
    read = sum(DTYPE_BYTES[i.dtype] * size[i.shape] for i in expr.inputs) + DTYPE_BYTES[expr.dtype] * expr.has_bias / expr.m
    return len(steps), read, sum(i.shape == "mn" for i in expr.inputs)


def config_features(expr: Matmul, limits: Limits, c: Config, b_tiles: int = 1) -> list[float]:
    """One feature row (see FEATURE_NAMES); `b_tiles` B tiles and accumulators per step (2: a dual GEMM)."""
    bm, bn, bk, warps = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], compute_warps(c)
    eb = DTYPE_BYTES[expr.dtype]
    split, tma, persistent = c.get("SPLIT_K", 1), c.get("TMA", 0), c.get("PERSISTENT", 0)
    tm, tn, trips = _cdiv(expr.m, bm), _cdiv(expr.n, bn), _cdiv(_cdiv(expr.k, bk), split)
    programs = tm * tn * expr.batch * split
    if persistent:
        programs = min(programs, limits.sms)
    waves = programs / limits.sms
    shared = shared_estimate(c, eb, b_tiles)
    acc = b_tiles * bm * bn / (32 * warps)
    # operand tiles of the unrolled steps in flight, in 4-byte registers per thread: with the
    # accumulator, what decides whether a program spills (H100: 256x64x32 tiles with unroll 4 ran
    # 7x faster on 8 warps than on 4)
    operand = c["UNROLL"] * (bm + b_tiles * bn) * bk * eb / (4 * 32 * warps)
    by_regs = REGS_PER_SM // (32 * warps * (acc + RESERVED_REGS))
    per_sm = max(0, min(limits.shared_bytes // max(shared, 1), by_regs, 64 // warps))
    epi_steps, epi_bytes, epi_tiles = epilogue_cost(expr)
    return [
        *(math.log2(c[k]) for k in KNOB_NAMES),
        math.log2(tm), math.log2(tn), math.log2(programs), waves,
        waves / math.ceil(waves),  # how full the waves are on average (1 = no idle SMs in the tail)
        1 - expr.m / (tm * bm), 1 - expr.n / (tn * bn), 1 - expr.k / (_cdiv(expr.k, bk) * bk),
        math.log2(trips), trips / c["num_stages"], math.log2(shared), shared / limits.shared_bytes,
        acc, per_sm, per_sm * warps,
        bm * bn / (bm + bn),  # multiply-adds per loaded element of a tile
        (bm + bn) * bk * eb / (2 * bm * bn * bk),
        eb, math.log2(expr.m), math.log2(expr.n), math.log2(expr.k), math.log2(expr.batch),
        expr.m % 16 == 0, expr.n % 16 == 0, expr.k % 16 == 0, expr.trans_a, expr.trans_b,
        math.log2(split), tma, persistent, expr.m % 8 == 0, expr.n % 8 == 0, expr.k % 8 == 0,
        c.get("WARP_SPEC", 0),
        operand, acc + operand + RESERVED_REGS, epi_steps, epi_bytes, epi_tiles * acc, c.get("PDL", 0),
        c.get("GEMV", 0),
    ]


def features(expr: Matmul, limits: Limits, configs: Sequence[Config], b_tiles: int = 1) -> np.ndarray:
    """Feature matrix, one row per config."""
    return np.array([config_features(expr, limits, c, b_tiles) for c in configs], dtype=np.float32).reshape(
        len(configs), len(FEATURE_NAMES))

