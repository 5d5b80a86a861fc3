"""Child processes that end with their parent, however it ends (SIGKILL, an OOM kill, a closed
terminal), and leave signals to it: a compile-pool worker or GPU worker left behind would hold
cores, GPU memory and the multiprocessing resource tracker long after its run is gone."""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

T = TypeVar("T")


def leave() -> None:
    """End this child now, its output flushed, when its work is done: it holds nothing that needs
    tearing down, and a normal exit finalises torch, Triton and a CUDA context, seconds that its
    parent would wait for. Multiprocessing's own clean-up runs first, as at a normal exit: a
    semaphore made here and kept (tqdm keeps a lock it makes when torch.fx runs a graph) would
    otherwise be left to the resource tracker, which warns of it after the parent's last line."""
    from multiprocessing import util

    util._run_finalizers(0)  # noqa: SLF001 - the finalisers a normal exit runs, torch's excepted
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def bind_to_parent(parent_pid: int) -> None:
    """Run first in every child: the kernel SIGKILLs it when its parent dies (Linux), it exits now if
    the parent is already gone, and Ctrl-C in a terminal (SIGINT to the whole process group) is the
    parent's to handle, not the child's. Start the child with `start_lasting`: the kernel's
    "parent" is the thread that started it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


class _Lasting:
    """One daemon thread per process that runs what it is handed and never ends before the process."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # first use, or a forked child
                self._thread = threading.Thread(target=self._serve, daemon=True, name="tritune-child-starter")
                self._thread.start()
            if threading.current_thread() is self._thread:
                return fn()
        done: Future = Future()
        self._jobs.put((fn, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                done.set_exception(exc)


_LASTING = _Lasting()


def start_lasting(start: Callable[[], T]) -> T:
    """Run `start` (a child process's start) in the one thread of this process that lasts as long as
    the process: the kernel kills a child bound by PR_SET_PDEATHSIG when the *thread* that started
    it ends, so a child started by a thread that ends first (a workload's loop, a measuring thread)
    died with that thread; started there, it lives as long as this process, and no longer."""
    return _LASTING.run(start)
