"""The schedule space of the attention template: keys per step, how the products are computed
(MMAs on rows padded to 16, or broadcast multiplies in fp32), warps, pipeline stages, and the
split of each head's keys over several programs (flash-decoding)."""
from __future__ import annotations

from dataclasses import dataclass

from tritune.schedules.config import Config
from tritune.schedules.space import Knob, Limits, Space, reads

KNOBS = (
    Knob("BLOCK_N", (16, 32, 64, 128, 256)),
    Knob("DOT", (0, 1)),  # 1: tl.dot on the query rows padded to 16; 0: broadcast multiply and sum
    Knob("num_warps", (1, 2, 4, 8)),
    Knob("num_stages", (1, 2, 3, 4)),
    Knob("SPLIT", (1, 2, 4, 8, 16, 32)),  # programs sharing one (batch, head)'s keys
)
# fp32 values a thread holds of one step's largest tile: past this the tiles, exponentials and
# addresses pass the 255 registers a thread may have, and the kernel spills
MAX_PER_THREAD = 128
# Bytes of a key tile per thread below one 16-byte vector leave load width or threads unused: fewer
# warps move the same tile in full vectors (one warp is always allowed, it cannot shrink)
MIN_THREAD_BYTES = 16


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_keys(lk: int, block_n: int, split: int) -> int:
    """Keys each of `split` programs takes: whole blocks (the template's split)."""
    return _cdiv(_cdiv(lk, split), block_n) * block_n


def attention_space(heads: int, rows: tuple[int, int], lk: int, block_d: int, element_bytes: int,
                    limits: Limits) -> Space:
    """The space of an attention over `lk` keys for `heads` (batch x heads) programs before any
    split, each with tiles of `rows` query rows (broadcast products, MMAs: the template pads them)
    and `block_d` head-dim lanes."""
    p = _Problem(heads, rows, lk, block_d, element_bytes, limits)
    return Space(KNOBS, (p.keys, p.registers, p.threads, p.split, p.stages))


@dataclass(frozen=True)
class _Problem:
    """The constraints of one attention problem on one device, as methods."""

    heads: int
    rows: tuple[int, int]  # a tile's query rows with broadcast products and with MMAs
    lk: int
    block_d: int
    element_bytes: int
    limits: Limits

    @reads("BLOCK_N")
    def keys(self, c: Config) -> str | None:
        if c["BLOCK_N"] > max(16, _pow2(self.lk)):
            return f"BLOCK_N={c['BLOCK_N']} far more than the keys there are ({self.lk})"
        return None

    @reads("BLOCK_N", "DOT", "num_warps")
    def registers(self, c: Config) -> str | None:
        m, n, d = self.rows[c["DOT"]], c["BLOCK_N"], self.block_d
        # broadcast products hold an [M, N, D] product; MMAs the accumulator, scores and k, v tiles
        values = m * n * d if not c["DOT"] else m * d + m * n + 2 * n * d
        per_thread = values // (32 * c["num_warps"])
        if per_thread > MAX_PER_THREAD:
            return f"{per_thread} values per thread > {MAX_PER_THREAD} (spills)"
        return None

    @reads("BLOCK_N", "num_warps")
    def threads(self, c: Config) -> str | None:
        per_thread = c["BLOCK_N"] * self.block_d * self.element_bytes // (32 * c["num_warps"])
        if c["num_warps"] > 1 and per_thread < MIN_THREAD_BYTES:
            return f"{per_thread} bytes of a key tile per thread: fewer warps would load full vectors"
        return None

    @reads("BLOCK_N", "SPLIT")
    def split(self, c: Config) -> str | None:
        split = c.get("SPLIT", 1)
        if split > 1 and (split - 1) * split_keys(self.lk, c["BLOCK_N"], split) >= self.lk:
            return f"SPLIT={split} of {self.lk} keys in blocks of {c['BLOCK_N']}: a split without keys"
        if split > 1 and self.heads * (split // 2) >= self.limits.sms:
            return f"half the split ({self.heads * (split // 2)} programs) fills the {self.limits.sms} SMs already"
        return None

    @reads("BLOCK_N", "DOT", "num_stages", "SPLIT")
    def stages(self, c: Config) -> str | None:
        if not c["DOT"]:
            # Triton 3.9 builds the same sm_90 binary at every stage count for the broadcast
            # products (checked): more stages would only multiply the space by copies
            return "broadcast products are not pipelined: one stage" if c["num_stages"] > 1 else None
        trips = split_keys(self.lk, c["BLOCK_N"], c.get("SPLIT", 1)) // c["BLOCK_N"]  # key blocks of one split
        if c["num_stages"] > 1 and trips < c["num_stages"]:
            return f"{c['num_stages']} stages for a loop of {trips} steps: nothing more to prefetch"
        # k and v tiles in flight (an upper bound of what Triton 3.9 allocates for sm_90)
        need = 2 * c["BLOCK_N"] * self.block_d * self.element_bytes * c["num_stages"]
        if need > self.limits.shared_bytes:
            return f"shared memory {need} > {self.limits.shared_bytes}"
        return None
