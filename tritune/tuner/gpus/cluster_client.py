"""The tune-cli process's side of a cluster (`--cluster ADDRESS`): each GPU host of the Dask
scheduler as one runner, and nothing compiled here (see `tritune.tuner.gpus.cluster`)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from tritune.errors import first_line
from tritune.kernels.family import device_key, ops
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.builder import Builder, BuildResult
from tritune.tuner.gpus.cluster import CONNECT_TIMEOUT_S, HANDSHAKE_S, ClusterError, reachable
from tritune.tuner.gpus.cluster_host import on_host
from tritune.tuner.worker.local import DeviceLost
from tritune.tuner.worker.runners import Runners
from tritune.tuner.worker.protocol import OneRunner

# hosts left out of a run (another GPU model or versions): without a handler, Python's last-resort
# handler prints the warning on stderr, as the CLI wants it
LOG = logging.getLogger("tritune.cluster")


class RemoteHost(OneRunner):
    """One GPU host of the cluster, as a runner: it measures `parallel` candidates at once (compiling
    them there); a host that leaves the cluster, or whose GPUs are all lost, raises DeviceLost."""

    restarts = 0  # its GPU workers' restarts are the host's own business

    def __init__(self, cluster: "_Cluster", address: str, info: dict) -> None:
        self.cluster, self.address, self.info = cluster, address, info
        self.name, self.parallel, self.gpus = info["name"], info["parallel"], len(info["devices"])
        self.lost = False
        self.watch = Stopwatch()
        self._spent_lock = threading.Lock()  # answers of several candidates in flight arrive at once
        self._host_spent: dict[str, float] = {}  # the host's GPU totals of its last answer

    def device_info(self) -> dict:
        """The host's GPU facts."""
        return self.info

    def measure(self, expr: Any, config: Config, compile_s: float = 0.0, best_ms: float | None = None) -> MeasureResult:
        """Compile, check and time one candidate on the host (the result names its GPU). The host's
        answer also brings what each of its GPUs has spent checking and timing so far: the call
        adds what those totals grew by since the last answer to this runner's stopwatch, where the
        workload's measurer finds it (answers of candidates measured at once split the host's
        seconds between them by arrival: the run's sum is right, a candidate's share approximate)."""
        result, spent = self._call("measure", expr, config, best_ms)
        with self._spent_lock:
            for key, total in spent.items():
                grew = total - self._host_spent.get(key, 0.0)
                if grew > 0:
                    self._host_spent[key] = total
                    self.watch.add(key, grew)
                    self.watch.add(key.partition(" on ")[0], grew)
        return result

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
                return "lost", first_line(exc, typed=False)

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
    cluster = _Cluster(_client(address, min(CONNECT_TIMEOUT_S, max(wait_s, HANDSHAKE_S))))
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


def _client(address: str, timeout_s: float) -> Any:
    """A Dask client of the scheduler at `address`, once a scheduler has answered there within
    `timeout_s` (the run's --cluster-wait, at least HANDSHAKE_S)."""
    from distributed import Client

    reachable(address, timeout_s)
    try:
        return Client(address, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(f"cannot reach a Dask scheduler at {address}: {first_line(exc, typed=False)}") from None


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
                           f"start one there with `tune-cli gpu-host --scheduler {address}`")
    first = next(iter(infos.values()))
    mine = {op: device_key(first, op).key for op in ops()}  # what this process stores trials under
    hosts = []
    for a, info in infos.items():
        if info["keys"] == mine:
            hosts.append(RemoteHost(cluster, a, info))
        else:
            LOG.warning(f"tune-cli: left out host {info['name']}: {info['gpu']} with Triton {info['triton']}, torch "
                        f"{info['torch']} and its tritune differ from {first['name']}'s or this process's")
    if not hosts:
        raise ClusterError(f"the hosts at {address} run another tritune than this process")
    return hosts
