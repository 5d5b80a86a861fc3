"""Worker handlers that misbehave on purpose, for testing the runner's isolation on a CPU."""
import os
import time
from pathlib import Path

from fakes import fake_head_to_head
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
    if payload["config"].library is not None:  # slower than any schedule here: searches find something
        return {"status": Status.OK, "times": (1.5, 1.5, 1.5, 1.5), "message": "library"}
    return {"status": Status.OK, "times": (1.0, 1.1, 1.2, 1.3), "message": f"pid {os.getpid()}"}


def handlers(timing):
    return {"info": lambda p: {"pid": os.getpid()}, "measure": measure}


def session_handlers(timing):
    """A worker that looks like an H100 to the session: device facts, measurements, head-to-head."""
    info = {"gpu": "Fake H100", "capability": "9.0", "sms": 132, "shared_bytes": 232448,
            "triton": "3.x", "torch": "2.x"}
    started = {"imported_at": time.time() - 1.5, "up_at": time.time(), "age_s": 3.5}  # as a real worker's
    return {"info": lambda p: {**info, "startup": started}, "measure": measure,
            "head_to_head": fake_head_to_head}


def library_wins_handlers(timing):
    """As session_handlers, but the library call beats the tuned best in the final head-to-head."""
    return _head_to_head_with(timing, 0.9)


def near_tie_handlers(timing):
    """As session_handlers, but the tuned best beats the library call by only 2% at the end."""
    return _head_to_head_with(timing, 1.02)


def compile_ties_handlers(timing):
    """As session_handlers, but torch.compile ties the tuned best (1% behind) and the library call
    is twice as slow (an epilogue it runs unfused)."""
    return _head_to_head_with(timing, 2.0, 1.01)


def compile_wins_handlers(timing):
    """As session_handlers, but torch.compile beats the tuned best and the library call is twice as slow."""
    return _head_to_head_with(timing, 2.0, 0.95)


def _head_to_head_with(timing, mm_ms, compiled_ms=1.2):
    def answer(payload):
        alternatives = {"mm": mm_ms, "torch.compile": compiled_ms}
        best = min(alternatives, key=alternatives.get)
        return {**fake_head_to_head(payload), "alternatives": alternatives, "best_alternative": best,
                "best_alternative_ms": alternatives[best]}
    return {**session_handlers(timing), "head_to_head": answer}


_prepared: dict = {}


def prepare(payload):
    """The worker's compile of the head-to-head's alternatives, ahead (remembered, not done), and
    whether torch.compile had been warmed up in this process before it."""
    _prepared["key"], _prepared["warm before"] = payload["expr"].key, _prepared.get("warmed", False)
    return {"compile_s": 0.5, "error": ""}


def warm(payload):
    """The worker's warm-up of torch.compile (remembered, not done)."""
    _prepared["warmed"] = True
    return {"compile_s": 0.1}


def ahead_handlers(timing):
    """As session_handlers, with the alternatives compiled ahead: the head-to-head says which process
    compared and whether it found them compiled for its workload."""
    def answer(payload):
        ready = _prepared.get("key") == payload["expr"].key
        return {**fake_head_to_head(payload), "pid": os.getpid(), "ready": ready,
                "warm before": _prepared.get("warm before", False)}
    return {**session_handlers(timing), "prepare": prepare, "warm": warm, "head_to_head": answer}


def _until_go(most_s: float) -> None:
    """Wait until the file named by FAKE_WORKER_GO exists, or `most_s` has passed."""
    deadline = time.time() + most_s
    while not os.path.exists(os.environ["FAKE_WORKER_GO"]) and time.time() < deadline:
        time.sleep(0.02)


def slow_warm_handlers(timing):
    """As ahead_handlers, but the warm-up touches the file named by FAKE_WARMING and then lasts until
    the file named by FAKE_WORKER_GO exists (at most a minute), as torch.compile's takes seconds."""
    def slow_warm(payload):
        Path(os.environ["FAKE_WARMING"]).touch()
        _until_go(60)
        return warm(payload)
    return {**ahead_handlers(timing), "warm": slow_warm}


def gated_head_to_head_handlers(timing):
    """As session_handlers, but the head-to-head answers only once the file named by FAKE_WORKER_GO
    exists (at most 20 s late)."""
    def answer(payload):
        _until_go(20)
        return fake_head_to_head(payload)
    return {**session_handlers(timing), "head_to_head": answer}


def gated_session_handlers(timing):
    """As session_handlers, but the worker answers its handshake only once the file named by
    FAKE_WORKER_GO exists (at most a minute late), as a real worker answers seconds after its start."""
    handlers = session_handlers(timing)
    facts = handlers["info"]

    def info(payload):
        _until_go(60)
        answer = facts(payload)
        return {**answer, "startup": {**answer["startup"], "up_at": time.time()}}
    return {**handlers, "info": info}
