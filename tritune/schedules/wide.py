"""The schedule space of the wide-GEMM template: the contraction space's plain tiling knobs (one
program per output tile of every weight), split-K and tensor-descriptor loads, sized by the widest
weight."""
from __future__ import annotations

from functools import partial
from typing import Sequence

from tritune.schedules.contraction import contraction_space, stream_seeds
from tritune.schedules.gated import KEPT, TMA
from tritune.schedules.space import Limits, Space


def wide_space(m: int, ns: Sequence[int], k: int, element_bytes: int, limits: Limits, tma: bool = False,
               k_last: bool = True) -> Space:
    """The space of x [M, K] times weights of widths `ns`. A tile is no wider than the widest weight
    needs; the GPU-filling rule sees that weight's tiles alone, so it keeps smaller tiles than the
    whole grid would (never prunes a tile the wide grid needs). `tma`: whether the operands' layout
    allows tensor-descriptor loads. Split-K as the contraction space has it (the same rule sees the
    widest weight's tiles: it keeps splits of a grid that is short of the GPU, as decode's is).
    `k_last`: the weights are stored [N, K], else [K, N]."""
    base = contraction_space(m, max(ns), k, element_bytes, limits, tma=int(tma), k_last=k_last)
    base = base.without([knob.name for knob in base.knobs if knob.name not in KEPT])
    return Space((*base.knobs, TMA), base.constraints, partial(stream_seeds, m=m))
