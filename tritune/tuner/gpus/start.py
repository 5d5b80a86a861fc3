"""This host's GPUs for a run: the options a run is given, `--devices` parsed, the GPU workers (one
per device) and the compile pool started together, and a session that stops them at the end. With
`--cluster`, the GPUs are the cluster's hosts (`gpus.cluster_client`)."""
from __future__ import annotations

import importlib
import os
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

from tritune.kernels.device import driver_facts
from tritune.records.result import Status
from tritune.settings import SETTINGS
from tritune.tuner.builder import Builder
from tritune.tuner.prior import preload
from tritune.tuner.task import device_limits, device_target
from tritune.tuner.timing import Timing
from tritune.tuner.worker.local import LocalRunner, WorkerDied
from tritune.tuner.worker.runners import Runners
from tritune.tuner.worker.protocol import Runner


@dataclass(frozen=True)
class TuneOptions:
    """The knobs of a tuning run, as given on the command line."""

    trials: int = 128
    strategy: str = "sa"
    seed: int = 0
    batch_size: int = 32
    early_stop: int | None = None
    timeout_s: float = 30.0
    workers: int | None = None
    faults: tuple[str, ...] = ()
    prior: str = "all"  # what warm-starts the cost model: "all" (database + shipped), "db", "none"
    verbose: bool = False  # also print where the run's time went
    devices: tuple[int, ...] | str | None = None  # GPUs to measure on: indices, "all", or None (the first)
    cluster: str | None = None  # a Dask scheduler's address: measure on its GPU hosts (`tune-cli gpu-host`)
    cluster_wait_s: float = 30.0  # how long to wait for a first GPU host to join the cluster
    per_gpu: int = 1  # workloads measured at once on each GPU (a worker each, taking turns on the GPU)


def parse_devices(text: str | None) -> tuple[int, ...] | str | None:
    """`--devices`: "0,1" (indices), "all", or None (the first GPU); ValueError names a bad one."""
    if text is None or text.strip() == "all":
        return None if text is None else "all"
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"bad --devices {text!r}: GPU indices such as 0,1, or all") from None
    if not indices or min(indices) < 0 or len(set(indices)) != len(indices):
        raise ValueError(f"bad --devices {text!r}: distinct GPU indices such as 0,1, or all")
    return indices


def start_gpu(timing: Timing = Timing(), timeout_s: float = 30.0, seed: int = 0, workers: int | None = None,
              meanwhile: Callable[[], None] | None = None,
              devices: tuple[int, ...] | str | None = None, per_gpu: int = 1) -> tuple[Runner | Runners, Builder]:
    """Start the GPU workers (`per_gpu` per device of `devices`, see `parse_devices`, each with a
    second one for the head-to-head; the workers of one device take turns at whatever they time
    there, `LocalRunner.gpu_lock`) and the compile pool together; while the first worker comes up
    (seconds of imports and CUDA start), the pool's processes start and import the compiler, and
    this process loads what the run will need and runs `meanwhile` (e.g. capturing a model); then
    the pool gets the device's target. The pool is one per host, shared by every device. Where the
    CUDA driver tells the devices' facts (`_facts_ahead`), the session returns without waiting for
    the workers, which check those facts at their handshakes, before anything is measured."""
    fake = importlib.import_module(SETTINGS.fake_gpu) if SETTINGS.fake_gpu else None
    make = partial(LocalRunner, timing, timeout_s=timeout_s, seed=seed, judge=True,
                   **({"handlers": fake.handlers} if fake else {}))
    locks: dict[int, threading.Lock] = {}  # one per device, shared by every worker measuring there
    head = 0 if devices == "all" else devices[0] if devices else None
    runner = first = make(device=head, gpu_lock=locks.setdefault(head or 0, threading.Lock()))
    started, builder, ahead = [first], None, {}

    def another(i: int) -> LocalRunner:  # a device's runner besides the first, stopped if the start fails
        started.append(make(device=i, watch=first.watch, gpu_lock=locks.setdefault(i, threading.Lock())))
        started[-1].expected = ahead.get(i)
        return started[-1]

    clock, wall = time.perf_counter(), time.time()
    try:
        first.start()
        facts = _facts_ahead(first, fake, devices)
        # the other devices' workers start beside the first wherever their indices are known or
        # can be guessed, so that their CUDA starts overlap; started only once the first had come
        # up, a second device added a whole worker start-up before the loop
        early = {i: another(i) for i in _expected_others(devices)}
        for other in early.values():
            other.start()
        builder = Builder(workers=workers)
        if fake:
            builder.build = fake.build
        else:
            builder.spawn()
        spawned = time.perf_counter() - clock
        preload()
        if meanwhile is not None:
            meanwhile()
        first.session = (wall, {"spawned_s": spawned, "prepared_s": time.perf_counter() - clock})
        ahead = facts.result()
        for i, r in [(first.device or 0, first), *early.items()]:
            r.expected = ahead.get(i)
        info = first.device_info()  # the driver's facts where it gave them, else the worker's answer
        builder.start(device_target(info), device_limits(info).shared_bytes)
        indices = range(info.get("device_count", 1)) if devices == "all" else devices or ()
        others = [early.pop(i) if i in early else another(i) for i in indices[1:]]
        for unused in early.values():  # "all" guessed more GPUs than the first worker sees
            unused.close(now=True)
        # a device's further workers after one of each device's: the first workloads spread over GPUs
        each_device = [first, *others]
        others += [another(r.device or 0) for _ in range(per_gpu - 1) for r in each_device]
        if others:
            runner = Runners([first] + others)
            _same_gpus(runner)
    except BaseException:
        if builder is not None:
            builder.close(now=True)
        for r in started:
            r.close(now=True)
        raise
    return runner, builder


