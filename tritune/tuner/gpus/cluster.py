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

import logging
import socket

from tritune.errors import first_line
from tritune.records.result import Status
from tritune.tuner.worker.local import WorkerDied

CONNECT_TIMEOUT_S = 30.0  # how long to try reaching a scheduler


class ClusterError(WorkerDied):
    """No cluster to measure on: a scheduler that cannot be reached, no GPU host in it."""

    def __init__(self, message: str) -> None:
        super().__init__(Status.CRASH, message)


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
        raise ValueError(f"bad scheduler address {address!r} ({first_line(exc, typed=False)}): expected tcp://HOST:PORT") from None


def reachable(address: str) -> None:
    """Refuse, with one line, a scheduler that cannot be reached, before Dask tries (a Dask client
    that failed to connect prints tracebacks as it is collected, seconds later)."""
    _quiet()
    try:
        socket.create_connection(check_address(address), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach a Dask scheduler at {address}: {exc.strerror or exc}") from None


def _quiet() -> None:
    """Dask's own log lines (connections, start-up, re-fetching a lost host's answers) are not the
    user's business: errors only."""
    import distributed  # noqa: F401 - its import sets its loggers' levels from Dask's config

    for name in ["distributed", *[n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]]:
        logging.getLogger(name).setLevel(logging.ERROR)
    # a fetch given up on a lost host leaves a Dask task that fails as the client closes, which
    # asyncio reports at exit ("Task exception was never retrieved"); this process runs no other loop
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
