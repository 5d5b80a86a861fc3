"""Child processes that end with their parent, however it ends (SIGKILL, an OOM kill, a closed
terminal), and leave signals to it: a compile-pool worker or GPU worker left behind would hold
cores, GPU memory and the multiprocessing resource tracker long after its run is gone."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def bind_to_parent(parent_pid: int) -> None:
    """Run first in every child: the kernel SIGKILLs it when its parent dies (Linux), it exits now if
    the parent is already gone, and Ctrl-C in a terminal (SIGINT to the whole process group) is the
    parent's to handle, not the child's."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
