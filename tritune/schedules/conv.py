"""The schedule space of the conv2d implicit-GEMM template: the contraction space of its GEMM view,
without the knobs the conv template does not read, and with its own channel constraints."""
from __future__ import annotations

from tritune.schedules.config import Config
from tritune.schedules.contraction import contraction_space
from tritune.schedules.space import Limits, Space

# Knobs the conv template reads; the contraction space's others (split-K, TMA, persistent) are left out.
KNOBS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "UNROLL")
MIN_K_STEP = 16  # tl.dot's smallest K


def conv_space(m: int, n: int, k: int, batch: int, channels: int, element_bytes: int, limits: Limits) -> Space:
    """The space of a convolution whose GEMM view is [batch x] m x n x k over `channels` input
    channels: the contraction space, plus: where C is a multiple of 16, K steps divide C."""
    base = contraction_space(m, n, k, element_bytes, limits, batch=batch)
    base = base.without([knob.name for knob in base.knobs if knob.name not in KNOBS])
    stages = dict((knob.name, knob.values) for knob in base.knobs)["num_stages"]

    def conv_only(c: Config) -> str | None:
        # a step past C turns contiguous channel loads into a gather; only worth it when no
        # step divides C anyway
        if channels % MIN_K_STEP == 0 and channels % c["BLOCK_K"]:
            return f"BLOCK_K={c['BLOCK_K']} does not divide C={channels} (the loads would gather)"
        # Triton copies asynchronously (and so pipelines) only runs of >= 4 bytes: a gather of
        # lone 2-byte channels (odd C) builds the same binary at any stage count
        if element_bytes == 2 and channels % 2 and c["num_stages"] != stages[0]:
            return "odd C in 2-byte types: loads are not pipelined, more stages change nothing"
        return None
    return Space(base.knobs, (conv_only, *base.constraints))
