"""Several workloads over several runners (the GPUs of a host, or the hosts of a cluster): each
runner tunes one workload at a time, the largest first; once no workload is waiting, a runner that
comes free joins a running one, so the last workloads' rounds are split across runners.

Why a workload keeps its runners rather than every runner taking any workload's next candidate:
a GPU worker keeps one workload's inputs and float64 reference (`worker.candidate`); candidates of
several workloads interleaved on one GPU would rebuild them at every switch, and the search of one
workload learns best from timings of the same GPU. Timings are compared within one device key only:
the runners of a group are one GPU model (`gpus.start` checks it).
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any, Callable, Sequence

from tritune.records.result import Status
from tritune.tuner.worker.local import DeviceLost
from tritune.tuner.worker.runners import Runners


def spread(run: Callable[[int, Runners], Any], sizes: Sequence[float], runners: Sequence[Any]) -> list[Any]:
    """Run workloads 0..len(sizes)-1 (callers order them largest first; `sizes` weigh who gets a runner
    that comes free) over `runners`, each as `run(i, group)` in a thread of its own with a group of
    runners of its own; their results in order. A workload whose runners were all lost goes back to
    the front of the queue (it resumes from what it stored); DeviceLost once no runner is left."""
    pending, running, free = deque(range(len(sizes))), {}, list(runners)
    results: list[Any] = [None] * len(sizes)
    finished: queue.Queue = queue.Queue()
    lost: DeviceLost | None = None
    while pending or running:
        _place(pending, running, free, sizes, run, finished)
        if not running:
            raise lost or DeviceLost(Status.CRASH, "every GPU was lost")
        i, outcome = _next(finished)
        group = running.pop(i)
        free.extend(r for r in group.each if not r.lost)
        if isinstance(outcome, DeviceLost):
            pending.appendleft(i)
            lost = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            results[i] = outcome
    return results


def _place(pending: deque, running: dict[int, Runners], free: list, sizes: Sequence[float],
           run: Callable[[int, Runners], Any], finished: queue.Queue) -> None:
    """Give each free runner the next waiting workload; with none waiting, lend it to the running
    workload with the fewest live runners (the largest of those)."""
    while pending and free:
        i = pending.popleft()
        running[i] = group = Runners([free.pop(0)])
        threading.Thread(target=_run_one, args=(run, i, group, finished), daemon=True,
                         name=f"tritune-workload-{i}").start()
    while free and running and not pending:
        i = min(running, key=lambda j: (sum(not r.lost for r in running[j].each), -sizes[j], j))
        running[i].lend(free.pop(0))


def _run_one(run: Callable[[int, Runners], Any], i: int, group: Runners, finished: queue.Queue) -> None:
    try:
        outcome = run(i, group)
    except BaseException as exc:  # noqa: BLE001 - handed to the scheduling thread, which raises it
        outcome = exc
    finished.put((i, outcome))


def _next(finished: queue.Queue) -> tuple[int, Any]:
    """The next workload to finish (waiting in short steps: Ctrl-C and SIGTERM reach this thread)."""
    while True:
        try:
            return finished.get(timeout=0.5)
        except queue.Empty:
            continue
