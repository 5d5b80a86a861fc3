"""Deeper weight-streaming pipelines (`TRITUNE_DEEP_STAGES=1`, `Limits.deep_stages`): only the GEMM
spaces of decode's rows (above the GEMV path's, at most STREAM_MAX_ROWS) reach past six stages;
every other space, and every space without the switch, is unchanged; a pipeline deeper than its K
loop is pruned; the streaming seeds take the deepest; and the deep configs build for sm_90 with
the shared-memory estimate exact (their speed is for a GPU to show: BENCHMARKS.md)."""
from dataclasses import replace

from test_codegen_sm90 import build_sm90
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.schedules.config import Config
from tritune.schedules.contraction import PLAIN_STAGES, contraction_space, shared_estimate
from tritune.schedules.gated import gated_space
from tritune.schedules.space import Limits
from tritune.schedules.wide import wide_space

H100 = Limits.for_capability(9, 0)
DEEP = replace(H100, deep_stages=True)


def _stages(space) -> tuple[int, ...]:
    return next(k.values for k in space.knobs if k.name == "num_stages")


def _valid_stages(space) -> set[int]:
    return {space.config(int(i))["num_stages"] for i in space.valid_indices}


def test_only_decode_rows_reach_deeper_and_only_when_asked():
    for build in (lambda m, lim: contraction_space(m, 2048, 5632, 2, lim),
                  lambda m, lim: gated_space(m, 5632, 2048, 2, lim),
                  lambda m, lim: wide_space(m, (2048, 512, 512), 2048, 2, lim)):
        assert _stages(build(16, DEEP))[-1] == 12 and max(_valid_stages(build(16, DEEP))) == 12
        for m, limits in ((16, H100), (2, DEEP), (65, DEEP), (2048, DEEP)):
            assert _stages(build(m, limits)) == PLAIN_STAGES, (m, limits)


def test_the_seeds_stream_at_the_deepest_pipeline_that_fits():
    plain, deep = contraction_space(16, 2048, 5632, 2, H100), contraction_space(16, 2048, 5632, 2, DEEP)
    assert max(s["num_stages"] for s in plain.seeds) == 6
    assert max(s["num_stages"] for s in deep.seeds) == 12
    for seed in deep.seeds:  # each at its deepest valid pipeline
        assert seed["num_stages"] == 12 or not deep.valid(seed.replace(num_stages=PLAIN_STAGES[-1] + 2
                                                                      if seed["num_stages"] == 6 else seed["num_stages"] + 2))


def test_a_pipeline_deeper_than_its_k_loop_is_pruned_and_the_plain_stages_are_kept():
    space = contraction_space(16, 2048, 2048, 2, DEEP)  # 8 steps of 256, 16 of 128
    at = Config.of(BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, GROUP_M=1, num_warps=2, num_stages=8, UNROLL=1,
                   SPLIT_K=1, TMA=0, PERSISTENT=0, WARP_SPEC=0)
    assert space.valid(at) and not space.valid(at.replace(num_stages=10))
    assert space.valid(at.replace(BLOCK_K=128, num_stages=12))
    assert space.valid(at.replace(num_stages=6)) and space.valid(at.replace(SPLIT_K=2, num_stages=4))
    assert not space.valid(at.replace(SPLIT_K=2, num_stages=8))  # 4 steps per K slice


def test_the_switch_is_read_from_the_environment(monkeypatch):
    from tritune.settings import Settings
    from tritune.tuner import task

    monkeypatch.setenv("TRITUNE_DEEP_STAGES", "1")
    assert Settings.from_env().deep_stages
    monkeypatch.setenv("TRITUNE_DEEP_STAGES", "0")
    assert not Settings.from_env().deep_stages
    monkeypatch.setattr(task, "SETTINGS", replace(task.SETTINGS, deep_stages=True))
    assert task.device_limits({"capability": "9.0", "shared_bytes": 0, "sms": 0}).deep_stages


def test_deep_pipelines_build_for_sm90_with_the_shared_estimate_exact():
    tile = Config.of(BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, GROUP_M=1, num_warps=2, num_stages=12, UNROLL=1)
    cases = [(Matmul(16, 2048, 5632, trans_b=True), tile), (Matmul(16, 2048, 5632, trans_b=True), tile.replace(TMA=1)),
             (Gated(16, 5632, 2048), tile.replace(num_stages=10, FUSE=0)),
             (Wide(16, (2048, 512, 512), 2048, norm_eps=1e-6), tile.replace(BLOCK_N=32, BLOCK_K=128, num_stages=12))]
    for (expr, config), built in zip(cases, build_sm90(cases)):
        b_tiles = 2 if isinstance(expr, Gated) else 1
        # a row norm's prologue keeps a few KB more than the estimate counts (as at six stages)
        extra = 4096 if getattr(expr, "norm_eps", None) else 256
        assert 0 <= built["shared"] - shared_estimate(config, 2, b_tiles) <= extra, expr.describe()
        assert built["shared"] <= H100.shared_bytes


def test_a_search_resumed_without_the_switch_learns_from_deep_trials_and_proposes_within_its_space():
    # trials stored by a run with deep pipelines (the fastest among them) are outside the plain
    # space: the model learns from them, but annealing neither starts from them nor walks around them
    import numpy as np

    from tritune.kernels.family import family
    from tritune.records.result import MeasureResult, Status
    from tritune.search import make_strategy

    fam, expr = family("matmul"), Matmul(16, 2048, 5632, trans_b=True)
    deep, plain = fam.space(expr, DEEP), fam.space(expr, H100)
    deepest = [c for c in (deep.config(int(i)) for i in deep.valid_indices) if c["num_stages"] == 12][:3]
    sample = plain.sample(np.random.default_rng(0), 10)
    results = [MeasureResult(c, Status.OK, 0.01, 0.01, 0.01, 0.01) for c in deepest]
    results += [MeasureResult(c, Status.OK, 0.02, 0.02, 0.02 + i / 1000, 0.02) for i, c in enumerate(sample)]
    strategy = make_strategy("sa", plain, seed=0, features=lambda cs: fam.features(expr, H100, cs))
    strategy.update(results)
    proposed = strategy.propose(16)
    assert len(proposed) == 16 and all(plain.in_product(c) and plain.valid(c) for c in proposed)
    assert not deepest[0] in proposed and not plain.in_product(deepest[0])
