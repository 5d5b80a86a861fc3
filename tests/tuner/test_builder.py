"""The real compile pool: a compiler process that dies blames only the candidate that killed it."""
import os

import pytest

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


@pytest.mark.system
def test_later_workloads_spaces_are_enumerated_in_the_pool_as_here():
    import numpy as np

    from tritune.kernels.contraction.expr import Matmul
    from tritune.records.result import DeviceKey
    from tritune.schedules.space import Limits
    from tritune.tuner import run as tuning
    from tritune.tuner.task import Task

    tasks = [Task(Matmul(m, 256, 512), DeviceKey("G", "9.0", "-", "-", "-"), Limits.for_capability(9, 0))
             for m in (64, 200)]
    builder = Builder(workers=1)
    try:
        futures = tuning._enumerate_ahead(tasks, builder)
        for task, future in zip(tasks, futures):
            tuning._take_valid(task, future)
            assert "valid_indices" in task.space.__dict__  # filled from the pool, not enumerated here
            fresh = Task(task.expr, task.device, task.limits).space.valid_indices
            assert np.array_equal(task.space.valid_indices, fresh) and len(fresh) > 100
    finally:
        builder.close()


def test_the_pool_takes_the_cpus_this_process_may_run_on(monkeypatch):
    from tritune.tuner import builder as b

    monkeypatch.setattr(b.os, "sched_getaffinity", lambda pid: {2, 3, 5}, raising=False)
    assert b.usable_cpus() == 3  # e.g. under taskset: not the machine's count
    monkeypatch.delattr(b.os, "sched_getaffinity", raising=False)
    assert b.usable_cpus() == (os.cpu_count() or 1)
