"""A stand-in for the whole-model check's child process (`tritune.tuner.model.check._child`): it
follows the protocol and writes, beside its result, when it heard each word and when it timed.
`spec` is 'SECONDS' (each phase's length) or 'SECONDS:oom' (the first process of the default mode
reports that it ran out of GPU memory)."""
import json
import time
from pathlib import Path


def child(parent, conn, spec, input_shapes, decode, dtype, db_path, mode, rounds, out):
    seconds, _, fail = spec.partition(":")
    heard = {"started": time.time(), "words": [conn.recv()]}  # go
    heard["go"] = time.time()
    (Path(out).parent / f"went-{mode}").touch()
    time.sleep(float(seconds))  # compiling with the tuned kernels
    conn.send("compiled")
    heard["words"].append(conn.recv())  # time
    heard["time"] = time.time()
    time.sleep(float(seconds))  # timing in turns
    heard["timed"] = time.time()
    result = {"mode": mode, "heard": heard}
    marker = Path(out).parent / f"failed-{mode}"
    if fail == "oom" and mode == "default" and not marker.exists():
        marker.touch()
        result.update(error="CUDA out of memory. Tried to allocate 2.00 GiB", out_of_memory=True)
    Path(out).write_text(json.dumps(result))
