"""Decode's weight-streaming seeds: the configs a model-based search measures first where a GEMM
family's space is at most STREAM_MAX_ROWS rows (`schedules.contraction.stream_seeds`), and how
the search takes them. Their worth on recorded H100 spaces is in test_recorded_search."""
import numpy as np
import pytest

from tritune.schedules.config import Config
from tritune.schedules.contraction import GEMV_MAX_ROWS, STREAM_MAX_ROWS, contraction_space
from tritune.schedules.gated import gated_space
from tritune.schedules.space import Limits
from tritune.schedules.wide import wide_space
from tritune.search import make_strategy

H100 = Limits.for_capability(9, 0)
DECODE = {
    "down": contraction_space(16, 2048, 5632, 2, H100),
    "head": contraction_space(16, 32000, 2048, 2, H100, norm=True),
    "8 rows": contraction_space(8, 2048, 2048, 2, H100),
    "gated": gated_space(16, 5632, 2048, 2, H100),
    "wide": wide_space(16, (2048, 512, 512), 2048, 2, H100),
    "48 rows": contraction_space(48, 4096, 4096, 2, H100),
}


@pytest.mark.parametrize("name", sorted(DECODE))
def test_seeds_are_valid_two_warp_narrow_tiles_at_their_deepest_pipeline(name):
    space = DECODE[name]
    assert 2 <= len(space.seeds) <= 4
    for seed in space.seeds:
        assert space.valid(seed) and seed["num_warps"] == 2 and seed["BLOCK_M"] == (64 if name == "48 rows" else 16)
        assert seed["BLOCK_N"] in (16, 32) and seed["BLOCK_K"] in (128, 256)
        assert all(seed.get(k, 0) == 0 for k in ("GEMV", "TMA", "PERSISTENT", "WARP_SPEC", "FUSE", "PDL"))
        assert seed.get("SPLIT_K", 1) == 1 and seed["GROUP_M"] == 1 and seed["UNROLL"] == 1
        deeper = seed.replace(num_stages=seed["num_stages"] + 1)
        assert seed["num_stages"] == 6 or not space.valid(deeper)


def test_no_seeds_above_the_rows_of_decode_nor_where_the_gemv_path_is_offered():
    assert contraction_space(STREAM_MAX_ROWS + 1, 4096, 4096, 2, H100).seeds == ()
    assert gated_space(2048, 5632, 2048, 2, H100).seeds == ()
    assert contraction_space(GEMV_MAX_ROWS, 2048, 2048, 2, H100).seeds == ()  # its first round covers GEMV


def test_derived_spaces_find_their_own_seeds():
    space = DECODE["wide"]
    assert space.without(["TMA"]).seeds == tuple(Config.of({k: v for k, v in s.items() if k != "TMA"})
                                                 for s in space.seeds)
    shallow = [c for c in (space.config(int(i)) for i in space.valid_indices) if c["num_stages"] <= 4]
    sub = space.restricted(shallow)
    assert sub.seeds and all(s["num_stages"] == 4 for s in sub.seeds)


def test_a_model_based_search_measures_the_seeds_first_and_once_random_does_not():
    space = DECODE["gated"]
    features = lambda configs: np.array([[c[k.name] for k in space.knobs] for c in configs], dtype=float)
    sa = make_strategy("sa", space, seed=0, features=features)
    first = sa.propose(8)
    assert first[:len(space.seeds)] == list(space.seeds) and len(set(first)) == 8
    assert not set(space.seeds) & set(sa.propose(8))
    assert not set(space.seeds) & set(make_strategy("random", space, seed=0).propose(8))
    resumed = make_strategy("sa", space, seed=0, features=features)
    resumed.seen.update(space.seeds)  # as stored trials of a resumed run are
    assert not set(space.seeds) & set(resumed.propose(8))
