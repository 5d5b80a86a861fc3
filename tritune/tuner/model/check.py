"""tune-model's last step: the whole model compiled with its tuned kernels against Inductor without
them, timed in turns in each torch.compile mode. A tuned kernel that wins alone can still lose in a
model (a host-bound decode step pays for every launch, and Inductor's own choice around it may
fuse better), so a graph that runs slower with tuned kernels is stored as such (a graph verdict)
and `tritune.compiler` then leaves it to Inductor whole: a tuned model is never slower than
torch.compile's, as measured.

The measurement runs in a child process per mode (its own CUDA context: a crash costs only the
check), timed by `tritune.tuner.timing`; `EarlyCheck` starts them before the tuning, so that their
start and Inductor's own compiles are paid while the tuner works, and after it they compile with
the tuned kernels at once (the modes' compiles overlap) and time one after another.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from tritune.records.database import Database
from tritune.records.dispatch import graph_mode
from tritune.records.result import DeviceKey
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.timing import gpu_ms_per_call, in_turns, paired_ratio, per_call_ms
from tritune.tuner.worker.lifeline import bind_to_parent, leave, start_lasting

MODES = ("default", "reduce-overhead")  # torch.compile's modes the check measures
# the tuned kernels keep a graph only when it is this much faster than Inductor's: a tie is Inductor's
# (two identical compiled models of a host-bound decode step timed up to 4% apart on the H100)
GRAPH_MARGIN = 0.02
MAX_REL_ERROR = 5e-2  # a compiled model further than this from Inductor's output is wrong, not fast
# the check's processes (and Inductor's compile workers they start) yield to the tuning: its start
# (the model's capture) and its compile pool (niced 10) are the critical path while they run ahead
CHECK_NICE = 15


def check_model(spec: str, input_shapes: Sequence[str], dtype: str, db_path: str | Path,
                modes: Sequence[str] = MODES, rounds: int = 30, timeout_s: float = 900.0,
                decode: str | None = None) -> list[dict]:
    """Measure the model (built from `spec` with seeded random weights on the GPU, run on inputs of
    `input_shapes` or as its `decode` step: `subject.load_subject`) in each mode in a child process,
    store a graph verdict for every graph with tuned sites, and return one result per mode
    ({'mode', 'error'} where the check failed: no verdict is stored then)."""
    with EarlyCheck(spec, input_shapes, dtype, db_path, modes, rounds, decode) as check:
        return check.finish(timeout_s)


class EarlyCheck:
    """The check's child processes, one per mode, started before the tuning: each imports torch,
    builds the model and compiles (and runs once) Inductor's lowering in its mode while the tuner
    works (seconds of CPU each, off the tuning's critical path), then waits for `finish`, which has
    every child compile the model with the tuned kernels at once and then time both in turns, one
    mode after another (the GPU is timed by one process at a time). A mode that ran out of GPU
    memory beside the others is checked again alone, after them. Killed on leaving the block
    unfinished."""

    def __init__(self, spec: str, input_shapes: Sequence[str], dtype: str, db_path: str | Path,
                 modes: Sequence[str] = MODES, rounds: int = 30, decode: str | None = None) -> None:
        self.db_path, self.modes = db_path, list(modes)
        self._tmp = tempfile.TemporaryDirectory(prefix="tritune_check_")
        self._args = (spec, list(input_shapes), decode, dtype, str(db_path))
        self._rounds, self._spawned = rounds, 0
        self._children = [self._spawn(mode) for mode in self.modes]

    def _spawn(self, mode: str) -> "_Child":
        """A check process for `mode`, started."""
        ctx = mp.get_context("spawn")
        self._spawned += 1
        out = Path(self._tmp.name) / f"check-{self._spawned}-{mode}.json"
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_child, daemon=True,
                           args=(os.getpid(), child, *self._args, mode, self._rounds, str(out)))
        start_lasting(proc.start)
        child.close()
        return _Child(mode, proc, conn, out)

    def compile_now(self) -> None:
        """Let the children compile with the tuned kernels now (every verdict is stored), while
        the tuning's session ends; `finish` then waits for those compiles."""
        for child in self._children:
            child.go()

    def finish(self, timeout_s: float = 900.0) -> list[dict]:
        """Let the children compile with the tuned kernels (all at once, if `compile_now` has not),
        then time one mode after another; their results (stored as graph verdicts)."""
        deadline = time.monotonic() + timeout_s
        results = _run(self._children, deadline, timeout_s)
        for i, r in enumerate(results):
            if r.get("out_of_memory") and len(self._children) > 1:
                self._children.append(self._spawn(r["mode"]))
                results[i] = _run(self._children[-1:], deadline, timeout_s)[0]
        _store(self.db_path, results)
        return results

    def __enter__(self) -> "EarlyCheck":
        return self

    def __exit__(self, *exc: Any) -> None:
        for child in self._children:
            child.end()
        self._tmp.cleanup()


def _run(children: Sequence["_Child"], deadline: float, timeout_s: float) -> list[dict]:
    """Every child compiles with the tuned kernels at once; then each times, one after another."""
    for child in children:
        child.go()
    for child in children:
        child.hear(deadline)  # compiled (or ended)
    results = []
    for child in children:
        child.tell("time")
        results.append(child.result(deadline, timeout_s))
    return results


class _Child:
    """One mode's check process, its end of the pipe and its results' file."""

    def __init__(self, mode: str, proc: Any, conn: Any, out: Path) -> None:
        self.mode, self.proc, self.conn, self.out = mode, proc, conn, out
        self._went = False  # told to compile with the tuned kernels

    def go(self) -> None:
        """Told to compile with the tuned kernels (once)."""
        if not self._went:
            self._went = True
            self.tell("go")

    def tell(self, what: str) -> None:
        try:
            self.conn.send(what)
        except (BrokenPipeError, OSError):
            pass  # it ended already: its results, or the exit code, say why

    def hear(self, deadline: float) -> None:
        """Until the child says something, ends, or the deadline passes."""
        try:
            if self.conn.poll(max(0.0, deadline - time.monotonic())):
                self.conn.recv()
        except (EOFError, OSError):
            pass

    def result(self, deadline: float, timeout_s: float) -> dict:
        """Its result once it ends (killed at the deadline); an error where it wrote none."""
        self.proc.join(max(0.0, deadline - time.monotonic()))
        self.end()
        if self.out.exists():
            return json.loads(self.out.read_text())
        code = self.proc.exitcode
        return {"mode": self.mode, "error": f"the check's process ended with exit code {code}"
                if code and code > 0 else f"timed out after {timeout_s:.0f} s"}

    def end(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _store(db_path: str | Path, results: Sequence[dict]) -> None:
    with Database(db_path) as db:
        for r in results:
            if r.get("winner"):
                device = DeviceKey.from_json(r["device"])
                detail = {k: r[k] for k in ("inductor_ms", "tritune_ms", "ratio", "rel_error", "rounds",
                                            "tritune_gpu_ms", "inductor_gpu_ms", "gpu_ratio") if k in r}
                for graph in r["graphs"]:
                    db.save_graph_verdict(graph, device, graph_mode("inductor", r["mode"]), r["winner"], detail)


def _child(parent: int, conn: Any, spec: str, input_shapes: list[str], decode: str | None, dtype: str, db_path: str,
           mode: str, rounds: int, out: str) -> None:
    """One mode's check process: Inductor's lowering compiled; once told to go, the tuned kernels'
    compiled; once told to time, both timed in turns and the result written."""
    bind_to_parent(parent)
    os.nice(CHECK_NICE)
    import torch

    from tritune.errors import first_line
    from tritune.tuner.breakdown import process_age_s
    from tritune.tuner.model.subject import load_subject

    start = {"process and imports": process_age_s() or 0.0}
    clock = time.perf_counter()
    try:
        model = load_subject(spec, input_shapes, dtype, "cuda", "random", decode)
        failed = None
    except Exception as exc:  # noqa: BLE001 - the user's factory, or no GPU: the mode reports it
        model, failed = None, RuntimeError(f"the model could not be built on the GPU: {first_line(exc)}")
    start["model built"] = time.perf_counter() - clock
    with torch.no_grad():
        early = _inductor(model, mode) if model is not None else failed
        _wait(conn)
        tuned = _tuned(model, db_path, mode) if not isinstance(early, Exception) else early
        conn.send("compiled")
        _wait(conn)
        try:
            if isinstance(tuned, Exception):
                raise tuned
            result = {"mode": mode, **_measure(mode, rounds, early, tuned)}
        except Exception as exc:  # noqa: BLE001 - reported as the mode's failure
            result = {"mode": mode, "error": str(exc) if model is None else first_line(exc)}
            if "out of memory" in str(exc).lower():  # torch's OutOfMemoryError, or a build that met it
                result["out_of_memory"] = True
        result["seconds"] = {**start, **result.get("seconds", {})}
        Path(out).write_text(json.dumps(result))
    leave()  # the parent joins it before timing the next mode: no finalising torch, Triton and CUDA


def _wait(conn: Any) -> None:
    """Until the parent says go on; a parent gone ends the process."""
    try:
        conn.recv()
    except (EOFError, OSError):
        os._exit(0)


def _inductor(model: Any, mode: str) -> tuple | Exception:
    """Inductor's lowering of the model (a `subject.Subject`) in `mode`, compiled and run
    (`_first_outputs`): the step caller, its outputs and the seconds it took; or what it raised."""
    import torch

    start = time.perf_counter()
    try:
        fn = model.call(torch.compile(model.fn, mode=None if mode == "default" else mode), mode != "default")
        return fn, _first_outputs(fn), time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - reported as the mode's failure
        return exc


class _Tuned(NamedTuple):
    """The model compiled with the tuned kernels in one mode: its step caller, first outputs, the
    backend (its sites and graphs) and the seconds its compile took."""
    fn: Any
    out: Any
    backend: Any
    seconds: float


def _tuned(model: Any, db_path: str, mode: str) -> _Tuned | Exception:
    """The model (a `subject.Subject`) compiled with the tuned kernels in `mode` and run
    (`_first_outputs`), as the graphs run alone (no graph verdict); or what it raised."""
    import torch
    from torch._dynamo.utils import counters

    import tritune

    counters.clear()  # the graph breaks and frames reported are this compile's
    start = time.perf_counter()
    try:
        backend = tritune.compiler(db_path, mode=None if mode == "default" else mode, graph_verdicts=False)
        fn = model.call(torch.compile(model.fn, backend=backend), mode != "default")
        return _Tuned(fn, _first_outputs(fn), backend, time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - reported as the mode's failure
        return exc


def _measure(mode: str, rounds: int, inductor: tuple, tuned: _Tuned) -> dict:
    """Inductor (`inductor`: its step caller, outputs and compile seconds, compiled ahead) and the
    tuned kernels (`tuned`) in one mode: checked against each other, timed in turns."""
    from torch._dynamo.utils import counters

    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key

    cuda_graphs = mode != "default"
    watch = Stopwatch()
    watch.add("compile by Inductor alone (ahead)", inductor[2])
    watch.add("compile with the tuned kernels", tuned.seconds)
    backend = tuned.backend
    result = {"graphs": sorted(set(backend.graphs)), "tuned_sites": sum(kind == "tuned" for _, kind in backend.sites),
              "sites": len(backend.sites), "device": device_key(device_info(), "matmul").to_json()}
    if not backend.graphs:
        return {**result, "seconds": watch.snapshot()}  # no tuned site: the graphs reach Inductor untouched
    fns = {"tritune": tuned.fn, "inductor": inductor[0]}
    error = outputs_rel_error(tuned.out, inductor[1])
    with watch("timed in turns"):  # what the verdict compares (eager, 2-6x slower, took most of the timing)
        times = in_turns(fns, per_call_ms, rounds)
    ratio = paired_ratio(times["tritune"], times["inductor"])
    with watch("GPU time (profiler)"):
        gpu = {name: gpu_ms_per_call(fns[name]) for name in ("tritune", "inductor")}
    faster = wins(ratio, gpu["tritune"] / gpu["inductor"], cuda_graphs) and error <= MAX_REL_ERROR
    return {**result, **{f"{name}_ms": statistics.median(t) for name, t in times.items()}, "ratio": ratio,
            **{f"{name}_gpu_ms": ms for name, ms in gpu.items()}, "gpu_ratio": gpu["tritune"] / gpu["inductor"],
            "rel_error": error, "rounds": rounds, "winner": "tritune" if faster else "inductor",
            "graph_breaks": sum(counters["graph_break"].values()), "frames": dict(counters["frames"]),
            "seconds": watch.snapshot()}


def wins(wall_ratio: float, gpu_ratio: float, cuda_graphs: bool) -> bool:
    """Whether the tuned kernels keep a graph: in the default mode by wall time per call (the host's
    launches are part of what the user waits for); under CUDA graphs by the GPU's own time per step
    (the profiler's: a host-bound phase of the machine cannot distort it), where a win of
    GRAPH_MARGIN is never thrown away whatever the wall clock read."""
    return (gpu_ratio if cuda_graphs else wall_ratio) <= 1 - GRAPH_MARGIN


def _first_outputs(fn: Any) -> Any:
    """Three calls (CUDA graphs: warm-up, record, replay); a copy of the last output (a later replay
    may overwrite it)."""
    from torch.utils._pytree import tree_map

    for _ in range(3):
        out = fn()
    return tree_map(lambda t: t.clone() if hasattr(t, "clone") else t, out)


def outputs_rel_error(out: Any, ref: Any) -> float:
    """The runner's relative error (`measure.rel_error`: infinite where `out` is not finite) over
    every tensor of two outputs (a tensor, tuple or model output), taken as one vector."""
    import torch
    from torch.utils._pytree import tree_leaves

    from tritune.tuner.worker.candidate import rel_error

    pairs = [(o, r) for o, r in zip(tree_leaves(out), tree_leaves(ref)) if isinstance(r, torch.Tensor)]
    return rel_error(torch.cat([o.flatten() for o, _ in pairs]), torch.cat([r.double().flatten() for _, r in pairs]))
