"""Worker handlers that misbehave on purpose, for testing the runner's isolation on a CPU."""
import os
import time

from tritune.records.result import Status


def measure(payload):
    fault = payload["config"].get("fault")
    if fault == "exit":  # the process dies, as after a segfault
        os._exit(11)
    if fault == "hang":
        time.sleep(3600)
    if fault == "cuda":  # the message of a corrupted CUDA context: fatal, the worker must go
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if fault == "raise":
        raise ValueError("something ordinary")
    if fault == "wrong":
        return {"status": Status.WRONG_ANSWER, "message": "relative error 1 > 0.002"}
    return {"status": Status.OK, "times": (1.0, 1.1, 1.2, 1.3), "message": f"pid {os.getpid()}"}


def handlers(timing):
    return {"info": lambda p: {"pid": os.getpid()}, "measure": measure}


def session_handlers(timing):
    """A worker that looks like an H100 to the session: device facts, measurements, head-to-head."""
    info = {"gpu": "Fake H100", "capability": "9.0", "sms": 132, "shared_bytes": 232448,
            "triton": "3.x", "torch": "2.x"}
    return {"info": lambda p: info, "measure": measure,
            "head_to_head": lambda p: {"ours_ms": 1.0, "torch_ms": 1.1}}
