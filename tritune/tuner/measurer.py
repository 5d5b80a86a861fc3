"""Measurer: a thread per GPU that measures candidates as their compiles finish (in the order they
were proposed among those built) and stores each at once, so that the GPUs work while the tuning
loop proposes the next round and the compile pool builds it."""
from __future__ import annotations

import queue
import threading
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from tritune.records.database import Database
from tritune.records.result import DeviceKey, MeasureResult
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import BuildResult
from tritune.tuner.worker.local import DeviceLost
from tritune.tuner.worker.protocol import Runner, distinct_gpus


GPU_PHASES = ("check", "timing")  # what a GPU worker spends on a candidate (device-seconds)
_WAKE = ("wake",)  # queued to wake a thread waiting for candidates: look at the pending ones again


class Stopped(Exception):
    """The run ended before this candidate's result could be stored (it was not)."""


class Measurer:
    """Takes (config, build future) pairs; each comes back as a future of its stored MeasureResult.

    One thread per device (each runner of `runner.each`; a runner that measures
    several candidates at once, a cluster's host, gets that many), each with its own database
    connection (SQLite connections belong to one thread), takes the next candidate whose build is
    done and stores its result at once, so a killed run loses only the ones in flight. A device
    whose worker cannot be started again gives its candidate back and its thread ends; the other
    devices measure it. A runner lent to the group mid-run joins. `best_ms` (the best median so far)
    lets the runners stop timing clear losers early; the threads lower it themselves and the loop
    may too (results stored elsewhere). Without `db_path` nothing is stored (a cluster's GPU host:
    the tune-cli process that owns the database stores what it sends back).
    """

    def __init__(self, expr: Any, device: DeviceKey, builder: Any, runner: Runner, db_path: Any,
                 best_ms: float | None = None) -> None:
        self.expr, self.device, self.builder = expr, device, builder
        self.best_ms = best_ms
        self.watch = Stopwatch()  # compile_wait, measure, save: these threads' own phases; GPU_PHASES
        self._db_path = db_path
        self._queue: queue.Queue = queue.Queue()
        self._pending: list = []
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = threading.Event()
        self._live = 0
        self._threads: list[threading.Thread] = []
        self._runners: list[Runner] = []  # every runner measuring here (lost ones too)
        for each in runner.each:
            self.add(each)
        self._group = runner
        runner.listen(self.add)

    def add(self, runner: Runner) -> None:
        """Measure on one more runner too, with as many threads as it measures candidates at once."""
        with self._lock:
            if self._closed or self._stopping.is_set():
                return
            self._runners.append(runner)
            for _ in range(runner.parallel):
                # daemons: a run interrupted mid-measurement must not wait for a GPU to answer
                thread = threading.Thread(target=self._serve, args=(runner,), daemon=True,
                                          name=f"tritune-measurer-{len(self._threads)}")
                self._threads.append(thread)
                self._live += 1
                thread.start()

    @property
    def lanes(self) -> int:
        """Candidates measured at once now (threads of devices not lost; lent runners count)."""
        return max(1, self._live)

    @property
    def gpus(self) -> int:
        """GPUs measuring now (of runners not lost; lent runners count; a cluster host, all of its)."""
        with self._lock:
            return max(1, distinct_gpus(self._runners))

    def submit(self, config: Config, build: Any) -> Future:
        """Queue one candidate; the future resolves to its result once measured and stored."""
        done: Future = Future()
        self._queue.put((config, build, done))
        return done

    def offer_best(self, ms: float) -> None:
        """A new best median from elsewhere (never raises the bar)."""
        self.best_ms = ms if self.best_ms is None else min(self.best_ms, ms)

    def close(self) -> None:
        """Stop after the candidates in flight; nothing measured from now on is stored (the runners
        are about to be stopped, and a result caused by stopping one is not a real one)."""
        self._stopping.set()
        self._group.unlisten(self.add)
        for _ in self._threads:
            self._queue.put(None)
        for thread in list(self._threads):
            thread.join(timeout=0.5)  # idle at the end of a run; mid-measurement on an interruption

    def _serve(self, runner: Any) -> None:
        db = None
        while (item := self._take()) is not None:
            config, build, done = item
            try:
                if self._stopping.is_set():
                    raise Stopped()
                if db is None and self._db_path is not None:
                    db = Database(self._db_path, checked=True)  # the loop's connection has it open
                # a candidate handed back by a lost device comes with its build's result
                build = build if isinstance(build, BuildResult) else self.builder.result(build, config)
                done.set_result(self._one(config, build, db, runner))
            except DeviceLost as lost:
                self._lose((config, build, done), lost)
                break
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it
                done.set_exception(exc)
        with self._lock:
            for _, _, done in self._pending if self._closed else ():
                done.cancel()
        if db is not None:
            db.close()

    def _take(self) -> tuple | None:
        """The next candidate to measure: the first queued whose compile has finished, else the
        first to finish (None once closed)."""
        while True:
            with self._lock:
                while not self._closed and not self._queue.empty():
                    self._accept(self._queue.get_nowait())
                if self._closed:
                    return None
                ready = next((p for p in self._pending if _is_done(p[1])), None)
                if ready is not None:
                    self._pending.remove(ready)
                    return ready
                builds = [p[1] for p in self._pending]
            if builds:
                with self.watch("compile_wait"):  # the GPU waits: nothing queued has compiled yet
                    wait(builds, timeout=0.05, return_when=FIRST_COMPLETED)
            else:
                item = self._queue.get()  # nothing pending: wait for the loop's next candidate
                with self._lock:
                    self._accept(item)

    def _accept(self, item: tuple | None) -> None:
        """Take a queued item into the pending list (hold the lock); None closes."""
        if item is None:
            self._closed = True
        elif item is not _WAKE:
            self._pending.append(item)

    def _lose(self, item: tuple, lost: Exception) -> None:
        """A device is gone: its candidate goes back to the others, or fails if none is left."""
        with self._lock:
            self._live -= 1
            if self._live:
                self._pending.insert(0, item)
                self._queue.put(_WAKE)  # a thread asleep on an empty queue must see it
                return
            orphans = [item, *self._pending]
            self._pending.clear()
        for _, _, done in orphans:
            done.set_exception(lost)

    def _one(self, config: Config, built: BuildResult, db: Database, runner: Any) -> MeasureResult:
        if built.status is not None:
            result = MeasureResult(config, built.status, compile_s=built.compile_s, message=built.message)
        else:
            with self.watch("measure"):
                result = self._measured(runner, config, built.compile_s)
        if self._stopping.is_set():
            raise Stopped()
        if db is not None:
            with self.watch("save"):
                db.save(self.expr.key, self.device, [result])  # at once: a kill loses only the trials in flight
        if result.ok:
            self.offer_best(result.t_median)
        return result


    def _measured(self, runner: Any, config: Config, compile_s: float) -> MeasureResult:
        """`runner.measure`, with the device-seconds it spent checking and timing counted for this
        workload, in total and per device ("check on host:index"): the devices of a host share
        one stopwatch with every workload measured on them at once, so the seconds counted are
        those this thread's call added to it (a cluster's host reports its devices' totals with
        each answer, and the call adds what they grew by: see `RemoteHost.measure`)."""
        before = runner.watch.by_this_thread()
        result = runner.measure(self.expr, config, compile_s, best_ms=self.best_ms)
        for key, total in runner.watch.by_this_thread().items():
            phase, _, device = key.partition(" on ")
            if phase in GPU_PHASES and device and total > before.get(key, 0.0):
                self.watch.add(phase, total - before.get(key, 0.0))
                self.watch.add(key, total - before.get(key, 0.0))
        return result


def _is_done(build: Any) -> bool:
    """Whether a build has finished (stand-in builders hand out results that always have)."""
    return build.done() if isinstance(build, Future) else True
