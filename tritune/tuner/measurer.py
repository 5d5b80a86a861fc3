"""Measurer: a thread that measures candidates as their compiles finish (in the order they were
proposed among those built) and stores each at once, so that the GPU works while the tuning loop proposes the next round and the compile
pool builds it."""
from __future__ import annotations

import queue
import threading
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from tritune.records.database import Database
from tritune.records.result import DeviceKey, MeasureResult
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch


class Stopped(Exception):
    """The run ended before this candidate's result could be stored (it was not)."""


class Measurer:
    """Takes (config, build future) pairs; each comes back as a future of its stored MeasureResult.

    The thread owns its own database connection (SQLite connections belong to one thread) and
    stores every result as soon as it is measured, so a killed run loses only the one in flight.
    `best_ms` (the best median so far) lets the runner stop timing clear losers early; the
    thread lowers it itself and the loop may too (results stored by other tuners).
    """

    def __init__(self, expr: Any, device: DeviceKey, builder: Any, runner: Any, db_path: Any,
                 best_ms: float | None = None) -> None:
        self.expr, self.device, self.builder, self.runner = expr, device, builder, runner
        self.best_ms = best_ms
        self.watch = Stopwatch()  # compile_wait, measure, save: this thread's own phases
        self._db_path = db_path
        self._queue: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        # a daemon: a run interrupted mid-measurement must not wait for the GPU to answer
        self._thread = threading.Thread(target=self._serve, name="tritune-measurer", daemon=True)
        self._thread.start()

    def submit(self, config: Config, build: Any) -> Future:
        """Queue one candidate; the future resolves to its result once measured and stored."""
        done: Future = Future()
        self._queue.put((config, build, done))
        return done

    def offer_best(self, ms: float) -> None:
        """A new best median from elsewhere (never raises the bar)."""
        self.best_ms = ms if self.best_ms is None else min(self.best_ms, ms)

    def close(self) -> None:
        """Stop after the candidate in flight; nothing measured from now on is stored (the runner
        is about to be stopped, and a result caused by stopping it is not a real one)."""
        self._stopping.set()
        self._queue.put(None)
        self._thread.join(timeout=0.5)  # idle at the end of a run; mid-measurement on an interruption

    def _serve(self) -> None:
        db = None
        pending: list = []
        while (item := self._take(pending)) is not None:
            config, build, done = item
            try:
                if self._stopping.is_set():
                    raise Stopped()
                db = db or Database(self._db_path, checked=True)  # the loop's connection has it open
                done.set_result(self._one(config, build, db))
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, which raises it
                done.set_exception(exc)
        for _, _, done in pending:
            done.cancel()
        if db is not None:
            db.close()

    def _take(self, pending: list) -> tuple | None:
        """The next candidate to measure: the first queued whose compile has finished, else the
        first to finish (None once closed)."""
        while self._drain(pending):
            ready = next((p for p in pending if _built(p[1])), None)
            if ready is not None:
                pending.remove(ready)
                return ready
            with self.watch("compile_wait"):  # the GPU waits: nothing queued has compiled yet
                wait([p[1] for p in pending], timeout=0.05, return_when=FIRST_COMPLETED)
        return None

    def _drain(self, pending: list) -> bool:
        """Move everything queued into `pending` (waiting for something when nothing is pending);
        False once the measurer is closed."""
        while True:
            try:
                item = self._queue.get_nowait() if pending else self._queue.get()
            except queue.Empty:
                return True
            if item is None:
                return False
            pending.append(item)

    def _one(self, config: Config, build: Any, db: Database) -> MeasureResult:
        built = self.builder.result(build, config)
        if built.status is not None:
            result = MeasureResult(config, built.status, compile_s=built.compile_s, message=built.message)
        else:
            with self.watch("measure"):
                result = self.runner.measure(self.expr, config, built.compile_s, best_ms=self.best_ms)
        if self._stopping.is_set():
            raise Stopped()
        with self.watch("save"):
            db.save(self.expr.key, self.device, [result])  # at once: a kill loses only the trial in flight
        if result.ok:
            self.offer_best(result.t_median)
        return result


def _built(build: Any) -> bool:
    """Whether a build has finished (stand-in builders hand out results that always have)."""
    return build.done() if isinstance(build, Future) else True
