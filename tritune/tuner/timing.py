"""The one timing authority: how tritune times a kernel (a candidate, a library call, a comparison),
a call, and a whole compiled model. The worker, the whole-model check and the benchmark scripts all
time through here, so that every number in a table was taken the same way.

- Kernels: CUDA events around each run, L2 flushed before each (`time_fn`, `time_candidate`).
- Calls and compiled models: mean time per call of calls back to back, as a serving loop issues them
  (`per_call_ms`), or the host's own time per launch (`host_ms_per_launch`).
- Comparisons: functions timed in turns, in an order shuffled per round (`in_turns`), compared by
  round (`paired_ratio`).

torch and Triton are imported where they are used: the tuning process reads `Timing` without them.
"""
from __future__ import annotations

import random
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

QUANTILES = (0.0, 0.2, 0.5, 0.8)


@dataclass(frozen=True)
class Timing:
    """How long to time: warm-up and repetition budgets in milliseconds of kernel time; for
    candidates also how many runs decide that one is a loser, and the bounds on the runs timed."""

    warmup_ms: float = 10.0
    rep_ms: float = 20.0
    first_runs: int = 5
    min_runs: int = 20
    max_runs: int = 300


# Comparisons that are reported (the end-of-run head-to-head, benchmarks) time longer than candidates.
COMPARE = Timing(warmup_ms=25.0, rep_ms=100.0)

# A candidate whose fastest of its first runs is this much slower than the best median so far is not
# timed further: the spread of a config's runs stays far below this on the recorded spaces (see
# tests/tuner/test_timing.py), so it cannot be the best.
LOSER = 1.25


def clearly_slower(fastest_ms: float, best_ms: float | None) -> bool:
    """True when a candidate's fastest run so far already loses to the best median by LOSER."""
    return best_ms is not None and fastest_ms > LOSER * best_ms


def runs_for(estimate_ms: float, timing: Timing) -> int:
    """How many runs fill the repetition budget for a kernel of this runtime (within the bounds)."""
    return int(min(timing.max_runs, max(timing.min_runs, timing.rep_ms / max(estimate_ms, 1e-6))))


def time_fn(fn: Callable[[], Any], timing: Timing) -> tuple[float, ...]:
    """(min, p20, median, p80) in ms: warmed up, L2 flushed before each run, CUDA events."""
    from triton.testing import do_bench

    return tuple(float(t) for t in do_bench(fn, warmup=timing.warmup_ms, rep=timing.rep_ms,
                                            quantiles=list(QUANTILES)))


def time_candidate(fn: Callable[[], Any], timing: Timing, best_ms: float | None = None) -> tuple[tuple[float, ...], int, bool]:
    """(min, p20, median, p80) ms of a candidate, how many runs were timed, and whether timing
    stopped early because the candidate is clearly slower than `best_ms`. L2 is flushed before
    each timed run (as triton's do_bench does), after a warm-up of `timing.warmup_ms`."""
    warm_up(fn, timing)
    first = timed_runs(fn, timing.first_runs)
    if clearly_slower(min(first), best_ms):
        return quantiles(first), len(first), True
    rest = timed_runs(fn, max(0, runs_for(statistics.median(first), timing) - len(first)))
    return quantiles(first + rest), len(first) + len(rest), False


def warm_up(fn: Callable[[], Any], timing: Timing) -> None:
    """Run fn for about `timing.warmup_ms` (clocks up, caches and the launch path warm)."""
    estimate = timed_runs(fn, 1)[0]
    for _ in range(int(min(timing.max_runs, max(1, timing.warmup_ms / max(estimate, 1e-6))))):
        fn()


def timed_runs(fn: Callable[[], Any], runs: int, flush: Callable[[], Any] | None = None) -> list[float]:
    """ms of each of `runs` runs, each after an L2 flush (`flush`, else zeroing 256 MB), by CUDA events."""
    import torch

    flush = flush or _flush_buffer().zero_
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in pairs:
        flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


# A launch timed right after the flush still counts the host's time where the host is slower than
# the flush: the start event fires when the flush ends, and the GPU then waits for the launch. In a
# slow phase of the host a 6 us decode projection's library call read over 50 us that way, and its
# workload's head-to-head was timed by launches (its torch.compile alternative at 116 us, host time).
# A spin queued after the flush keeps the GPU busy for this long while the host launches.
HOST_COVER_CYCLES = 400_000  # about 0.2 ms at an H100's clocks


