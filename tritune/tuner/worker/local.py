"""The local runner: one GPU worker process that checks and times candidates, isolated from the tuner.

A candidate that corrupts the CUDA context or hangs takes only the worker down: the parent sees
the crash (or its own timeout), records CRASH/TIMEOUT, and starts a fresh worker for the next one.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Callable

from tritune.kernels.device import FACT_KEYS
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch, process_age_s
from tritune.tuner.worker.failures import classify
from tritune.tuner.worker.lifeline import bind_to_parent, leave, start_lasting
from tritune.tuner.timing import Timing
from tritune.tuner.worker.protocol import OneRunner, settled

STARTUP_TIMEOUT_S = 120.0
# requests that run timed work on the GPU: one at a time per device, whichever worker asks (a
# candidate's check runs kernels too, and would stretch another's timing); compiling the
# alternatives ahead ("prepare") is CPU work with a few runs, left free as before
ON_GPU = ("measure", "torch", "head_to_head")


def gpu_handlers(timing: Timing) -> dict[str, Callable[[dict], Any]]:
    """The worker's request handlers on a real GPU."""
    import torch

    from tritune.tuner.worker import candidate

    # the float64 reference must not silently drop to tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    return {
        "info": lambda p: _device(p.get("device")),
        "measure": lambda p: candidate.measure_candidate(p["expr"], p["config"], p["seed"], timing, p.get("best_ms")),
        "torch": lambda p: candidate.measure_torch(p["expr"], p["seed"], timing),
        "head_to_head": lambda p: candidate.head_to_head(p["expr"], p["config"], p["seed"]),
        "prepare": lambda p: candidate.prepare_alternatives(p["expr"], p["seed"]),
        "warm": lambda p: candidate.warm_compiler(),
    }


NO_GPU = ("no CUDA GPU found (torch.cuda.is_available() is False); tuning measures on a GPU. Without one, "
          "`tune-cli best`, `export` and `import` work, and the tests run kernels under TRITON_INTERPRET=1.")


def _device(index: int | None) -> dict:
    """The worker's device facts, after making `index` its device (the worker's start is where a
    missing GPU, or a device that is not there, is found)."""
    import torch
    import triton  # noqa: F401 - device_info reports its version: imported before "imports" is read

    from tritune.kernels.device import device_info

    imported = time.time()  # the worker's interpreter and imports are done; CUDA starts below
    if not torch.cuda.is_available():
        raise RuntimeError(NO_GPU)
    count = torch.cuda.device_count()
    index = index or 0
    if index >= count:
        raise RuntimeError(f"there is no CUDA device {index}: this host has {count} (0 to {count - 1})")
    torch.cuda.set_device(index)  # every tensor, stream and kernel of this worker lives there
    info = device_info(index)
    # wall clocks (the parent's session reads them on its own clock) and this process's age
    started = {"imported_at": imported, "up_at": time.time(), "age_s": process_age_s()}
    return {**info, "device": index, "device_count": count, "startup": started}


def _serve(conn: Any, make_handlers: Callable[[Timing], dict], timing: Timing, parent: int) -> None:
    """Worker loop: answer requests until told to stop, until a fatal CUDA error, or until the parent dies."""
    bind_to_parent(parent)
    handlers = make_handlers(timing)
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            leave()
        try:
            conn.send(("ok", handlers[kind](payload)))
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, never raised here
            status, fatal = classify(exc)
            conn.send(("error", {"status": status, "message": f"{type(exc).__name__}: {exc}"[:2000]}))
            if fatal:
                return


class WorkerDied(RuntimeError):
    """The worker crashed or timed out while serving a request."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


class DeviceLost(WorkerDied):
    """A worker could not be (re)started: its device is gone, not just one candidate's run."""


