"""The candidate timing policy: when a candidate stops being timed, and how many runs it gets.

The fixtures are real H100 timings (scripts/probes/timing_probe.py): 40 random configs of each of two
workloads, timed run by run as the worker times candidates, after the GPU idled as it does while a
candidate compiles."""
import json
from pathlib import Path

import pytest

from tritune.tuner.timing import LOSER, Timing, clearly_slower, runs_for

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "timing").glob("*.json"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_config_is_never_stopped_by_a_best_it_would_have_beaten(path):
    # A candidate is stopped when the fastest of its first runs exceeds LOSER x the best median so
    # far. If it would have been the new best (its median below that best), stopping it needs its
    # fastest first run above LOSER x its own median: on real GPU runs that never comes near.
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) >= 30
    worst = max(min(r["first"]) / r["long"]["median"] for r in rows)
    assert worst < 1 + (LOSER - 1) / 2, worst  # at most half of LOSER's margin used
    for r in rows:
        assert not clearly_slower(min(r["first"]), r["long"]["median"])


def test_losers_are_stopped_and_only_with_a_best_to_compare_with():
    assert clearly_slower(1.3, 1.0) and not clearly_slower(1.2, 1.0)
    assert not clearly_slower(100.0, None)  # the first candidate (or a recording run) is timed in full


def test_the_run_budget_follows_the_kernel_runtime():
    timing = Timing(rep_ms=20.0, min_runs=20, max_runs=300)
    assert runs_for(0.2, timing) == 100  # 20 ms of a 0.2 ms kernel
    assert runs_for(5.0, timing) == 20  # slow kernels: never fewer than min_runs
    assert runs_for(0.001, timing) == 300  # tiny kernels: never more than max_runs
    assert runs_for(0.0, timing) == 300


def test_operand_sets_span_the_l2_so_calls_read_memory(monkeypatch):
    import torch

    from tritune.tuner import timing

    class Props:
        L2_cache_size = 50 * 2**20

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    made = timing.operand_sets(lambda i: i, set_bytes=8 * 2**20)  # a decode projection's 8 MB weight
    assert made == list(range(19))  # 19 x 8 MB >= 3 x 50 MB
    assert timing.operand_sets(lambda i: i, set_bytes=400 * 2**20) == [0]  # an LM head: one set is enough
    assert len(timing.operand_sets(lambda i: i, set_bytes=1024)) == timing.MAX_SETS


def test_the_tables_give_gb_per_s_and_the_share_of_the_copy_bandwidth():
    from tritune.tuner.cli.display import bandwidth

    h2h = {"bytes": 8_000_000, "copy_gbps": 3000.0}
    assert bandwidth(h2h, 0.004) == ("2,000", "67%")  # 8 MB in 4 us
    assert bandwidth({"bytes": 8_000_000}, 0.004) == ("2,000", "")
    assert bandwidth({}, 0.004) == ("", "")


def test_weight_streams_up_to_half_a_millisecond_are_timed_in_graphs(monkeypatch):
    # Launched after the write flush, a memory-bound kernel also pays the write-back of the L2's
    # dirty lines (~10 us on an H100): a 131 MB LM head (45 us in a graph) read 57 us. Such
    # kernels go to graphs; compute-bound ones over 50 us (prefill, 4096^3) stay with launches.
    from tritune.tuner import timing
    from tritune.tuner.worker import candidate

    gbps, mb = 3000.0, 10**6
    cases = ((0.004, 8 * mb, True),  # a decode projection: under SMALL_MS
             (0.030, 1 * mb, True),  # any kernel under SMALL_MS
             (0.057, 131 * mb, True),  # the LM head at one row: 44 us of bytes
             (0.220, 622 * mb, True),  # a 622 MB head
             (0.200, 100 * mb, False),  # 4096^3 fp16: 33 us of bytes in 200 us
             (0.400, 270 * mb, False),  # a prefill LM head: compute-bound
             (0.600, 2000 * mb, False))  # over STREAM_MS: launches
    monkeypatch.setattr(timing, "copy_bandwidth_gbps", lambda: gbps)
    for launched_ms, nbytes, in_graphs in cases:
        monkeypatch.setattr(candidate, "covered_runs", lambda fn, runs, t=launched_ms: [t] * runs)
        monkeypatch.setattr(candidate, "nbytes", lambda args, n=nbytes: n)
        assert candidate.small(lambda: None, ()) is in_graphs, (launched_ms, nbytes)


def test_how_a_kernel_is_timed_is_decided_without_the_hosts_time(monkeypatch):
    # each timed launch: the flush, then a spin that keeps the GPU busy while the host launches the
    # kernel, and only then the start event (a slow host cannot leave the GPU idle inside the timing)
    import torch

    from tritune.tuner import timing

    order = []

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            order.append("event")

        def elapsed_time(self, other):
            return 0.004

    class Flush:
        def zero_(self):
            order.append("flush")
    monkeypatch.setattr(timing, "_flush_buffer", lambda: Flush())
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: order.append(f"spin {cycles}"), raising=False)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    assert timing.covered_runs(lambda: order.append("kernel"), 2) == [0.004, 0.004]
    spin = f"spin {timing.HOST_COVER_CYCLES}"
    assert order == ["flush", spin, "event", "kernel", "event"] * 2


def test_busy_time_counts_overlaps_once():
    from tritune.tuner.timing import busy_time

    assert busy_time([]) == 0
    assert busy_time([(5, 6), (0, 2), (1, 3)]) == 4
    assert busy_time([(0, 10), (2, 3), (4, 12)]) == 12
