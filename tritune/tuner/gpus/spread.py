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


# what a workload's thread puts in the queue when it gives its runners back before it ends
_RELEASED = object()


def spread(run: Callable[[int, Runners, Callable[[], None]], Any], sizes: Sequence[float],
           runners: Sequence[Any]) -> list[Any]:
    """Run workloads 0..len(sizes)-1 (callers order them largest first; `sizes` weigh who gets a runner
    that comes free) over `runners`, each as `run(i, group, release)` in a thread of its own with a
    group of runners of its own; their results in order. A workload may `release()` its runners
    before it ends (its search is over and what is left of it needs none of theirs): the next
    workload starts on them meanwhile. A workload whose runners were all lost goes back to the
    front of the queue (it resumes from what it stored); DeviceLost once no runner is left."""
    pending, running, free = deque(range(len(sizes))), {}, list(runners)
    released: set[int] = set()  # running workloads that gave their runners back
    results: list[Any] = [None] * len(sizes)
    finished: queue.Queue = queue.Queue()
    lost: DeviceLost | None = None
    while pending or running:
        _place(pending, running, free, sizes, run, finished, released)
        if not running:
            raise lost or DeviceLost(Status.CRASH, "every GPU was lost")
        i, outcome = _next(finished)
        if outcome is _RELEASED:
            released.add(i)
            free.extend(r for r in running[i].each if not r.lost)
            continue
        group = running.pop(i)
        if i not in released:
            free.extend(r for r in group.each if not r.lost)
        released.discard(i)
        if isinstance(outcome, DeviceLost):
            pending.appendleft(i)
            lost = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            results[i] = outcome
    return results


def _place(pending: deque, running: dict[int, Runners], free: list, sizes: Sequence[float],
           run: Callable[[int, Runners, Callable[[], None]], Any], finished: queue.Queue, released: set[int]) -> None:
    """Give each free runner the next waiting workload; with none waiting, lend it to the running
    workload still searching with the fewest live runners (the largest of those)."""
    while pending and free:
        i = pending.popleft()
        running[i] = group = Runners([free.pop(0)])
        threading.Thread(target=_run_one, args=(run, i, group, finished), daemon=True,
                         name=f"tritune-workload-{i}").start()
    searching = [j for j in running if j not in released]
    while free and searching and not pending:
        i = min(searching, key=lambda j: (sum(not r.lost for r in running[j].each), -sizes[j], j))
        running[i].lend(free.pop(0))


def _run_one(run: Callable[[int, Runners, Callable[[], None]], Any], i: int, group: Runners,
             finished: queue.Queue) -> None:
    given_back = threading.Event()

    def release() -> None:
        if not given_back.is_set():
            given_back.set()
            finished.put((i, _RELEASED))
    try:
        outcome = run(i, group, release)
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
