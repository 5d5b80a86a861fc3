"""Schedule space: index round trips, constraints, seeded sampling, neighbours."""
import numpy as np
import pytest

from tritune.schedules.config import Config
from tritune.schedules.contraction import EXTENSIONS, KNOBS, MAX_ACC_REGS, contraction_space, shared_estimate
from tritune.schedules.space import Limits
from tritune.schedules.space import Knob, Space

H100 = Limits.for_capability(9, 0)


@pytest.fixture(scope="module")
def big():
    return contraction_space(4096, 4096, 4096, 2, H100)


@pytest.mark.system
def test_space_is_larger_than_anyone_would_measure(big):
    assert big.size == np.prod([len(k.values) for k in KNOBS + EXTENSIONS]) >= 40000
    assert len(big.valid_indices) > 500
    assert len(contraction_space(1024, 1024, 1024, 2, H100).valid_indices) > 5000


def test_small_tiles_and_shallow_k_steps_are_pruned_only_where_a_larger_one_fits(big):
    base = Config.of(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3, UNROLL=1)
    assert big.valid(base)
    assert "twice as tall" in big.why_invalid(base.replace(BLOCK_M=32))  # 4096^3: 32-row tiles waste reuse
    assert "K step" in big.why_invalid(base.replace(BLOCK_K=64))  # 128 fits and keeps the pipeline full
    deep = Config.of(BLOCK_M=128, BLOCK_N=256, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=6, UNROLL=1)
    assert big.valid(deep)  # BLOCK_K=64 at 6 stages would not fit in shared memory
    skinny = contraction_space(16, 4096, 4096, 2, H100)
    assert skinny.valid(Config.of(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, GROUP_M=1, num_warps=4,
                                  num_stages=3, UNROLL=1))  # small tiles are how skinny shapes fill the GPU


