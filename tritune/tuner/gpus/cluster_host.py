"""The GPU host's side of a cluster (`tune-cli gpu-host`): this host's GPU workers and compile pool
serve the candidates that tune-cli processes send through the Dask scheduler; nothing is stored
here (see `tritune.tuner.gpus.cluster`)."""
from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from typing import Any, Callable

from tritune.errors import first_line
from tritune.kernels.family import device_key, family, ops
from tritune.records.result import MeasureResult
from tritune.schedules.config import Config
from tritune.tuner.builder import Builder
from tritune.tuner.gpus.cluster import CONNECT_TIMEOUT_S, ClusterError, reachable
from tritune.tuner.measurer import GPU_PHASES, Measurer
from tritune.tuner.worker.local import DeviceLost
from tritune.tuner.worker.protocol import Runner

LANES = 8  # measurers a host keeps for the workloads it was sent last (idle ones beyond are closed)


class HostAgent:
    """A GPU host's side: its GPU workers and compile pool measure what tune-cli processes send;
    nothing is stored here. Candidates of one workload share a measurer (its inputs and reference
    stay on the GPU), one per workload sent lately."""

    def __init__(self, runner: Runner, builder: Builder, name: str) -> None:
        self.runner, self.builder, self.name = runner, builder, name
        devices = runner.each
        for each in devices:
            each.host = name  # trials name the host as the cluster knows it
        info = runner.device_info()  # asked once: a request waits for the GPU's measurement in flight
        self._info = {**info, "name": name, "devices": [r.name for r in devices],
                      "parallel": len(devices) + builder.workers, "keys": {op: device_key(info, op).key for op in ops()}}
        self._lanes: dict[str, Measurer] = {}  # by workload, the latest last
        self._busy: Counter[str] = Counter()  # candidates of each workload in flight
        self._lock = threading.Lock()

    def info(self) -> dict:
        """What a tune-cli process needs to know of this host: its GPU (as the first device reports
        it), its devices, how many candidates it takes at once, and its device key of every op."""
        return self._info

    def measure(self, expr: Any, config: Config, best_ms: float | None) -> tuple[MeasureResult, dict[str, float]]:
        """Compile one candidate in the host's pool, then check and time it on the next free GPU;
        with the result, the seconds each of the host's GPUs has spent checking and timing so far
        ("check on host:index": the tune-cli process counts them, as it does its own GPUs')."""
        build = self.builder.submit(expr, family(expr.op).canonical_problem(expr), [config])[0]
        with self._lock:
            lane = self._lanes.pop(expr.key, None) or Measurer(expr, None, self.builder, self.runner, None)
            self._lanes[expr.key] = lane
            self._busy[expr.key] += 1
            self._retire()
            if best_ms is not None:
                lane.offer_best(best_ms)
            done = lane.submit(config, build)
        try:
            result = done.result()
        finally:
            with self._lock:
                self._busy[expr.key] -= 1
        spent = dict(self.runner.watch.spent)
        return result, {k: v for k, v in spent.items() if k.partition(" on ")[0] in GPU_PHASES and " on " in k}

    def _retire(self) -> None:
        """Close the oldest idle measurers beyond LANES (hold the lock): a worker serves for days."""
        for key in [k for k in self._lanes if not self._busy[k]][:max(0, len(self._lanes) - LANES)]:
            self._lanes.pop(key).close()
            del self._busy[key]

    def head_to_head(self, expr: Any, config: Config) -> dict:
        """The end-of-run comparison, on the host's first GPU."""
        return self.runner.head_to_head(expr, config)

    def close(self) -> None:
        """Stop the measurers, the GPU workers and the compile pool."""
        for lane in self._lanes.values():
            lane.close()
        self.builder.close(now=True)
        self.runner.close(now=True)


_AGENT: list[HostAgent] = []  # the agent of this process, while `serve` runs


def on_host(method: str, *args: Any) -> tuple[str, Any]:
    """Run on a Dask worker: ("ok", what the host's agent answers), or ("lost", why) where the host
    has no GPU left or is no tritune worker (exceptions of ours do not cross the wire whole)."""
    if not _AGENT:
        return "lost", "a Dask worker that is no tritune worker (start them with `tune-cli gpu-host`)"
    try:
        return "ok", getattr(_AGENT[0], method)(*args)
    except DeviceLost as exc:
        return "lost", str(exc)


def serve(scheduler: str, start: Callable[[], tuple[Any, Builder]], name: str | None = None,
          announce: Callable[[str], None] = print) -> None:
    """`tune-cli gpu-host`: start this host's GPU workers and compile pool (`start`, e.g.
    `start_gpu`), join the scheduler, and serve tune-cli runs until stopped or the scheduler goes."""
    reachable(scheduler)  # before seconds of GPU start-up
    runner, builder = start()
    try:
        agent = HostAgent(runner, builder, name or socket.gethostname())
    except BaseException:
        builder.close(now=True)
        runner.close(now=True)
        raise
    _AGENT.append(agent)
    try:
        info = agent.info()
        joined = (f"tune-cli gpu-host {agent.name}: {info['gpu']} x{len(info['devices'])}, "
                  f"{builder.workers} compile processes, serving {scheduler}")
        asyncio.run(_join(scheduler, agent.name, info["parallel"] + 2, lambda: announce(joined)))
    finally:
        _AGENT.clear()
        agent.close()


async def _join(scheduler: str, name: str, nthreads: int, joined: Callable[[], None]) -> None:
    """Be a Dask worker of the scheduler (in this process: its GPU workers and pool are children of
    it and end with it) until it closes; each measurement holds one of its threads while it waits.
    `joined` runs once the scheduler knows it."""
    from distributed import Worker

    try:
        worker = await Worker(scheduler, nthreads=nthreads, name=name, dashboard=False, memory_limit=0,
                              death_timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(f"cannot join the scheduler at {scheduler}: {first_line(exc, typed=False)}") from None
    async with worker:
        joined()
        await worker.finished()
