"""The schedule space of the contraction template: tiles, grouping, warps, stages, unrolling,
split-K, TMA loads, the persistent loop and warp specialisation."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from tritune.schedules.config import Config
from tritune.schedules.space import Knob, Limits, Space, reads

KNOBS = (
    Knob("BLOCK_M", (16, 32, 64, 128, 256)),
    Knob("BLOCK_N", (16, 32, 64, 128, 256)),
    Knob("BLOCK_K", (16, 32, 64, 128, 256)),
    Knob("GROUP_M", (1, 2, 4, 8, 16, 32)),
    Knob("num_warps", (2, 4, 8, 16)),
    Knob("num_stages", (2, 3, 4, 5, 6)),
    Knob("UNROLL", (1, 2, 4)),
)
# Knobs beyond plain tiling (the recorded spaces of tests/fixtures predate them); every
# constraint reads them with .get and their off value, so `Space.without` them is plain tiling.
EXTENSIONS = (
    Knob("SPLIT_K", (1, 2, 4, 8, 16)),
    Knob("TMA", (0, 1, 2)),  # tensor descriptors: 1 for the loads, 2 for the output store too
    Knob("PERSISTENT", (0, 1, 2)),  # a program per SM walking the tiles; 2: tile and K loops flattened
    Knob("WARP_SPEC", (0, 1)),  # a producer warp group feeds two consumer groups (Triton's Hopper pass)
)
# Programmatic dependent launch (devices that have it): 1 starts the kernel while the previous one
# drains, 2 also prefetches its weights meanwhile (templates: PDL_WAIT, _prefetch_weights)
PDL = Knob("PDL", (0, 1, 2))
# A few rows (decode at batch 1): GEMV=1 computes the tile without tensor cores, the products
# summed along K in fp32 registers, so the weight goes from memory straight to registers and
# programs are small enough for many to share an SM. Offered, first of the knobs, only for
# problems of at most GEMV_MAX_ROWS rows; its tiles are every row (as a power of two) by a few
# weight columns (values the MMA tiles never take) where the weight is stored [N, K], K contiguous
# (as nn.Linear keeps it); by an MMA's widths where it is stored [K, N], so that each program
# reads whole lines of the weight's rows.
GEMV = Knob("GEMV", (0, 1), path=True)
GEMV_MAX_ROWS = 4
GEMV_COLUMNS = (2, 4, 8)
GEMV_DEEPEST = 512  # a GEMV step may reach deeper along K than an MMA's (no shared-memory stages to fill)
# The fp32 products of a GEMV step stay in registers until the loop ends: at most this many per thread.
GEMV_MAX_REGS = 64
# Weight streaming (decode: at most STREAM_MAX_ROWS rows against a whole weight, more than the
# GEMV path's few, whose first round covers that path instead): the configs a model-based search
# measures first (`stream_seeds`). Each MMA is a few rows deep, so compute hides little of the
# loads and a kernel runs as fast as its SMs keep weight bytes in flight: two warps, narrow tiles
# (programs for every SM), deep K steps and the deepest pipeline that fits. On the recorded H100
# spaces at 16 rows (llama's gated pair and q/k/v read through an RMSNorm, a plain 16x4096x4096)
# the best configs are of this kind, and a cold search rarely meets their few at decode's
# budgets: two warps, BLOCK_K >= 128 and five or six stages together.
STREAM_MAX_ROWS = 64
STREAM_TILES = ((32, 256), (32, 128), (16, 256), (16, 128))  # (BLOCK_N, BLOCK_K), each at its deepest pipeline
WARPS = dict((k.name, k.values) for k in KNOBS)["num_warps"]
MAX_BLOCK_K = max(dict((k.name, k.values) for k in KNOBS)["BLOCK_K"])
# Splitting K pays only while the grid is short of this many waves; the next-smaller split must
# still leave it short (else that one is as good, with less fixup work).
SPLIT_BELOW_WAVES = 2
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
# Triton's Hopper warp specialisation turns a 4-warp program into a producer group and two
# 4-warp consumer groups that split the tile: 8 warps hold the accumulator.
WS_WARPS, WS_COMPUTE_WARPS = 4, 8
# With 5 or 6 stages every specialised 4096^3 kernel left its output unwritten (Triton 3.6, H200:
# 166 of 166 wrong; 2-4 stages: 220 of 220 right).
WS_MAX_STAGES = 4


def compute_warps(config: Config) -> int:
    """Warps that hold the accumulator and issue the MMAs."""
    return WS_COMPUTE_WARPS if config.get("WARP_SPEC", 0) else config["num_warps"]


def acc_budget(num_warps: int) -> int:
    """Accumulator registers a thread may use at this many warps per program."""
    return min(MAX_ACC_REGS, REGS_PER_SM // (32 * num_warps) - RESERVED_REGS)


# The largest accumulator tile (elements) that any warp count can hold.
MAX_TILE = max(32 * w * acc_budget(w) for w in WARPS)


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def wgmma(config: Config) -> bool:
    """Whether Triton builds the dot from Hopper's warp-group MMAs: whole warp groups and tiles of
    64 rows or more; otherwise it falls back to mma.sync (sm_90 builds, Triton 3.6 and 3.9)."""
    return config["BLOCK_M"] % 64 == 0 and compute_warps(config) % 4 == 0


def shared_estimate(config: Config, element_bytes: int, b_tiles: int = 1) -> int:
    """Shared memory of a build: the software pipeline, its barriers and the epilogue's staging
    (checked against sm_90 builds of Triton 3.6 and 3.9; recorded spaces, 13,689 builds).

    The pipeline holds one A and one B tile per buffered stage per unrolled step, and with TMA
    loads one 8-byte arrival barrier each. Warp-group MMAs read their operands from shared
    memory, so every stage is buffered; the mma.sync fallback loads the current stage into
    registers and buffers one fewer. A TMA store stages the output tile; after a plain loop it
    reuses the pipeline's buffers, but a persistent loop still needs them for the next tile.
    Warp specialisation stages a consumer's half of the output, max(16 KB, 64 rows x BLOCK_N),
    plus barriers. What remains is layout-conversion scratch, counted as an upper bound (up to
    16 KB above the builds): unrolled warp-group loops took up to 512 bytes per warp, and a
    flattened persistent loop, whose buffers stay live through the epilogue, up to 4 KB per warp
    (never more than a tile). `b_tiles`: weight tiles loaded per step (2 for the gated dual GEMM).
    """
    bm, bn, warps = config["BLOCK_M"], config["BLOCK_N"], config["num_warps"]
    tma, persistent, unroll = config.get("TMA", 0), config.get("PERSISTENT", 0), config["UNROLL"]
    warp_group_mma = wgmma(config)
    steps = (config["num_stages"] - (not warp_group_mma)) * unroll
    # TMA: one 8-byte arrival barrier per stage; the gated kernel's builds (two weight tiles) took
    # 6-7 over 3 stages, counted as 3 per stage (an upper bound)
    barriers = 8 * bool(tma) * (2 * b_tiles - 1)
    pipeline = steps * ((bm + b_tiles * bn) * config["BLOCK_K"] * element_bytes + barriers)
    out = bm * bn * element_bytes
    if config.get("WARP_SPEC", 0):
        return pipeline + (out if tma == 2 else max(16384, 64 * bn * element_bytes) + 512)
    if unroll > 1:
        scratch = 512 * warps if warp_group_mma else 0
    else:
        scratch = min(out, 4096 * warps) if persistent == 2 and tma != 2 else 0
    if tma == 2:
        return (pipeline + out if persistent else max(pipeline, out)) + scratch
    return pipeline + scratch


def contraction_space(m: int, n: int, k: int, element_bytes: int, limits: Limits, batch: int = 1,
                 tma: int = 0, b_tiles: int = 1, norm: bool = False, k_last: bool = True,
                 prologue: bool = False) -> Space:
    """The space for a (batch of) M x N x K contraction; constraints prune what cannot run or is
    redundant. `tma`: the largest TMA value the layout allows (1: loads, 2: the store too);
    `b_tiles`: B tiles (and accumulators) per step, 2 for a dual GEMM sharing A; `norm`: A's rows
    are read through a row norm, whose statistics need the whole K loop in one program; `k_last`:
    the weight (B) is stored [N, K], K contiguous, else [K, N] (a GEMV's tiles follow its rows);
    `prologue`: the main loop rewrites each input tile (a LayerNorm's, whose statistics come
    before the loop: split-K stays), so no warp specialisation.
    """
    p = _Problem(m, n, k, element_bytes, batch, limits, b_tiles=b_tiles, norm=norm, k_last=k_last,
                 prologue=prologue or norm)
    knobs = KNOBS + EXTENSIONS + ((PDL,) if limits.pdl else ())
    if m <= GEMV_MAX_ROWS:
        rows = _pow2_ceil(m)
        columns = (*GEMV_COLUMNS, *KNOBS[1].values) if k_last else KNOBS[1].values
        knobs = (GEMV, Knob("BLOCK_M", (rows, *KNOBS[0].values)), Knob("BLOCK_N", columns),
                 Knob("BLOCK_K", (*KNOBS[2].values, GEMV_DEEPEST)), *knobs[3:])
    return Space(knobs, (p.gemv_tile, p.tile_fits, p.not_too_small, p.registers, p.k_step_too_small, p.not_redundant,
                         p.split_k, p.tma(tma), p.shared, p.persistent, p.warp_spec, p.norm_prologue, p.one_wave,
                         p.gemv_registers, p.gemv_only_tiles), partial(stream_seeds, m=m))


def stream_seeds(space: Space, m: int) -> tuple[Config, ...]:
    """The weight-streaming configs of `space` for an M-row problem (none at GEMV_MAX_ROWS rows or
    fewer, nor above STREAM_MAX_ROWS): per STREAM_TILES entry, the valid config with two warps,
    one tile of rows, the deepest pipeline and every other knob off (first value, or 0 where it
    has one)."""
    if not GEMV_MAX_ROWS < m <= STREAM_MAX_ROWS:
        return ()
    off = {k.name: 0 if 0 in k.values else k.values[0] for k in space.knobs}
    stages = sorted(next(k.values for k in space.knobs if k.name == "num_stages"), reverse=True)
    seeds = []
    for bn, bk in STREAM_TILES:
        tried = (Config.of(off, BLOCK_M=max(16, _pow2_ceil(m)), BLOCK_N=bn, BLOCK_K=bk, num_warps=2, num_stages=s)
                 for s in stages)
        seeds += [c for c in tried if space.valid(c)][:1]
    return tuple(seeds)


def _acc_overflow(c: Config, warps: int, accumulators: int) -> str | None:
    per_thread = accumulators * c["BLOCK_M"] * c["BLOCK_N"] // (32 * warps)
    budget = acc_budget(warps)
    return f"{per_thread} accumulator registers per thread > {budget}" if per_thread > budget else None


def _trips(p: "_Problem", c: Config, block_k: int | None = None) -> int:
    """K-loop iterations of one program (one K slice when split)."""
    return -(-(-(-p.k // (block_k or c["BLOCK_K"]))) // c.get("SPLIT_K", 1))


@dataclass(frozen=True)
class _Problem:
    """The constraints of one contraction problem on one device, as methods."""

    m: int
    n: int
    k: int
    element_bytes: int
    batch: int
    limits: Limits
    min_dim: int = 16  # tl.dot needs every tile dimension >= 16
    b_tiles: int = 1  # B tiles loaded, and accumulators held, per step
    norm: bool = False  # a row-norm prologue whose statistics need the whole K loop (tritune.kernels.norm)
    prologue: bool = False  # the main loop rewrites each input tile (every row-norm prologue)
    k_last: bool = True  # the weight is stored [N, K] (K contiguous), else [K, N]

    def tiles(self, c: Config) -> int:
        return -(-self.m // c["BLOCK_M"]) * -(-self.n // c["BLOCK_N"])

    @reads("GEMV", "BLOCK_M", "BLOCK_N", "BLOCK_K")
    def gemv_tile(self, c: Config) -> str | None:
        gemv, bm, bn = c.get("GEMV", 0), c["BLOCK_M"], c["BLOCK_N"]
        if gemv:
            if bm != _pow2_ceil(self.m):
                return "a GEMV tile is every row"
            if self.k_last and bn not in GEMV_COLUMNS:
                return f"a GEMV tile of an [N, K] weight is {'/'.join(map(str, GEMV_COLUMNS))} columns wide"
            if not self.k_last and bn < self.min_dim:
                return f"a GEMV tile of a [K, N] weight is at least {self.min_dim} columns wide (whole lines of its rows)"
            return None
        if min(bm, bn) < self.min_dim or c["BLOCK_K"] > MAX_BLOCK_K:
            return f"tensor-core tiles are {self.min_dim} to {MAX_BLOCK_K} deep and at least {self.min_dim} x {self.min_dim}"
        return None

    @reads("GEMV", "BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps")
    def gemv_registers(self, c: Config) -> str | None:
        per_thread = self.b_tiles * c["BLOCK_M"] * c["BLOCK_N"] * c["BLOCK_K"] // (32 * c["num_warps"])
        if c.get("GEMV", 0) and not 1 <= per_thread <= GEMV_MAX_REGS:
            return f"{per_thread} fp32 products per thread: not within 1 to {GEMV_MAX_REGS}"
        return None

    @reads("GEMV", "GROUP_M", "TMA", "PERSISTENT", "WARP_SPEC")
    def gemv_only_tiles(self, c: Config) -> str | None:
        if c.get("GEMV", 0) and (c["GROUP_M"] > 1 or c.get("TMA", 0) or c.get("PERSISTENT", 0) or c.get("WARP_SPEC", 0)):
            return "a GEMV is one row of tiles, loaded by pointers, one program per tile"
        return None

    @reads("BLOCK_M", "BLOCK_N", "BLOCK_K")
    def tile_fits(self, c: Config) -> str | None:
        for knob, dim in (("BLOCK_M", self.m), ("BLOCK_N", self.n), ("BLOCK_K", self.k)):
            if c[knob] > max(self.min_dim, _pow2_ceil(dim)):
                return f"{knob}={c[knob]} far larger than the problem ({dim})"
        return None

    @reads("GEMV", "BLOCK_M", "BLOCK_N")
    def not_too_small(self, c: Config) -> str | None:
        bm, bn = c["BLOCK_M"], c["BLOCK_N"]
        if c.get("GEMV", 0) or 2 * bm * bn * self.b_tiles > MAX_TILE:
            return None  # no feasible larger tile
        tiles_m, tiles_n = -(-self.m // bm), -(-self.n // bn)
        enough = -(-MIN_WAVES_TO_SHRINK * self.limits.sms // self.batch)  # programs per batch entry
        # the doubled tile must itself be allowed (tile_fits), else nothing better exists
        if 2 * bm <= min(256, max(self.min_dim, _pow2_ceil(self.m))) and -(-tiles_m // 2) * tiles_n >= enough:
            return "a tile twice as tall would still fill the GPU"
        if 2 * bn <= min(256, max(self.min_dim, _pow2_ceil(self.n))) and tiles_m * -(-tiles_n // 2) >= enough:
            return "a tile twice as wide would still fill the GPU"
        return None

    @reads("BLOCK_M", "BLOCK_N", "num_warps")
    def registers(self, c: Config) -> str | None:
        # read before WARP_SPEC is chosen: a 4-warp program may yet be specialised to 8 compute
        # warps (warp_spec checks again once it is known)
        return _acc_overflow(c, WS_COMPUTE_WARPS if c["num_warps"] == WS_WARPS else c["num_warps"], self.b_tiles)

    @reads(*(k.name for k in KNOBS + EXTENSIONS))
    def shared(self, c: Config) -> str | None:
        need = shared_estimate(c, self.element_bytes, self.b_tiles)
        return f"shared memory {need} > {self.limits.shared_bytes}" if need > self.limits.shared_bytes else None

    @reads("GEMV", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "UNROLL", "SPLIT_K")
    def k_step_too_small(self, c: Config) -> str | None:
        deeper = c.replace(BLOCK_K=2 * c["BLOCK_K"])
        if deeper["BLOCK_K"] > MAX_BLOCK_K or _trips(self, c, deeper["BLOCK_K"]) < 2 * c["num_stages"]:
            return None  # a deeper step is impossible or would starve the pipeline of iterations
        if self.gemv_registers(deeper):
            return None  # a GEMV's deeper step would hold too many products
        if shared_estimate(deeper, self.element_bytes, self.b_tiles) > self.limits.shared_bytes:
            return None
        return "a K step twice as deep would still fill the pipeline and fit in shared memory"

    @reads("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "UNROLL", "SPLIT_K")
    def not_redundant(self, c: Config) -> str | None:
        tiles_m = -(-self.m // c["BLOCK_M"])
        if c["GROUP_M"] > 1 and c["GROUP_M"] >= 2 * tiles_m:
            return "GROUP_M spans every row of tiles twice over"
        if c["UNROLL"] > _trips(self, c):
            return "unroll factor exceeds the K-loop trip count"
        return None

    @reads("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "UNROLL", "SPLIT_K")
    def split_k(self, c: Config) -> str | None:
        split = c.get("SPLIT_K", 1)
        if split == 1:
            return None
        if self.batch * self.tiles(c) * split // 2 >= SPLIT_BELOW_WAVES * self.limits.sms:
            return "the grid fills the GPU without this much splitting"
        iters = -(-self.k // c["BLOCK_K"])
        if _trips(self, c) < 2 or (split - 1) * _trips(self, c) >= iters:
            return "a K slice would get fewer than 2 steps, or none"
        return None

    def tma(self, allowed: int):
        """Tensor descriptors only where the operands' layout allows them."""
        @reads(*(k.name for k in KNOBS + EXTENSIONS[:2]))
        def tma(c: Config) -> str | None:
            return None if c.get("TMA", 0) <= allowed else "rows are not 16-byte aligned for TMA"
        return tma

    def persistent(self, c: Config) -> str | None:
        if not c.get("PERSISTENT", 0):
            return None
        if self.batch > 1 or c.get("SPLIT_K", 1) > 1:
            return "the persistent loop serves single, unsplit contractions"
        if self.tiles(c) <= self.limits.sms:
            return "one wave of tiles: a persistent loop changes nothing"
        return None

    @reads("BLOCK_M", "BLOCK_N", "SPLIT_K", "PDL")
    def one_wave(self, c: Config) -> str | None:
        # an early launch pays only where the previous kernel's drain leaves SMs idle, and a kernel
        # of more waves than that would park its waiting programs on SMs the previous one still needs
        # (a persistent loop is only kept for more tiles than SMs: never one wave)
        if c.get("PDL", 0) and self.batch * self.tiles(c) * c.get("SPLIT_K", 1) > self.limits.sms:
            return "programmatic dependent launch serves kernels of one wave of programs"
        return None

    def norm_prologue(self, c: Config) -> str | None:
        if self.norm and c.get("SPLIT_K", 1) > 1:
            return "a row-norm prologue whose statistics need the whole K loop runs it in one program"
        if self.prologue and c.get("WARP_SPEC", 0):
            return "a row-norm prologue needs its input tile in every warp: no warp specialisation"
        return None

    def warp_spec(self, c: Config) -> str | None:
        # where Triton 3.6-3.9 cannot specialise (sm_90 builds): an fp32 (tf32) dot, unrolled
        # loops and 64 x 256 tiles fail to compile; tiles under 64 rows are left unspecialised;
        # deep pipelines compile but compute nothing
        if not c.get("WARP_SPEC", 0):
            return _acc_overflow(c, c["num_warps"], self.b_tiles)
        if self.element_bytes != 2 or not c.get("TMA", 0) or c["num_warps"] != WS_WARPS or c["UNROLL"] > 1:
            return "warp specialisation needs 16-bit operands, TMA loads, 4 warps and no unrolling"
        if c.get("SPLIT_K", 1) > 1 or c.get("PERSISTENT", 0) == 2:
            return "warp specialisation serves unsplit, unflattened loops"
        if c["num_stages"] > WS_MAX_STAGES:
            return f"warp-specialised pipelines deeper than {WS_MAX_STAGES} stages never write the output"
        if c["BLOCK_M"] < 64 or (c["BLOCK_M"] < 128 and c["BLOCK_N"] > 128):
            return "the consumer groups split tiles of 64 rows or more, 64 x 256 excepted"
        return None
