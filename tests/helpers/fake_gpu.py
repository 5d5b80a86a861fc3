"""A GPU that is not there, for whole `tune-cli` processes in tests: TRITUNE_FAKE_GPU=fake_gpu (with
tests/helpers on PYTHONPATH). The worker takes FAKE_GPU_MS milliseconds per measurement and appends the key
of each config it measured to the file FAKE_GPU_LOG (if set); the builder compiles nothing. The host has FAKE_GPU_DEVICES of them (default 1); FAKE_GPU_LOSE="D:N" makes device D fall
off the bus after N measurements (its worker dies and cannot start again); FAKE_GPU_HANG=N makes every
device hang from its (N+1)th measurement on. Each measurement's start is logged ("workload config") to
FAKE_GPU_LOG.started. FAKE_GPU_EARLY=1 has the driver tell the device's facts before the worker is up
(=wrong: other facts than the worker's). FAKE_GPU_TOGETHER=DIR holds every device's first measurement
until all FAKE_GPU_DEVICES devices have been sent one (each marks DIR as its first comes), so that a
device whose worker starts late still gets candidates to measure."""
import os
import time

from fakes import fake_head_to_head, fake_time
from tritune.records.result import Status
from tritune.tuner.builder import BuildResult

INFO = {"gpu": "Fake H100", "capability": "9.0", "sms": 132, "shared_bytes": 232448, "triton": "3.x", "torch": "2.x"}


_state = {"device": 0, "measured": 0}


def _info(payload: dict) -> dict:
    device, count = payload.get("device") or 0, int(os.environ.get("FAKE_GPU_DEVICES", "1"))
    if device >= count or os.path.exists(_lost_mark(device)):
        raise RuntimeError(f"there is no CUDA device {device}")
    _state["device"] = device
    return {**INFO, "device": device, "device_count": count}


def _wait_for_every_device() -> None:
    """FAKE_GPU_TOGETHER: at the first measurement, wait (up to a minute) until every device has been
    sent one. Waiting for every worker's start alone was not enough: on a loaded host the first
    device measured all 24 candidates before the tuning process had read the second's handshake."""
    together = os.environ.get("FAKE_GPU_TOGETHER")
    if not together or _state.get("together"):
        return
    open(os.path.join(together, f"first{_state['device']}"), "w").close()
    marks = [os.path.join(together, f"first{d}") for d in range(int(os.environ.get("FAKE_GPU_DEVICES", "1")))]
    for _ in range(6000):
        if all(os.path.exists(m) for m in marks):
            break
        time.sleep(0.01)
    _state["together"] = True


def early_info(index: int) -> dict | None:
    """The facts the driver would give before the worker is up (with FAKE_GPU_EARLY=1; =wrong: a
    GPU other than the one the worker reports)."""
    early, count = os.environ.get("FAKE_GPU_EARLY"), int(os.environ.get("FAKE_GPU_DEVICES", "1"))
    if not early or index >= count:
        return None
    info = {**INFO, "device": index, "device_count": count}
    return {**info, "gpu": "Fake A100"} if early == "wrong" else info


def _lost_mark(device: int) -> str:
    return f"{os.environ.get('FAKE_GPU_LOG', '/nonexistent/fake')}.lost{device}"


def _measure(payload: dict) -> dict:
    lose = os.environ.get("FAKE_GPU_LOSE")
    if lose and int(lose.split(":")[0]) == _state["device"] and _state["measured"] >= int(lose.split(":")[1]):
        open(_lost_mark(_state["device"]), "w").close()
        os._exit(1)
    config = payload["config"]
    log = os.environ.get("FAKE_GPU_LOG")
    if log:
        with open(f"{log}.started", "a") as fp:
            fp.write(f"{payload['expr'].key} {config.key}\n")
    if _state["measured"] >= int(os.environ.get("FAKE_GPU_HANG", "1000000")):
        time.sleep(3600)
    _wait_for_every_device()
    _state["measured"] += 1
    start = time.perf_counter()
    time.sleep(float(os.environ.get("FAKE_GPU_MS", "20")) / 1000)
    spent = {"timing": time.perf_counter() - start}  # the device-seconds a real worker reports
    if log:
        with open(log, "a") as fp:
            fp.write(config.key + "\n")
    t = fake_time(config)
    return {"status": Status.OK, "times": (t, t, t, t), "message": "fake", "spent": spent}


def handlers(timing):
    return {"info": _info, "measure": _measure, "head_to_head": fake_head_to_head}


def build(expr, config, problem, target, shared_limit):
    return BuildResult(config, None, 0.0)
