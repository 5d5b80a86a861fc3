"""Tuning across hosts through Dask distributed.

A GPU host runs `tune-cli worker --scheduler ADDRESS`: one Dask worker process holding the host's
GPU workers (one crash-isolated process per device, as `--devices` starts them) and its compile
pool (`HostAgent`). `tune-cli run|tune-model --cluster ADDRESS` connects to the same scheduler and
sees each host as one runner (`RemoteHost`) that measures as many candidates at once as the host
has GPUs and compile processes: the host compiles each candidate (filling its own Triton cache)
and measures it on its next free GPU; the tune-cli process, which alone owns the SQLite database,
stores the results. The workloads spread over the hosts as they do over one host's GPUs (`spread`).

A host that leaves (killed, off the network, its GPUs all lost) is lost for the run: its candidates
in flight go back to the others; with none left the run stops with one line, everything measured
stored. Hosts joining after the start are not used by a run already going.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable

from tritune.kernels.family import device_key, family, ops
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import Builder, BuildResult
from tritune.tuner.measurer import Measurer
from tritune.tuner.runner import DeviceLost, Runners, WorkerDied

CONNECT_TIMEOUT_S = 30.0  # how long to try reaching a scheduler


class ClusterError(WorkerDied):
    """No cluster to measure on: a scheduler that cannot be reached, no GPU host in it."""

    def __init__(self, message: str) -> None:
        super().__init__(Status.CRASH, message)


# ---- on a GPU host -------------------------------------------------------------------------------

LANES = 8  # measurers a host keeps for the workloads it was sent last (idle ones beyond are closed)


class HostAgent:
    """A GPU host's side: its GPU workers and compile pool measure what tune-cli processes send;
    nothing is stored here. Candidates of one workload share a measurer (its inputs and reference
    stay on the GPU), one per workload sent lately."""

    def __init__(self, runner: Any, builder: Builder, name: str) -> None:
        self.runner, self.builder, self.name = runner, builder, name
        devices = getattr(runner, "each", [runner])
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

    def measure(self, expr: Any, config: Config, best_ms: float | None) -> MeasureResult:
        """Compile one candidate in the host's pool, then check and time it on the next free GPU."""
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
            return done.result()
        finally:
            with self._lock:
                self._busy[expr.key] -= 1

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
        return "lost", "a Dask worker that is no tritune worker (start them with `tune-cli worker`)"
    try:
        return "ok", getattr(_AGENT[0], method)(*args)
    except DeviceLost as exc:
        return "lost", str(exc)


def serve(scheduler: str, start: Callable[[], tuple[Any, Builder]], name: str | None = None,
          announce: Callable[[str], None] = print) -> None:
    """`tune-cli worker`: start this host's GPU workers and compile pool (`start`, e.g. the session's
    `start_gpu`), join the scheduler, and serve tune-cli runs until stopped or the scheduler goes."""
    _reachable(scheduler)  # before seconds of GPU start-up
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
        joined = (f"tune-cli worker {agent.name}: {info['gpu']} x{len(info['devices'])}, "
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
        raise ClusterError(f"cannot join the scheduler at {scheduler}: {_first_line(exc)}") from None
    async with worker:
        joined()
        await worker.finished()


# ---- in the tune-cli process ---------------------------------------------------------------------

class RemoteHost:
    """One GPU host of the cluster, as a runner: it measures `parallel` candidates at once (compiling
    them there); a host that leaves the cluster, or whose GPUs are all lost, raises DeviceLost."""

    restarts = 0  # its GPU workers' restarts are the host's own business

    def __init__(self, cluster: "_Cluster", address: str, info: dict) -> None:
        self.cluster, self.address, self.info = cluster, address, info
        self.name, self.parallel = info["name"], info["parallel"]
        self.lost = False
        self.watch = Stopwatch()

    def device_info(self) -> dict:
        """The host's GPU facts."""
        return self.info

    def measure(self, expr: Any, config: Config, compile_s: float = 0.0, best_ms: float | None = None) -> MeasureResult:
        """Compile, check and time one candidate on the host (the result names its GPU)."""
        return self._call("measure", expr, config, best_ms)

    def head_to_head(self, expr: Any, config: Config) -> dict:
        """The end-of-run comparison, on the host's first GPU."""
        return self._call("head_to_head", expr, config)

    def _call(self, method: str, *args: Any) -> Any:
        if self.lost:
            raise DeviceLost(Status.CRASH, f"host {self.name} is lost for this run")
        future = self.cluster.client.submit(on_host, method, *args, workers=[self.address],
                                            allow_other_workers=False, pure=False)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())  # (result(timeout) leaves a Dask task behind per try)
        while not done.wait(1.0):  # still measuring, or waiting for a worker that is gone
            if not self.cluster.alive(self.address):
                status, answer = "lost", "it left the cluster"
                break
        else:
            status, answer = self._gather(future)
        if status == "lost":
            self.lost = True
            future.cancel()
            raise DeviceLost(Status.CRASH, f"host {self.name} lost: {answer}")
        return answer

    def _gather(self, future: Any) -> tuple[str, Any]:
        """The answer of a finished call. A host that goes after its answer is done but before it
        is fetched has Dask run the call again, waiting for that host for ever: so wait in short
        steps, and call the host lost once it has left the cluster."""
        while True:
            try:
                return future.result(timeout=2.0)
            except TimeoutError:
                if not self.cluster.alive(self.address):
                    return "lost", "it left the cluster before its answer was fetched"
            except Exception as exc:  # noqa: BLE001 - the connection or the worker went mid-call
                return "lost", _first_line(exc)

    def close(self, now: bool = False) -> None:
        """Let go of the cluster (its hosts go on serving)."""
        self.cluster.close()


