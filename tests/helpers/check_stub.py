"""A stand-in for the whole-model check's child process (`tritune.tuner.model.check._child`): it
follows the protocol and writes, beside its result, when it heard each word and when it timed."""
import json
import time
from pathlib import Path


def child(parent, conn, spec, input_shapes, decode, dtype, db_path, mode, rounds, out):
    heard = {"started": time.time()}
    conn.recv()  # go
    heard["go"] = time.time()
    time.sleep(float(spec))  # compiling with the tuned kernels
    conn.send("compiled")
    conn.recv()  # time
    heard["time"] = time.time()
    time.sleep(float(spec))  # timing in turns
    heard["timed"] = time.time()
    Path(out).write_text(json.dumps({"mode": mode, "heard": heard}))
