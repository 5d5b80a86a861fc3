"""The real compile pool: a compiler process that dies blames only the candidate that killed it."""
from fakes import abort_on_block_m_32

from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.tuner.builder import Builder


class AbortingBuilder(Builder):
    build = staticmethod(abort_on_block_m_32)


def test_a_compiler_crash_blames_only_its_candidate_and_the_pool_recovers():
    builder = AbortingBuilder(target=None, workers=2)
    try:
        configs = [Config.of(BLOCK_M=m) for m in (16, 32, 64, 128, 256)]
        results = [builder.result(f, c) for c, f in zip(configs, builder.submit("expr", "problem", configs))]
        assert [r.status for r in results] == [None, Status.COMPILE_ERROR, None, None, None]
        assert "compiler process died" in results[1].message
        again = builder.submit("expr", "problem", [Config.of(BLOCK_M=16)])  # the pool works after the crash
        assert builder.result(again[0], Config.of(BLOCK_M=16)).status is None
    finally:
        builder.close()