class _Cluster:
    """The Dask client of the tune-cli process, and which workers are still there (asked at most
    twice a second, whichever measuring thread asks)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._workers: set[str] = set()
        self._asked = 0.0
        self._lock = threading.Lock()

    def alive(self, address: str) -> bool:
        """Whether the worker at `address` is still in the cluster."""
        with self._lock:
            if time.monotonic() - self._asked > 0.5:
                try:
                    self._workers = set(self.client.nthreads())
                except Exception:  # noqa: BLE001 - the scheduler itself is gone: so is every host
                    self._workers = set()
                self._asked = time.monotonic()
            return address in self._workers

    def close(self) -> None:
        """Close the client (once, whichever host closes first)."""
        with self._lock:
            client, self.client = self.client, None
        if client is not None:
            try:
                client.close(timeout=5)
            except Exception:  # noqa: BLE001 - a scheduler already gone: nothing to let go of
                pass


class RemoteBuilds(Builder):
    """The tune-cli process's side of compiling in a cluster: nothing (each host compiles what it
    measures, into its own Triton cache); its small pool does the run's other work (`background`)."""

    def submit(self, expr: Any, problem: Any, configs: Any) -> list[BuildResult]:
        """Every candidate as ready to send (compiled where it is measured)."""
        return [BuildResult(c, None, 0.0) for c in configs]


def connect(address: str, wait_s: float, meanwhile: Callable[[], None] | None = None) -> tuple[Runners, Builder]:
    """The cluster at `address` as a group of runners, one per GPU host (only hosts of the first one's
    device key: one GPU model, Triton, torch and tritune), and a pool for the run's own work;
    ClusterError (one line) where there is no scheduler there or no GPU host joins within `wait_s`."""
    cluster = _Cluster(_client(address))
    builder = RemoteBuilds(workers=2)
    try:
        if meanwhile is not None:
            meanwhile()
        hosts = _hosts(cluster, address, wait_s)
    except BaseException:
        builder.close(now=True)
        cluster.close()
        raise
    return Runners(hosts), builder


def _client(address: str) -> Any:
    from distributed import Client

    _reachable(address)
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(f"cannot reach a Dask scheduler at {address}: {_first_line(exc)}") from None


def check_address(address: str) -> tuple[str, int]:
    """The host and port of a scheduler's address ("tcp://host:8786" or "host:8786"); ValueError
    (one line) for anything else."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        if scheme not in ("tcp", "tls"):
            raise ValueError(f"scheme {scheme!r}: tcp:// or tls:// only")
        return parse_host_port(location)
    except ValueError as exc:
        raise ValueError(f"bad scheduler address {address!r} ({_first_line(exc)}): expected tcp://HOST:PORT") from None


def _reachable(address: str) -> None:
    """Refuse, with one line, a scheduler that cannot be reached, before Dask tries (a Dask client
    that failed to connect prints tracebacks as it is collected, seconds later)."""
    _quiet()
    try:
        socket.create_connection(check_address(address), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach a Dask scheduler at {address}: {exc.strerror or exc}") from None


def _hosts(cluster: _Cluster, address: str, wait_s: float) -> list[RemoteHost]:
    """The tritune workers of the scheduler (waiting up to `wait_s` for a first one), those of the
    first one's device key; the others are named and left out."""
    deadline = time.monotonic() + wait_s
    while True:
        answers = cluster.client.run(on_host, "info")
        infos = {a: info for a, (status, info) in sorted(answers.items()) if status == "ok"}
        if infos or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not infos:
        raise ClusterError(f"no GPU host joined the scheduler at {address} within {wait_s:.0f} s; "
                           f"start one there with `tune-cli worker --scheduler {address}`")
    first = next(iter(infos.values()))
    mine = {op: device_key(first, op).key for op in ops()}  # what this process stores trials under
    hosts = []
    for a, info in infos.items():
        if info["keys"] == mine:
            hosts.append(RemoteHost(cluster, a, info))
        else:
            print(f"tune-cli: left out host {info['name']}: {info['gpu']} with Triton {info['triton']}, torch "
                  f"{info['torch']} and its tritune differ from {first['name']}'s or this process's", file=sys.stderr)
    if not hosts:
        raise ClusterError(f"the hosts at {address} run another tritune than this process")
    return hosts


def _quiet() -> None:
    """Dask's own log lines (connections, start-up, re-fetching a lost host's answers) are not the
    user's business: errors only."""
    import distributed  # noqa: F401 - its import sets its loggers' levels from Dask's config

    for name in ["distributed", *[n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]]:
        logging.getLogger(name).setLevel(logging.ERROR)
    # a fetch given up on a lost host leaves a Dask task that fails as the client closes, which
    # asyncio reports at exit ("Task exception was never retrieved"); this process runs no other loop
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
