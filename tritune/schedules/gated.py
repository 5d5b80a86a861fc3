"""The schedule space of the gated dual-GEMM template: the contraction space's tiling knobs and
constraints with two weight tiles and two accumulators per step, and how the weight tiles meet
the MMA (FUSE)."""
from __future__ import annotations

from functools import partial

from tritune.schedules.config import Config
from tritune.schedules.contraction import contraction_space, shared_estimate, stream_seeds, wgmma
from tritune.schedules.space import Knob, Limits, Space, reads

# Knobs of the contraction space the gated template reads (and its split-K; no persistent loop
# or warp specialisation: one program per output tile and K slice)
TILING = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "UNROLL")
# The contraction space's knobs the gated and wide spaces keep (the rest take their off values)
KEPT = ("GEMV", *TILING, "SPLIT_K", "PDL")
TMA = Knob("TMA", (0, 1))  # tensor-descriptor loads of x and both weights (no TMA store here)
# 0: two MMAs per step, one per weight tile, into two accumulators; 1: the two tiles joined into
# one [BLOCK_K, 2*BLOCK_N] tile and one MMA twice as wide
FUSE = Knob("FUSE", (0, 1))
MAX_MMA_N = 256  # the widest warp-group MMA (wgmma N); a wider fused tile is split again anyway


def gated_space(m: int, n: int, k: int, element_bytes: int, limits: Limits, tma: bool = False,
                rows_aligned: bool = True, k_last: bool = True) -> Space:
    """The space of an M x N x K dual GEMM (two N-wide products of one [M, K] input); `tma`:
    whether the operands' layout allows tensor-descriptor loads; `rows_aligned`: whether the
    weights' rows (as stored) start 16 bytes apart; `k_last`: they are stored [N, K], else [K, N]."""
    base = contraction_space(m, n, k, element_bytes, limits, tma=int(tma), b_tiles=2, k_last=k_last)
    base = base.without([knob.name for knob in base.knobs if knob.name not in KEPT])

    @reads("GEMV", *TILING, "FUSE", "TMA")
    def fused(c: Config) -> str | None:
        if not c["FUSE"]:
            return None
        if c.get("GEMV", 0):
            return "a GEMV has no MMA to join the weight tiles for"
        if element_bytes != 2:
            return "joined fp32 weight tiles do not compile (Triton 3.9, sm_90: illegal shared layout)"
        if 2 * c["BLOCK_N"] > MAX_MMA_N:
            return f"a fused tile 2 x {c['BLOCK_N']} wide is wider than one MMA: FUSE=0 issues the same two"
        if wgmma(c) and not rows_aligned:
            # Triton 3.6 and 3.9 (sm_90): make_ttgir fails on the joined tile of [N, K] weights
            # whose rows are not 16-byte aligned (K = 53 halves), once warp-group MMAs read it
            return "a joined tile of weight rows not 16-byte aligned does not compile for warp-group MMAs"
        # without warp-group MMAs the joined tile is staged in shared memory once more
        joined = 0 if wgmma(c) else 2 * c["BLOCK_N"] * c["BLOCK_K"] * element_bytes
        need = shared_estimate(c, element_bytes, 2) + joined
        return f"shared memory {need} > {limits.shared_bytes}" if need > limits.shared_bytes else None
    return Space((*base.knobs, FUSE, TMA), (*base.constraints, fused), partial(stream_seeds, m=m))
