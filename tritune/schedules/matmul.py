"""The schedule space of the contraction template: tiles, grouping, warps, stages, unrolling."""
from __future__ import annotations

from tritune.schedules.config import Config
from tritune.schedules.space import Knob, Limits, Space

KNOBS = (
    Knob("BLOCK_M", (16, 32, 64, 128, 256)),
    Knob("BLOCK_N", (16, 32, 64, 128, 256)),
    Knob("BLOCK_K", (16, 32, 64, 128, 256)),
    Knob("GROUP_M", (1, 2, 4, 8, 16, 32)),
    Knob("num_warps", (2, 4, 8, 16)),
    Knob("num_stages", (2, 3, 4, 5, 6)),
    Knob("UNROLL", (1, 2, 4)),
)
WARPS = dict((k.name, k.values) for k in KNOBS)["num_warps"]
MAX_BLOCK_K = max(dict((k.name, k.values) for k in KNOBS)["BLOCK_K"])
# A tile that could double along M or N and still launch this many waves of programs over the
# SMs only gives up data reuse: the larger tile fills the GPU just as well. Likewise along K: a
# step that could double, still leave 2 x stages loop iterations and still fit in shared memory
# only adds per-iteration overhead (BLOCK_K=16 never came within 0.75x of the best at 4096^3 on
# an H100 while being half of the random samples).
MIN_WAVES_TO_SHRINK = 4
# Above this many fp32 accumulator registers per thread, of the 255 a thread may hold, the
# operands and addresses no longer fit and the kernel spills.
MAX_ACC_REGS = 128
# An SM's register file is shared by a program's threads (65536 / threads each); besides the
# accumulator a thread needs about this many for addresses, loop state and operand fragments
# (256x256 tiles on 16 warps, 128 + 26, failed in ptxas on an H100).
REGS_PER_SM, RESERVED_REGS = 65536, 48


def acc_budget(num_warps: int) -> int:
    """Accumulator registers a thread may use at this many warps per program."""
    return min(MAX_ACC_REGS, REGS_PER_SM // (32 * num_warps) - RESERVED_REGS)


# The largest accumulator tile (elements) that any warp count can hold.
MAX_TILE = max(32 * w * acc_budget(w) for w in WARPS)


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def shared_estimate(config: Config, element_bytes: int) -> int:
    """Shared memory of the software pipeline: one A and one B tile per stage per unrolled step."""
    tile = (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * element_bytes
    return config["num_stages"] * config["UNROLL"] * tile


def matmul_space(m: int, n: int, k: int, element_bytes: int, limits: Limits, batch: int = 1) -> Space:
    """The space for a (batch of) M x N x K contraction; constraints prune what cannot run or is redundant."""
    min_dim = 16  # tl.dot needs every tile dimension >= 16

    def shared(c: Config) -> str | None:
        need = shared_estimate(c, element_bytes)
        return f"shared memory {need} > {limits.shared_bytes}" if need > limits.shared_bytes else None

    def registers(c: Config) -> str | None:
        per_thread = c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"])
        budget = acc_budget(c["num_warps"])
        return f"{per_thread} accumulator registers per thread > {budget}" if per_thread > budget else None

    def tile_fits(c: Config) -> str | None:
        for knob, dim in (("BLOCK_M", m), ("BLOCK_N", n), ("BLOCK_K", k)):
            if c[knob] > max(min_dim, _pow2_ceil(dim)):
                return f"{knob}={c[knob]} far larger than the problem ({dim})"
        return None

    def not_too_small(c: Config) -> str | None:
        bm, bn = c["BLOCK_M"], c["BLOCK_N"]
        if 2 * bm * bn > MAX_TILE:
            return None  # no feasible larger tile
        tiles_m, tiles_n = -(-m // bm), -(-n // bn)
        enough = -(-MIN_WAVES_TO_SHRINK * limits.sms // batch)  # programs per batch entry
        if 2 * bm <= 256 and -(-tiles_m // 2) * tiles_n >= enough:
            return "a tile twice as tall would still fill the GPU"
        if 2 * bn <= 256 and tiles_m * -(-tiles_n // 2) >= enough:
            return "a tile twice as wide would still fill the GPU"
        return None

    def k_step_too_small(c: Config) -> str | None:
        deeper = c.replace(BLOCK_K=2 * c["BLOCK_K"])
        if deeper["BLOCK_K"] > MAX_BLOCK_K or -(-k // deeper["BLOCK_K"]) < 2 * c["num_stages"]:
            return None  # a deeper step is impossible or would starve the pipeline of iterations
        if shared_estimate(deeper, element_bytes) > limits.shared_bytes:
            return None
        return "a K step twice as deep would still fill the pipeline and fit in shared memory"

    def not_redundant(c: Config) -> str | None:
        tiles_m = -(-m // c["BLOCK_M"])
        if c["GROUP_M"] > 1 and c["GROUP_M"] >= 2 * tiles_m:
            return "GROUP_M spans every row of tiles twice over"
        if c["UNROLL"] > -(-k // c["BLOCK_K"]):
            return "unroll factor exceeds the K-loop trip count"
        return None

    return Space(KNOBS, (tile_fits, not_too_small, k_step_too_small, not_redundant, registers, shared))