class LocalRunner(OneRunner):
    """Measures candidates on one GPU of this host through a restartable worker process.

    With `judge`, a second worker on the same GPU runs the end-of-run head-to-head, and compiles
    its alternatives (`torch.compile` from cold: seconds of CPU) while the search measures in the
    first (`prepare_head_to_head`), so that the end of a run does not wait for Inductor. It
    holds a second CUDA context, and its compile runs the alternative on the GPU once (Inductor's
    autotuned reduction kernels: each of their configs once), milliseconds that a candidate timed
    meanwhile shares."""

    def __init__(self, timing: Timing = Timing(), timeout_s: float = 30.0, seed: int = 0,
                 handlers: Callable[[Timing], dict] = gpu_handlers, device: int | None = None,
                 watch: Stopwatch | None = None, host: str | None = None, judge: bool = False,
                 gpu_lock: Any = None) -> None:
        self.timing, self.timeout_s, self.seed, self.device = timing, timeout_s, seed, device
        # held while its worker runs anything on the GPU that is timed or may disturb a timing;
        # shared by every worker on one device (several workloads' workers, the head-to-head's)
        self.gpu_lock = gpu_lock if gpu_lock is not None else threading.Lock()
        self.host = host or socket.gethostname()  # who measured, in the records: "host:device"
        self.lost = False  # its worker could not be started: the device is gone for this run
        self._why = ""  # why it is lost
        self._lock = threading.RLock()  # one request at a time (measuring threads may share a device)
        self._handlers = handlers  # replaceable so isolation is testable without a GPU
        self._ctx = mp.get_context("spawn")  # never fork a process that may hold a CUDA context
        self._proc: Any = None
        self._conn: Any = None
        self._info: dict = {}
        # device facts read without the worker (`device.driver_facts`), answered before it is up
        # and checked against its own at its handshake
        self.expected: dict | None = None
        # when the worker had imported, started CUDA and answered (wall clock), its age then
        self.startup: dict = {}
        self.session: tuple[float, dict] | None = None  # its session's start (wall clock) and moments
        self._starts = 0
        self._awaiting = False  # the handshake was sent and not yet answered
        self._closed = False  # stopped for good: a measurement cut short by that starts no new worker
        # the worker's check and timing seconds, and worker starts (shared by a group's runners)
        self.watch = watch or Stopwatch()
        self._judge = LocalRunner(timing, timeout_s, seed, handlers, device, Stopwatch(), self.host,
                                  gpu_lock=self.gpu_lock) if judge else None
        # the one thread that asks the second worker, in order: a head-to-head after the compiles
        # asked for before it, and no caller waits for a compile it did not ask the result of
        self._judge_queue = ThreadPoolExecutor(1, thread_name_prefix="tritune-head-to-head") if judge else None
        self._judge_warmed = False  # asked to pay torch.compile's one-time costs (once, as it starts)

    @property
    def on_gpu(self) -> bool:
        """Whether its worker runs the GPU's handlers (not a stand-in's)."""
        return self._handlers is gpu_handlers

    @property
    def busy(self) -> bool:
        """Whether another thread is waiting for this worker's answer now."""
        if not self._lock.acquire(blocking=False):
            return True
        self._lock.release()
        return False

    @property
    def restarts(self) -> int:
        """How many times a worker was replaced after a crash or timeout."""
        return max(0, self._starts - 1)

    @property
    def name(self) -> str:
        """Which GPU this is, as trials record it: "host:index"."""
        index = self.device if self.device is not None else self._info.get("device", 0)
        return f"{self.host}:{index}"

    def start(self) -> None:
        """Start the worker (and the head-to-head's) without waiting for it to come up (the first
        request waits), so that its CUDA start overlaps the parent's own preparations; the
        head-to-head's then pays torch.compile's one-time costs (`candidate.warm_compiler`) while
        the session starts, before the first workload's alternatives are asked of it."""
        # a worker already spawned is not waited on: its lock is held for a whole request (seconds
        # of a head-to-head's compiles, or of the second worker's warm-up as it starts), and a
        # workload that starts meanwhile only wants it coming up
        if self._proc is None:
            with self._lock:
                if self._proc is None:
                    self._spawn()
        if self._judge is not None:
            self._judge.start()
            if not self._judge_warmed:
                self._judge_warmed = True
                self._judge_queue.submit(self._judge._warm)

    def _spawn(self) -> None:
        self._starts += 1
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self._handlers, self.timing, os.getpid()), daemon=True)
        # started from the process's lasting thread: the kernel kills a child when the *thread* that
        # started it ends (PR_SET_PDEATHSIG), and a worker started again by a measuring thread (ended
        # with its workload), or a head-to-head worker started by a background request, died with
        # that thread. Only a started process is kept (closing one that never started failed).
        start_lasting(proc.start)
        self._proc = proc
        child.close()
        self._conn = parent
        # handshake, so that start-up (torch import, CUDA init) never counts against a candidate
        parent.send(("info", {"device": self.device}))
        self._awaiting = True

    def _handshake(self) -> None:
        self._awaiting = False
        try:
            status, self._info = self._answer(STARTUP_TIMEOUT_S, f"did not start within {STARTUP_TIMEOUT_S:.0f} s")
        except WorkerDied as died:
            raise self._lose(died.status, f"GPU worker failed to start: {died}") from None
        if status != "ok":
            self._kill()
            raise self._lose(Status.CRASH, f"GPU worker failed to start: {self._info['message']}")
        self.startup = {**self._info.pop("startup", {}), "answered_at": time.time()}  # not device facts
        differ = [k for k in FACT_KEYS if self.expected is not None and self._info.get(k) != self.expected.get(k)]
        if differ:
            self._kill()
            said = ", ".join(f"{k} {self._info.get(k)!r} (the driver said {self.expected.get(k)!r})" for k in differ)
            raise self._lose(Status.CRASH, f"the GPU worker reports {said}; the run started on the driver's "
                                           "facts and stops: run again with TRITUNE_EARLY_START=0")

    def _lose(self, status: Status, why: str) -> DeviceLost:
        """Mark the device lost for this run, for `why`; the error to raise."""
        self.lost, self._why = True, why
        return DeviceLost(status, why)

    def _ensure(self) -> None:
        """A live worker that has answered its handshake, started (again) if there is none."""
        if self.lost:
            raise DeviceLost(Status.CRASH, f"GPU {self.name} is lost for this run ({self._why})")
        with self.watch("worker_start"):
            if self._proc is not None and self._awaiting:
                self._handshake()
            if self._proc is None or not self._proc.is_alive():
                self._kill()
                self._spawn()
                self._handshake()

    def _answer(self, limit: float, hung: str, hung_status: Status = Status.CRASH) -> Any:
        """The worker's next reply; on a timeout or a dead pipe, drop the worker and raise WorkerDied."""
        if not self._conn.poll(limit):
            self._kill()
            raise WorkerDied(hung_status, hung)
        try:
            return self._conn.recv()
        except (EOFError, ConnectionError):
            code = self._proc.exitcode if self._proc is not None else None
            self._kill()
            raise WorkerDied(Status.CRASH, f"worker died (exit code {code}); restarted") from None

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = self._conn = None

    def request(self, kind: str, payload: dict, timeout_s: float | None = None) -> tuple[str, Any]:
        """Send one request; raises WorkerDied (and drops the worker) on crash or timeout."""
        with self._lock:
            self._ensure()
            with self.gpu_lock if kind in ON_GPU else nullcontext():
                self._conn.send((kind, payload))
                limit = timeout_s or self.timeout_s
                answer = self._answer(limit, f"no answer within {limit:.0f} s (hang?); worker restarted", Status.TIMEOUT)
            if answer[0] == "error" and answer[1]["status"] is Status.CRASH:
                self._kill()
            return answer

    def device_info(self) -> dict:
        """GPU facts of the current worker, from its start-up handshake (the parent never starts
        CUDA), or before that the facts it is `expected` to report, without waiting for it."""
        if self.expected is not None and not self._info and not self.lost:
            return self.expected
        with self._lock:
            self._ensure()
        return self._info

    def measure(self, expr: Any, config: Config, compile_s: float = 0.0, best_ms: float | None = None) -> MeasureResult:
        """Check and time one built candidate (not timed in full once clearly slower than `best_ms`);
        failures come back as results, never raised; each says which GPU measured it."""
        return replace(self._measure(expr, config, compile_s, best_ms), measured_on=self.name)

    def _measure(self, expr: Any, config: Config, compile_s: float, best_ms: float | None) -> MeasureResult:
        try:
            status, data = self.request("measure", {"expr": expr, "config": config, "seed": self.seed,
                                                    "best_ms": best_ms})
        except WorkerDied as died:
            # a worker that cannot come back means the device is gone, not that the candidate broke
            # it: DeviceLost, and the candidate goes back to the queue (another device measures it)
            if not self._closed:
                with self._lock:
                    self._ensure()
            return MeasureResult(config, died.status, compile_s=compile_s, message=str(died))
        for phase, seconds in (data.get("spent") or {}).items():
            self.watch.add(phase, seconds)
            self.watch.add(f"{phase} on {self.name}", seconds)  # a group's devices share the stopwatch
        if status == "error" or data["status"] is not Status.OK:
            return MeasureResult(config, data["status"], compile_s=compile_s, message=data["message"])
        t_min, t_p20, t_median, t_p80 = data["times"]
        return MeasureResult(config, Status.OK, t_min, t_p20, t_median, t_p80, compile_s,
                             time.time(), data["message"])

    def torch_time(self, expr: Any) -> tuple[float, ...]:
        """(min, p20, median, p80) ms of the eager PyTorch version."""
        return self._checked("torch", {"expr": expr, "seed": self.seed})

    def head_to_head(self, expr: Any, config: Config) -> dict:
        """Median ms of the tuned kernel and of every alternative, alternated in one process
        (`timing.COMPARE` budgets): in the second worker where there is one, after the compiles
        asked of it ahead (`prepare_head_to_head`), else, or once it is gone, in this one."""
        return self.queue_head_to_head(expr, config).result()

    def queue_head_to_head(self, expr: Any, config: Config) -> Future:
        """`head_to_head`, queued in the second worker behind the compiles asked of it before, and
        ahead of any asked after (the next workload's, which would drop this one's); its future.
        Without a second worker, run now in this one."""
        if self._judge is not None and not self._judge.lost:
            return self._judge_queue.submit(self._compare, expr, config)
        return settled(self._compare_here, expr, config)

    def _compare(self, expr: Any, config: Config) -> dict:
        try:
            return self._judge.head_to_head(expr, config)
        except WorkerDied:  # the second worker crashed or could not start: the measuring one compares
            return self._compare_here(expr, config)

    def _compare_here(self, expr: Any, config: Config) -> dict:
        return self._checked("head_to_head", {"expr": expr, "config": config, "seed": self.seed})

    def prepare_head_to_head(self, expr: Any) -> None:
        """Have the second worker compile the alternatives of `expr`'s head-to-head, in the
        background (nothing without one); its seconds are counted as "alternatives"."""
        if self._judge is not None:
            self._judge.start()  # coming up while the search starts, if not up yet
            self._judge_queue.submit(self._judge._prepare, expr, self.watch)

    def _warm(self) -> None:
        """Ask this worker to warm torch.compile up (a failure leaves that to the first compile)."""
        try:
            self._checked("warm", {})
        except (WorkerDied, RuntimeError):
            pass

    def _prepare(self, expr: Any, watch: Stopwatch) -> None:
        """Ask this worker to compile `expr`'s alternatives (a failure leaves them to the head-to-head)."""
        try:
            data = self._checked("prepare", {"expr": expr, "seed": self.seed})
        except (WorkerDied, RuntimeError):
            return  # the head-to-head compiles them itself, and says why where it cannot
        watch.add("alternatives", data["compile_s"])

    def _checked(self, kind: str, payload: dict) -> Any:
        status, data = self.request(kind, payload, STARTUP_TIMEOUT_S)
        if status != "ok":
            raise RuntimeError(data["message"])
        return data

    def close(self, now: bool = False) -> None:
        """Stop the worker: let it finish its request, or (`now`: the run was interrupted) kill it."""
        self._closed = True
        if self._judge_queue is not None:
            self._judge_queue.shutdown(wait=False, cancel_futures=True)
        if self._judge is not None:
            # stopped when idle: a killed worker leaves what it made to the resource tracker, which
            # warns of it (tqdm's lock, made when the head-to-head's torch.compile runs a graph);
            # killed while still compiling ahead for a head-to-head that will not come
            self._judge.close(now=now or self._judge.busy)
        if not now and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(("stop", {}))
                self._proc.join(10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.close(now=kind is not None)
