"""Tuning across hosts through Dask distributed.

A GPU host runs `tune-cli gpu-host --scheduler ADDRESS`: one Dask worker process holding the host's
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
import pickle
import socket
import struct
import sys
import time
from typing import Any

from tritune.errors import first_line
from tritune.records.result import Status
from tritune.tuner.worker.local import WorkerDied

CONNECT_TIMEOUT_S = 30.0  # how long to try reaching a scheduler
HANDSHAKE_S = 5.0  # the least time a scheduler is given to answer (one answers in milliseconds)
MAX_MESSAGE_BYTES = 1 << 20  # a scheduler's greeting and identity are under 1 kB; a peer may claim any size


class ClusterError(WorkerDied):
    """No cluster to measure on: a scheduler that cannot be reached, no GPU host in it."""

    def __init__(self, message: str) -> None:
        super().__init__(Status.CRASH, message)


def check_address(address: str) -> tuple[str, int]:
    """The host and port of a scheduler's address ("tcp://host:8786" or "host:8786"); ValueError
    (one line) for anything else. Only plain TCP: Dask's TLS needs certificates and keys that
    tritune takes no options for (its client failed inside Dask, after a minute), and its other
    transports (ucx, ws, inproc) are not ones a GPU host is served on here."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except ValueError as exc:
        raise ValueError(f"bad scheduler address {address!r} ({first_line(exc, typed=False)}): "
                         "expected tcp://HOST:PORT") from None
    if scheme == "tls":
        raise ValueError(f"bad scheduler address {address!r}: tls:// is not supported, tritune takes no TLS "
                         "certificates (use tcp:// on a trusted network, or an SSH tunnel)")
    if scheme != "tcp":
        raise ValueError(f"bad scheduler address {address!r}: {scheme}:// is not supported; expected tcp://HOST:PORT")
    if not 0 < port < 65536:
        raise ValueError(f"bad scheduler address {address!r}: port {port} is out of range (1 to 65535)")
    return host, port


def reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse, with one line, an address where no Dask scheduler answers within `timeout_s`
    (connecting, its greeting and its reply to `identity`, all together), before Dask tries: a Dask
    client waits for ever on a peer that never speaks, allocates whatever size a peer's first bytes
    claim, and prints tracebacks as it is collected after failing to connect."""
    _quiet()
    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection(check_address(address), timeout=timeout_s)
    except OSError as exc:
        raise ClusterError(f"cannot reach a Dask scheduler at {address}: {exc.strerror or exc}") from None
    try:
        _handshake(sock, address, deadline)
    except TimeoutError:
        raise ClusterError(f"no Dask scheduler answered at {address} within {timeout_s:g} s "
                           "(something listens there)") from None
    except OSError as exc:
        raise ClusterError(f"no Dask scheduler at {address}: {exc.strerror or exc}") from None
    finally:
        sock.close()


class _NotDask(Exception):
    """A peer that does not speak Dask's protocol."""


def _handshake(sock: socket.socket, address: str, deadline: float) -> None:
    """Greet the peer as a Dask client does and ask who it is; ClusterError unless a scheduler answers."""
    ours = {"compression": None, "python": tuple(sys.version_info)[:3], "pickle-protocol": pickle.HIGHEST_PROTOCOL}
    try:
        for message in (ours, {"op": "identity", "n_workers": 0, "reply": True, "close": True}):
            _send(sock, message)
        greeting = _receive(sock, deadline)
        if not (isinstance(greeting, dict) and "pickle-protocol" in greeting):
            raise _NotDask("its greeting is not Dask's")
        identity = _receive(sock, deadline)
    except _NotDask as exc:
        raise ClusterError(f"no Dask scheduler at {address}: {exc}") from None
    if not (isinstance(identity, dict) and identity.get("type") == "Scheduler"):
        raise ClusterError(f"no Dask scheduler at {address}: a peer speaking Dask's protocol answered, not as one")


def _send(sock: socket.socket, message: dict) -> None:
    """One message in Dask's TCP framing: its length, the frames' lengths, the frames."""
    from distributed.protocol import dumps
    from distributed.protocol.utils import pack_frames

    packed = pack_frames(dumps(message))
    sock.sendall(struct.pack("<Q", len(packed)) + packed)


def _receive(sock: socket.socket, deadline: float) -> Any:
    """One message in Dask's TCP framing, refusing any that claims more than MAX_MESSAGE_BYTES."""
    from distributed.protocol import loads
    from distributed.protocol.utils import unpack_frames

    (size,) = struct.unpack("<Q", _read(sock, 8, deadline))
    if size > MAX_MESSAGE_BYTES:
        raise _NotDask(f"its first bytes announce a message of {size} bytes")
    try:
        frames = unpack_frames(_read(sock, size, deadline))
        return loads(frames, deserialize=False)
    except Exception as exc:  # noqa: BLE001 - whatever the bytes were, they are not a Dask message
        raise _NotDask(f"it sent no Dask message ({type(exc).__name__})") from None


def _read(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Exactly `n` bytes, by the deadline (TimeoutError), or _NotDask where the peer hangs up first."""
    data = bytearray()
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError()
        sock.settimeout(left)
        chunk = sock.recv(min(n - len(data), 1 << 16))
        if not chunk:
            raise _NotDask("it closed the connection")
        data += chunk
    return bytes(data)


def _quiet() -> None:
    """Dask's own log lines (connections, start-up, re-fetching a lost host's answers) are not the
    user's business: errors only."""
    import distributed  # noqa: F401 - its import sets its loggers' levels from Dask's config

    for name in ["distributed", *[n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]]:
        logging.getLogger(name).setLevel(logging.ERROR)
    # a fetch given up on a lost host leaves a Dask task that fails as the client closes, which
    # asyncio reports at exit ("Task exception was never retrieved"); this process runs no other loop
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