def _facts_ahead(first: LocalRunner, fake: Any, devices: tuple[int, ...] | str | None) -> Future:
    """The facts of every device of the run as the driver gives them (`driver_facts`, or a stand-in
    GPU's `early_info`), by index, read in a thread while the session starts; a future of {} where
    the run must wait for its workers' answers instead (TRITUNE_EARLY_START=0, no driver, a device
    it does not tell, workers whose handlers are not the GPU's)."""
    read = getattr(fake, "early_info", None) if fake else driver_facts if first.on_gpu else None
    if not SETTINGS.early_start or read is None:
        read = lambda index: None  # noqa: E731 - no facts ahead: the workers' answers decide
    done: Future = Future()
    head = first.device or 0

    def each() -> dict:
        facts = {head: read(head)}
        if facts[head] is None:
            return {}
        indices = range(facts[head]["device_count"]) if devices == "all" else devices or ()
        facts.update({i: read(i) for i in indices if i != head})
        return facts if all(f is not None for f in facts.values()) else {}

    def reading() -> None:
        try:
            done.set_result(each())
        except Exception:  # noqa: BLE001 - a stand-in that fails: the workers will tell
            done.set_result({})
    threading.Thread(target=reading, name="tritune-facts", daemon=True).start()
    return done


def timeline(startup: dict, wall: float, **moments: float) -> dict:
    """Put the session's start-up moments (seconds since its beginning, at `wall` on the clock) in a
    worker's `startup`, with the worker's own wall-clock moments turned into the same seconds; that
    `startup`."""
    for key in ("imported_at", "up_at", "answered_at"):
        if key in startup:
            startup[key.replace("_at", "_s")] = startup.pop(key) - wall
    startup.update(moments)
    return startup


def visible_gpus() -> int:
    """How many GPUs this host's workers will see, counted without CUDA (the parent never starts
    it): the entries of CUDA_VISIBLE_DEVICES where it is set, else of the container's
    NVIDIA_VISIBLE_DEVICES where it lists GPUs (the driver's list below may show the whole host's),
    else the NVIDIA driver's GPUs (/proc/driver/nvidia/gpus); 1 where none tells. A guess: the first
    worker's count decides."""
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        listed = os.environ.get(name)
        entries = [entry.strip().lower() for entry in (listed or "").split(",") if entry.strip()]
        if listed is not None and entries != ["all"]:
            return 0 if entries in (["void"], ["none"]) else len(entries)
    try:
        return max(1, len(os.listdir("/proc/driver/nvidia/gpus")))
    except OSError:
        return 1


def _expected_others(devices: tuple[int, ...] | str | None) -> tuple[int, ...]:
    """The devices besides the first that a run will measure on, as far as is known before any
    worker is up: the listed ones, or for "all" those `visible_gpus` counts."""
    if devices == "all":
        return tuple(range(1, visible_gpus()))
    return tuple(devices[1:]) if devices else ()


def _same_gpus(runners: Runners) -> None:
    """Start every device's worker; timings are compared across devices, so they must be one GPU model."""
    for r in runners.each:
        r.start()
    infos = [r.device_info() for r in runners.each]
    keys = {(i["gpu"], i["capability"]) for i in infos}
    if len(keys) > 1:
        listed = ", ".join(f"{i.get('device')}: {i['gpu']}" for i in infos)
        raise WorkerDied(Status.CRASH, f"the devices are different GPUs ({listed}); tune each kind in a run of its own")


@contextmanager
def gpu_session(options: TuneOptions, meanwhile: Callable[[], None] | None = None) -> Iterator[tuple[Runner, Builder]]:
    """One GPU worker and compile pool, for tuning one workload or several in turn (`meanwhile`
    runs while they start); both are stopped at the end, at once if the run was interrupted or failed.
    With `options.cluster`, the GPUs are the cluster's hosts (`gpus.cluster_client`)."""
    if options.cluster:
        from tritune.tuner.gpus.cluster_client import connect

        runner, builder = connect(options.cluster, options.cluster_wait_s, meanwhile)
    else:
        runner, builder = start_gpu(timeout_s=options.timeout_s, seed=options.seed, workers=options.workers,
                                    meanwhile=meanwhile, devices=options.devices, per_gpu=options.per_gpu)
    interrupted = True
    try:
        yield runner, builder
        interrupted = False
    finally:
        builder.close(now=interrupted)
        runner.close(now=interrupted)