def covered_runs(fn: Callable[[], Any], runs: int) -> list[float]:
    """As `timed_runs` (L2 flushed before each run), with the GPU kept busy after each flush while
    the host launches `fn`: the host's own time is not in them (what decides how a kernel is timed)."""
    import torch

    flush, spin = _flush_buffer().zero_, getattr(torch.cuda, "_sleep", None)

    def covered_flush() -> None:
        flush()
        if spin is not None:
            spin(HOST_COVER_CYCLES)
    return timed_runs(fn, runs, covered_flush)


def quantiles(times: list[float]) -> tuple[float, ...]:
    """(min, p20, median, p80) of run times, interpolated as do_bench reports them."""
    import numpy as np

    return tuple(float(q) for q in np.quantile(times, QUANTILES))


_flush: list = []


def _flush_buffer() -> Any:
    """256 MB on the GPU, zeroed before each timed run so that no run finds its operands in L2."""
    import torch

    if not _flush:
        _flush.append(torch.empty(64 * 2**20, dtype=torch.int32, device="cuda"))
    return _flush[0]


def kernel_median_ms(timing: Timing) -> Callable[[Callable[[], Any]], float]:
    """A timer for `in_turns`: a kernel's median ms by `time_fn` with these budgets."""
    return lambda fn: time_fn(fn, timing)[2]


def in_turns(fns: dict[str, Callable[[], Any]], time_one: Callable[[Callable[[], Any]], float], rounds: int,
             after_round: Callable[[dict], None] | None = None) -> dict[str, list[float]]:
    """Each function's time (by `time_one`) in each of `rounds` rounds, the functions timed in turns
    in an order shuffled per round (seeded: the same order every run): the GPU's clocks and a shared
    host's speed come and go within seconds (one model's decode step read 0.72 and 1.40 ms in
    rounds of one run), so a round's functions run close together and no function always runs right
    after another (compare by round: `paired_ratio`). `after_round` gets the times so far."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for round_ in range(rounds):
        random.Random(round_).shuffle(order)
        for name in order:
            times[name].append(time_one(fns[name]))
        if after_round is not None:
            after_round(times)
    return times


def paired_ratio(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The median over rounds of ours / theirs timed in the same round."""
    return statistics.median(o / t for o, t in zip(ours, theirs))


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_ms(fn: Callable[[], Any], budget_s: float = 0.01) -> float:
    """Mean ms per call of calls back to back (the host queues the next while the GPU runs this
    one, as a serving loop does; no cache flush between calls) over about `budget_s`, after a
    warm-up."""
    for _ in range(2):
        fn()
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    calls = max(3, int(budget_s / max(time.perf_counter() - start, 1e-6)))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync()
    return (time.perf_counter() - start) * 1e3 / calls


def host_ms_per_launch(fn: Callable[[], Any], calls: int = 400, rounds: int = 5) -> float:
    """The median over `rounds` of the host's own time per asynchronous launch (give it a tiny
    problem, so that the GPU is never the limit and the launch queue never fills)."""
    times = []
    for _ in range(rounds):
        _sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) * 1e3 / calls)
        _sync()
    return statistics.median(times)


def step_caller(compiled: Callable[..., Any], inputs: Sequence[Any], cuda_graphs: bool) -> Callable[[], Any]:
    """One call of a compiled model, to time; under CUDA graphs a new step begins first (a replay
    may overwrite the last step's output, which torch refuses unless told)."""
    import torch

    if not cuda_graphs:
        return lambda: compiled(*inputs)
    return lambda: (torch.compiler.cudagraph_mark_step_begin(), compiled(*inputs))[1]


# Kernels whose run is shorter than this are timed as CUDA-graph replays of calls back to back:
# launched one by one from Python, a few-microsecond kernel's time is mostly the host's (a 3 us
# decode projection read 89 us through do_bench against the library's Python call).
SMALL_MS = 0.05
# Longer memory-bound kernels (an LM head at decode) pay the write flush instead: the L2's dirty
# lines (~50 MB) are written back while the timed run reads, ~10 us on an H100. A 1x32000x2048 head
# (45 us in a graph, 97% of the copy bandwidth) read 57 us launched after the flush, cuBLAS 62
# against 49 us. So a kernel under STREAM_MS whose operands take at least half its time at the
# copy bandwidth is timed in graphs too. Compute-bound ones stay with launches: timed in graphs,
# 4096^3 candidates made the tuning loop slower (17 against 14-15 s for 128 trials, H100), and
# at prefill every verdict went to the library where launches had found whole-model wins.
STREAM_MS = 0.5
ROTATE_L2 = 3  # operand sets that rotate within a graph span this many times the L2 (calls read HBM)
MAX_SETS = 64
GRAPH_MS = 2.0  # kernel time captured in one graph


