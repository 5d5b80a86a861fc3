"""Who holds a claim on a config: a tuner process, named by host and pid, and whether it may still run."""
from __future__ import annotations

import os
import socket


def owner_id() -> str:
    """Who holds a claim: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def alive(owner: str) -> bool:
    """Whether a claim's owner may still run (a process of another host is taken to)."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)  # signal 0: is there such a process (PermissionError: yes, another user's)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