def test_index_round_trip(big):
    for i in [0, 1, 17, big.size // 2, big.size - 1]:
        assert big.index(big.config(i)) == i
    with pytest.raises(IndexError):
        big.config(big.size)


def test_valid_configs_obey_every_constraint(big):
    for i in big.valid_indices[::97]:
        c = big.config(int(i))
        assert shared_estimate(c, 2) <= H100.shared_bytes
        threads = 32 * c["num_warps"]
        assert c["BLOCK_M"] * c["BLOCK_N"] // threads <= min(MAX_ACC_REGS, 65536 // threads - 48)


def test_constraints_prune_with_a_reason(big):
    too_big = Config.of(BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=5, UNROLL=4)
    assert not big.valid(too_big)
    assert big.why_invalid(too_big)
    ptxas_failure = Config.of(BLOCK_M=256, BLOCK_N=256, BLOCK_K=64, GROUP_M=2, num_warps=16, num_stages=3, UNROLL=1)
    assert "registers" in big.why_invalid(ptxas_failure)  # seen failing in ptxas on an H100
    skinny = contraction_space(16, 4096, 4096, 2, H100)
    wide_tile = Config.of(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1)
    assert "far larger" in skinny.why_invalid(wide_tile)
    assert len(skinny.valid_indices) < len(big.valid_indices)


def test_sampling_is_seeded_distinct_valid_and_excludes(big):
    a = big.sample(np.random.default_rng(3), 50)
    b = big.sample(np.random.default_rng(3), 50)
    assert a == b and len(set(a)) == 50 and all(big.valid(c) for c in a)
    c = big.sample(np.random.default_rng(3), 50, exclude=a[:25])
    assert not set(c) & set(a[:25])


def test_sampling_a_tiny_space_exhausts_it():
    tiny = Space([Knob("x", (1, 2, 3)), Knob("y", (1, 2))], [lambda c: "odd" if c["x"] == 3 else None])
    assert sorted(c["x"] * 10 + c["y"] for c in tiny.sample(np.random.default_rng(0), 99)) == [11, 12, 21, 22]


def test_neighbours_reach_every_knob_value_through_the_nearest_valid_config(big):
    c = big.config(int(big.valid_indices[len(big.valid_indices) // 3]))
    ns = big.neighbours(c)
    one_away = {c.replace(**{k.name: v}) for k in big.knobs for v in k.values if v != c[k.name]}
    assert {n for n in one_away if big.valid(n)} <= set(ns) and len(ns) == len(set(ns))
    assert all(big.valid(n) and n != c for n in ns)
    valid = [big.config(int(i)) for i in big.valid_indices]
    for k in big.knobs:
        for v in k.values:
            with_v = [n for n in valid if n[k.name] == v]
            if v == c[k.name] or not with_v:
                continue
            # the neighbour taking this value changes no more knobs than any valid config with it
            changed = lambda n: sum(n[j.name] != c[j.name] for j in big.knobs)
            reached = [n for n in ns if n[k.name] == v and changed(n) == min(map(changed, with_v))]
            assert reached, (k.name, v)
    rng = np.random.default_rng(0)
    moves = [big.random_neighbour(c, rng) for _ in range(200)]
    assert all(big.valid(m) and m != c for m in moves) and len(set(moves)) >= len(ns) // 2


def test_a_move_that_breaks_a_constraint_adjusts_the_fewest_other_knobs():
    # y=2 is only valid with z=1: moving y from 1 to 2 must bring z along, and change nothing else
    s = Space([Knob("x", (1, 2)), Knob("y", (1, 2)), Knob("z", (0, 1, 2))],
              [lambda c: "y=2 needs z=1" if c["y"] == 2 and c["z"] != 1 else None])
    c = Config.of(x=1, y=1, z=2)
    assert Config.of(x=1, y=2, z=1) in s.neighbours(c)
    assert c.replace(y=2) not in s.neighbours(c)
    moves = {s.random_neighbour(c, np.random.default_rng(i)) for i in range(40)}
    assert moves == {Config.of(x=2, y=1, z=2), Config.of(x=1, y=1, z=0), Config.of(x=1, y=1, z=1),
                     Config.of(x=1, y=2, z=1)}


def test_warp_specialisation_only_where_triton_can_build_it():
    fp16 = contraction_space(4096, 4096, 4096, 2, Limits.for_capability(9, 0), tma=2)
    ws = [c for c in (fp16.config(int(i)) for i in fp16.valid_indices) if c["WARP_SPEC"]]
    assert len(ws) > 100
    assert all(c["num_warps"] == 4 and c["UNROLL"] == 1 and c["TMA"] and c["num_stages"] <= 4
               and c["PERSISTENT"] != 2 and c["SPLIT_K"] == 1 and c["BLOCK_M"] >= 64 for c in ws)
    assert any(c["BLOCK_M"] * c["BLOCK_N"] == 128 * 256 for c in ws)  # 8 compute warps hold the big tiles
    fp32 = contraction_space(4096, 4096, 4096, 4, Limits.for_capability(9, 0), tma=2)
    assert not any(fp32.config(int(i))["WARP_SPEC"] for i in fp32.valid_indices)


def test_config_is_a_canonical_value():
    a = Config.of(b=2, a=1)
    assert a == Config.of({"a": 1, "b": 2}) and hash(a) == hash(Config.of(a=1, b=2))
    assert a.to_json() == '{"a":1,"b":2}' and Config.from_json(a.to_json()) == a
    assert a.replace(b=3)["b"] == 3 and a["b"] == 2


def test_pruned_enumeration_equals_checking_every_config():
    full = contraction_space(70, 48, 3000, 2, Limits(232448, 8), tma=2)
    # every other value of each knob: small enough to check one by one
    space = Space([Knob(k.name, k.values[::2]) for k in full.knobs], full.constraints)
    brute = [i for i in range(space.size) if space.valid(space.config(i))]
    assert brute and list(space.valid_indices) == brute


PLAIN = Config.of(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1,
                  SPLIT_K=1, TMA=0, PERSISTENT=0)


def test_split_k_only_where_the_grid_is_short_of_programs(big):
    skinny = contraction_space(16, 4096, 4096, 2, H100, tma=2)
    assert skinny.valid(PLAIN.replace(SPLIT_K=4)) and skinny.valid(PLAIN.replace(SPLIT_K=4, TMA=1))
    assert "K step" in skinny.why_invalid(PLAIN)  # unsplit, a 256-deep step would do better
    wide = PLAIN.replace(BLOCK_N=256, BLOCK_K=256)
    assert "K slice" in skinny.why_invalid(wide.replace(SPLIT_K=16))  # 16 slices of 1 step each
    square = PLAIN.replace(BLOCK_M=128, BLOCK_N=128, num_warps=8)
    assert "fills the GPU" in big.why_invalid(square.replace(SPLIT_K=2))


def test_tma_only_where_rows_are_16_byte_aligned_and_persistent_only_past_one_wave(big):
    tile = PLAIN.replace(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8)
    assert "16-byte" in big.why_invalid(tile.replace(TMA=1))  # built without tma
    assert contraction_space(4096, 4096, 4096, 2, H100, tma=2).valid(tile.replace(TMA=2, PERSISTENT=1))
    assert "16-byte" in contraction_space(4096, 4096, 4096, 2, H100, tma=1).why_invalid(tile.replace(TMA=2))
    assert "one wave" in contraction_space(512, 512, 4096, 2, H100).why_invalid(tile.replace(PERSISTENT=1))
    assert "persistent" in contraction_space(4096, 4096, 128, 2, H100, batch=4).why_invalid(tile.replace(PERSISTENT=1))


def test_without_extension_knobs_is_plain_tiling(big):
    plain = big.without([k.name for k in EXTENSIONS])
    assert [k.name for k in plain.knobs] == [k.name for k in KNOBS]
    # x persistent off / on / flattened (some flattened ones need too much shared memory); no TMA here
    assert 2 * len(plain.valid_indices) < len(big.valid_indices) <= 3 * len(plain.valid_indices)


def test_a_tile_is_never_pruned_for_a_larger_one_the_problem_forbids():
    tall = contraction_space(401408, 64, 147, 2, H100)  # conv stem as GEMM: N=64 allows no wider tile
    assert len(tall.valid_indices) > 0
    assert tall.valid(Config.of(BLOCK_M=256, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=8, num_stages=3,
                                UNROLL=1, SPLIT_K=1, TMA=0, PERSISTENT=0))
