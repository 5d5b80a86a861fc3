"""Builder: compiles candidates in parallel worker processes; needs no GPU.

Compiling fills Triton's on-disk cache, so the runner's later compile of the same candidate is a
cache hit; the builder reports compile time, shared memory, and failures as statuses.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from tritune.kernels.family import family
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.worker.failures import classify
from tritune.tuner.worker.lifeline import bind_to_parent, leave, start_lasting


@dataclass(frozen=True)
class BuildResult:
    """Outcome of compiling one candidate: status None means it built and may be measured."""

    config: Config
    status: Status | None
    compile_s: float
    shared_bytes: int = 0
    message: str = ""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: `taskset`, a container's cpuset), where the
    OS says; else the machine's count. A pool larger than that only makes its compiles queue."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this OS
        return os.cpu_count() or 1


def build_one(expr: Any, config: Config, problem: Any, target: Any, shared_limit: int) -> BuildResult:
    """Compile one candidate and classify the outcome (runs in a pool worker)."""
    start = time.perf_counter()
    try:
        compiled = family(expr.op).compile(expr, config, problem, target)
    except Exception as exc:  # noqa: BLE001 - any compiler failure is a result, not a crash
        status, _ = classify(exc, compiling=True)
        return BuildResult(config, status, time.perf_counter() - start, message=f"{type(exc).__name__}: {exc}"[:2000])
    elapsed = time.perf_counter() - start
    shared = compiled.metadata.shared
    if shared_limit and shared > shared_limit:
        return BuildResult(config, Status.OUT_OF_RESOURCES, elapsed, shared,
                           f"needs {shared} bytes of shared memory, the device allows {shared_limit}")
    return BuildResult(config, None, elapsed, shared)


def _pool_process(parent: int) -> None:
    """Start of every pool process: it ends with its parent, and compiles at a lower priority than
    the tuning loop, which proposes the next round while the pool compiles (on a host whose cores
    are all compiling, the proposals otherwise ran three times slower and held the GPU up)."""
    bind_to_parent(parent)
    os.nice(10)
    # once the pool is shut down, skip the interpreter's finalisation (torch's and Triton's
    # modules): 16 of them at once held the parent's exit for seconds
    atexit.register(leave)


def import_compiler() -> None:
    """Import what compiling needs (torch, Triton, the op families: seconds) in a pool process."""
    from tritune.kernels.contraction import launch  # noqa: F401 - imported for its cost
    from tritune.kernels.family import parse_expr

    family(parse_expr("matmul", "256", "fp16").op)


def warm_pool_process(target: Any) -> None:
    """Pay a pool process's one-time costs (imports, the compiler back end's first use) by building
    a small matmul at its default config, before any candidate is waiting for the process."""
    from tritune.kernels.contraction.launch import DEFAULT
    from tritune.kernels.family import parse_expr

    expr = parse_expr("matmul", "256", "fp16")
    build_one(expr, DEFAULT, family("matmul").canonical_problem(expr), target, 0)


class _Pool(ProcessPoolExecutor):
    """A process pool whose processes all start from the process's lasting thread (`start_lasting`):
    a pool starts its processes from whichever thread submits when none is idle, and a pool
    replaced after a compiler crash was filled by a workload's loop or measuring thread, whose end
    killed them (their lifeline is tied to the thread that started them)."""

    def _spawn_process(self) -> None:
        start_lasting(super()._spawn_process)


class PoolShares:
    """The tuning loops compiling in one pool now, and each one's part of it: with several workloads
    tuned at once (tune-model over several GPUs) each loop keeps only its part of the pool busy, so
    that together they fill it without each counting all of it. The pool's processes are split
    evenly among the loops running now, the loops that joined first taking one more where they do
    not divide evenly (the parts add up to the pool), at least one each; a loop's part grows as the
    others end."""

    def __init__(self, workers: Callable[[], int]) -> None:
        self._workers = workers  # the pool's size, asked each time (a test's stand-in sets it late)
        self._loops: list[object] = []  # in the order they joined
        self._lock = threading.Lock()

    @property
    def loops(self) -> int:
        """Loops compiling in the pool now."""
        with self._lock:
            return len(self._loops)

    @contextmanager
    def taken(self) -> Iterator[Callable[[], int]]:
        """A loop's part of the pool while the block runs: a callable that says how many of the
        pool's processes are the loop's now (read it each time: loops come and go)."""
        token = object()
        with self._lock:
            self._loops.append(token)
        try:
            yield lambda: self._part(token)
        finally:
            with self._lock:
                self._loops.remove(token)

    def _part(self, token: object) -> int:
        with self._lock:
            loops, rank = len(self._loops), self._loops.index(token)
        whole, left = divmod(self._workers(), loops)
        return max(1, whole + (rank < left))


class Builder:
    """A process pool compiling candidates for one target. Candidates are submitted by the tuning
    loop and collected by the measurer thread: the pool is replaced under a lock when it dies.
    Tuning loops that compile in it at once each take their part of it (`shares`)."""

    build = staticmethod(build_one)  # what a pool process runs per candidate (tests swap it)

    def __init__(self, target: Any = None, shared_limit: int = 0, workers: int | None = None) -> None:
        self.target, self.shared_limit = target, shared_limit
        self.workers = workers or usable_cpus()
        self._lock = threading.Lock()
        self._pool = self._new_pool()
        # what each future compiles, and in which pool, to retry it if that pool dies
        self._jobs: dict[Future, tuple[Any, Any, ProcessPoolExecutor]] = {}
        self.watch = Stopwatch()  # compile seconds spent in the pool's processes
        self.shares = PoolShares(lambda: self.workers)  # the tuning loops compiling here now

    def _new_pool(self, workers: int | None = None) -> ProcessPoolExecutor:
        # spawn: the parent may hold CUDA or thread state that a fork would copy
        return _Pool(workers or self.workers, mp_context=mp.get_context("spawn"),
                     initializer=_pool_process, initargs=(os.getpid(),))

    def spawn(self) -> None:
        """Start every pool process now and import the compiler in each, before the target is
        known (while the GPU worker starts), so that `start` finds them up."""
        with self._lock:
            for _ in range(self.workers):
                self._pool.submit(import_compiler)

    def start(self, target: Any, shared_limit: int = 0) -> None:
        """Set the target (known once the GPU worker has reported its device) and warm every pool
        process up while the tuner prepares its first round."""
        self.target, self.shared_limit = target, shared_limit
        if self.build is build_one:
            for _ in range(self.workers):
                self._pool.submit(warm_pool_process, target)

    def background(self, fn: Any, *args: Any) -> Future:
        """Run other CPU work of the run in a pool process (e.g. enumerating the next workloads'
        spaces: seconds of Python that a thread would take from the loop through the GIL)."""
        with self._lock:
            return self._pool.submit(fn, *args)

    def submit(self, expr: Any, problem: Any, configs: Sequence[Config]) -> list[Future]:
        """Start compiling each config (a library call has nothing to compile); futures resolve to BuildResult."""
        def each() -> list[Future]:
            return [_no_build_needed(c) if c.library is not None else
                    self._pool.submit(self.build, expr, c, problem, self.target, self.shared_limit) for c in configs]

        with self._lock:
            try:
                futures = each()
            except BrokenProcessPool:  # died under earlier candidates: their futures say so, these go to a new pool
                self._replace(self._pool)
                futures = each()
            for f in futures:
                self._jobs[f] = (expr, problem, self._pool)
        return futures

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """A new pool for a dead one (once, by whoever notices first); hold the lock."""
        if broken is self._pool:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()

    def result(self, future: Future, config: Config) -> BuildResult:
        """The BuildResult of a future, or a COMPILE_ERROR if the compiler process died on it.

        A compiler that aborts (an LLVM assertion) takes the whole pool down, and with it the
        other candidates in flight: each of those is compiled again alone in a process of its
        own, so that only the candidate that kills the compiler is blamed.
        """
        expr, problem, pool = self._jobs.pop(future)
        try:
            built = future.result()
            self.watch.add("compile", built.compile_s)
            return built
        except BrokenProcessPool:
            with self._lock:
                self._replace(pool)
        alone = self._new_pool(1)
        try:
            return alone.submit(self.build, expr, config, problem, self.target, self.shared_limit).result()
        except BrokenProcessPool as exc:
            return BuildResult(config, Status.COMPILE_ERROR, 0.0, message=f"compiler process died: {exc}")
        finally:
            alone.shutdown(wait=False, cancel_futures=True)

    def close(self, now: bool = False) -> None:
        """Shut the pool down: after the compiles in flight, or (`now`: the run was interrupted) at once."""
        manager = getattr(self._pool, "_executor_manager_thread", None)  # shutdown forgets it
        if now:
            _kill(self._pool)
        self._pool.shutdown(wait=not now, cancel_futures=True)
        if now and manager is not None:
            # let the pool's manager thread finish closing its wake-up pipe now: at interpreter exit
            # Python < 3.12 wakes every pool's manager unlocked, and one still closing its pipe then
            # printed "OSError: Bad file descriptor" after our last line (1 exit in 3)
            manager.join(timeout=5)


def _no_build_needed(config: Config) -> Future:
    """A finished build of a config that needs none."""
    done: Future = Future()
    done.set_result(BuildResult(config, None, 0.0))
    return done


def _kill(pool: ProcessPoolExecutor) -> None:
    """End a pool's processes now (they would otherwise finish their compiles before the parent exits)."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