def operand_sets(make: Callable[[int], Any], set_bytes: int) -> list:
    """Copies of a workload's operands (`make(i)`), enough that calls cycling through them read
    their operands from memory, not from the L2 the previous call filled (as the layers of a model
    each read their own weights): together at least ROTATE_L2 times the L2's size, at most MAX_SETS."""
    import math

    import torch

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    n = min(MAX_SETS, max(1, math.ceil(ROTATE_L2 * l2 / max(set_bytes, 1))))
    return [make(i) for i in range(n)]


def graph_timed(launched_ms: float, nbytes: int) -> bool:
    """Whether a kernel of `launched_ms` (launched after the flush) over `nbytes` of operands is
    timed as CUDA-graph replays: under SMALL_MS, or a memory-bound one under STREAM_MS (its bytes at
    the copy bandwidth, measured only for such kernels, take at least half its time)."""
    if launched_ms < SMALL_MS:
        return True
    return launched_ms < STREAM_MS and nbytes / (copy_bandwidth_gbps() * 1e6) >= launched_ms / 2


def capture(calls: Sequence[Callable[[], Any]], repeats: int) -> Any:
    """A CUDA graph of `calls` in turn, `repeats` times (warmed up first on a side stream, as
    capture needs: libraries create their handles and workspaces on first use)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            for call in calls:
                call()
    return graph


def graph_candidate(calls: Sequence[Callable[[], Any]], timing: Timing, best_ms: float | None = None
                    ) -> tuple[tuple[float, ...], int, bool]:
    """As `time_candidate`, for a small kernel: ms per call of calls back to back (cycling through
    `calls`, one per operand set) captured in one CUDA graph of about GRAPH_MS, each replay timed
    by CUDA events: no host time, no launch gap, operands read from memory. Runs counted in replays."""
    estimate = max(min(timed_runs(call, 1)[0] for call in calls[:2]), 1e-4)
    repeats = max(1, int(GRAPH_MS / estimate / len(calls)))
    graph, per_replay = capture(calls, repeats), repeats * len(calls)
    warm_up(graph.replay, timing)
    first = [t / per_replay for t in _replays(graph, timing.first_runs)]
    if clearly_slower(min(first), best_ms):
        return quantiles(first), len(first), True
    more = max(0, min(timing.max_runs, max(timing.min_runs // 4, int(timing.rep_ms / GRAPH_MS))) - len(first))
    rest = [t / per_replay for t in _replays(graph, more)]
    return quantiles(first + rest), len(first) + len(rest), False


def _replays(graph: Any, runs: int) -> list[float]:
    """ms of each of `runs` replays of a graph, by CUDA events (no flush: the operands rotate)."""
    import torch

    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def graph_median_ms(timing: Timing) -> Callable[[Sequence[Callable[[], Any]]], float]:
    """A timer for `in_turns` over small kernels: the median ms per call of `graph_candidate`."""
    return lambda calls: graph_candidate(calls, timing)[0][2]


_copy: list[float] = []


def copy_bandwidth_gbps() -> float:
    """The device's measured memory bandwidth, GB/s: a 1 GiB device-to-device copy (bytes read
    plus bytes written) per second, the fastest of ten after a warm-up; measured once per process."""
    import torch

    if not _copy:
        src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        best = min(timed_runs(lambda: dst.copy_(src), 10))
        _copy.append(2 * src.numel() / (best * 1e-3) / 1e9)
        del src, dst
    return _copy[0]


def busy_time(spans: Sequence[tuple[float, float]]) -> float:
    """The length of the union of (start, end) spans: a GPU's busy time, kernels that overlap (an
    early launch waiting on its predecessor) counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def gpu_spans(fn: Callable[[], Any], calls: int = 20) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of everything the profiler saw the GPU run (kernels, copies) over
    `calls` calls of `fn` back to back, in order of start."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with warnings.catch_warnings():  # torch's note that events are cleared per cycle: one cycle here
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            _sync()
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA)


def gpu_ms_per_call(fn: Callable[[], Any], calls: int = 20) -> float:
    """The GPU's own time per call: the device time of every kernel the profiler saw over `calls`
    calls back to back, over `calls` (the host cannot distort it; gaps between kernels are not in it)."""
    for _ in range(3):
        fn()
    return sum(end - start for start, end, _ in gpu_spans(fn, calls)) / calls / 1e3
