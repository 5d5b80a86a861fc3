"""The schedule space of the row-reduction template: rows per program, chunk width, warps.

No num_stages knob: the kernels' loops hold no tl.dot, and Triton (3.6 to 3.9) builds the same
binary for sm_90 at every stage count (checked on the looping softmax and layernorm), so it
would only multiply the space by copies.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritune.schedules.config import Config
from tritune.schedules.space import Knob, Limits, Space, reads

KNOBS = (
    Knob("ROWS", (1, 2, 4, 8, 16, 32, 64)),
    Knob("BLOCK_N", tuple(2 ** i for i in range(4, 17))),  # 16 .. 65536
    Knob("num_warps", (1, 2, 4, 8, 16, 32)),
)
# fp32 values a thread holds of one block: past 64 the row block, its exponentials (or weights and
# biases) and the addresses pass the 255 registers a thread may have, and the kernel spills.
MAX_PER_THREAD = 64
# Bytes of a block per thread below one 16-byte vector leave load width or threads unused: fewer
# warps move the same block in full vectors (one warp is always allowed, it cannot shrink).
MIN_THREAD_BYTES = 16
# A looping program reads each chunk row in this many bytes or more: one warp's 16-byte loads.
# Narrower chunks only add loop trips (and for long rows, thousands of them).
MIN_CHUNK_BYTES = 512


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def rows_space(m: int, n: int, element_bytes: int, limits: Limits) -> Space:
    """The space of an M x N row reduction; constraints prune what cannot run well or is redundant."""
    p = _Problem(m, n, element_bytes, limits)
    return Space(KNOBS, (p.block_fits, p.fills_gpu, p.threads, p.chunk))


@dataclass(frozen=True)
class _Problem:
    """The constraints of one row-reduction problem on one device, as methods."""

    m: int
    n: int
    element_bytes: int
    limits: Limits

    @reads("ROWS", "BLOCK_N")
    def block_fits(self, c: Config) -> str | None:
        if c["BLOCK_N"] > max(16, _pow2_ceil(self.n)):
            return f"BLOCK_N={c['BLOCK_N']} far longer than a row ({self.n})"
        if c["ROWS"] > _pow2_ceil(self.m):
            return f"ROWS={c['ROWS']} more than the rows there are ({self.m})"
        return None

    @reads("ROWS")
    def fills_gpu(self, c: Config) -> str | None:
        if c["ROWS"] > 1 and -(-self.m // c["ROWS"]) < self.limits.sms:
            return f"{-(-self.m // c['ROWS'])} programs leave SMs idle; fewer rows per program would not"
        return None

    @reads("ROWS", "BLOCK_N", "num_warps")
    def threads(self, c: Config) -> str | None:
        per_thread = c["ROWS"] * c["BLOCK_N"] // (32 * c["num_warps"])
        if per_thread > MAX_PER_THREAD:
            return f"{per_thread} values per thread > {MAX_PER_THREAD} (spills)"
        if c["num_warps"] > 1 and per_thread * self.element_bytes < MIN_THREAD_BYTES:
            return f"{per_thread * self.element_bytes} bytes per thread: fewer warps would load full vectors"
        return None

    @reads("BLOCK_N")
    def chunk(self, c: Config) -> str | None:
        if c["BLOCK_N"] < self.n and c["BLOCK_N"] * self.element_bytes < MIN_CHUNK_BYTES:
            return f"looping over {c['BLOCK_N']}-wide chunks: narrower than one warp's loads"
        return None
