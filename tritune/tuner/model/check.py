"""tune-model's last step: the whole model compiled with its tuned kernels against Inductor without
them, timed in turns in each torch.compile mode. A tuned kernel that wins alone can still lose in a
model (a host-bound decode step pays for every launch, and Inductor's own choice around it may
fuse better), so a graph that runs slower with tuned kernels is stored as such (a graph verdict)
and `tritune.compiler` then leaves it to Inductor whole: a tuned model is never slower than
torch.compile's, as measured.

The measurement runs in a child process (its own CUDA context: a crash costs only the check),
timed by `tritune.tuner.timing`; `EarlyCheck` starts it before the tuning, so that its start and
Inductor's own compiles are paid while the tuner works.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from tritune.records.database import Database
from tritune.records.dispatch import graph_mode
from tritune.records.result import DeviceKey
from tritune.tuner.breakdown import Stopwatch
from tritune.tuner.timing import gpu_ms_per_call, in_turns, paired_ratio, per_call_ms
from tritune.tuner.worker.lifeline import bind_to_parent, start_lasting

MODES = ("default", "reduce-overhead")  # torch.compile's modes the check measures
# the tuned kernels keep a graph only when it is this much faster than Inductor's: a tie is Inductor's
# (two identical compiled models of a host-bound decode step timed up to 4% apart on the H100)
GRAPH_MARGIN = 0.02
MAX_REL_ERROR = 5e-2  # a compiled model further than this from Inductor's output is wrong, not fast


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
    """The check's child process, started before the tuning: it imports torch, builds the model and
    compiles (and runs once) Inductor's lowering in each mode while the tuner works (seconds of
    CPU each, off the tuning's critical path), then waits for `finish`, which has it compile the
    model with the tuned kernels and time both in turns. Killed on leaving the block unfinished."""

    def __init__(self, spec: str, input_shapes: Sequence[str], dtype: str, db_path: str | Path,
                 modes: Sequence[str] = MODES, rounds: int = 30, decode: str | None = None) -> None:
        self.db_path, self.modes = db_path, list(modes)
        self._tmp = tempfile.TemporaryDirectory(prefix="tritune_check_")
        self._out = Path(self._tmp.name) / "check.json"
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, daemon=True, args=(
            os.getpid(), child, spec, list(input_shapes), decode, dtype, str(db_path), self.modes, rounds,
            str(self._out)))
        start_lasting(self._proc.start)
        child.close()

    def finish(self, timeout_s: float = 900.0) -> list[dict]:
        """Let the child measure with the tuned kernels now; its results (stored as graph verdicts)."""
        try:
            self._conn.send("go")
        except (BrokenPipeError, OSError):
            pass  # it ended already: its results, or the exit code, say why
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        results = json.loads(self._out.read_text()) if self._out.exists() else []
        done, code = {r["mode"] for r in results}, self._proc.exitcode
        why = f"the check's process ended with exit code {code}" if code else f"timed out after {timeout_s:.0f} s"
        results += [{"mode": m, "error": why} for m in self.modes if m not in done]
        _store(self.db_path, results)
        return results

    def __enter__(self) -> "EarlyCheck":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._tmp.cleanup()


def _store(db_path: str | Path, results: Sequence[dict]) -> None:
    with Database(db_path) as db:
        for r in results:
            if r.get("winner"):
                device = DeviceKey.from_json(r["device"])
                detail = {k: r[k] for k in ("inductor_ms", "tritune_ms", "eager_ms", "ratio", "rel_error", "rounds",
                                            "tritune_gpu_ms", "inductor_gpu_ms", "gpu_ratio") if k in r}
                for graph in r["graphs"]:
                    db.save_graph_verdict(graph, device, graph_mode("inductor", r["mode"]), r["winner"], detail)


def _child(parent: int, conn: Any, spec: str, input_shapes: list[str], decode: str | None, dtype: str, db_path: str,
           modes: list[str], rounds: int, out: str) -> None:
    """The check's process: Inductor's lowering compiled in each mode, then (once told to go) each
    mode measured in turn, results written after each."""
    bind_to_parent(parent)
    import torch

    from tritune.errors import first_line
    from tritune.tuner.breakdown import process_age_s
    from tritune.tuner.model.subject import load_subject

    start = {"process and imports": process_age_s() or 0.0}
    clock = time.perf_counter()
    try:
        model = load_subject(spec, input_shapes, dtype, "cuda", "random", decode)
    except Exception as exc:  # noqa: BLE001 - the user's factory, or no GPU: every mode reports it
        model, why = None, f"the model could not be built on the GPU: {first_line(exc)}"
    start["model built"] = time.perf_counter() - clock
    early: dict[str, Any] = {}
    with torch.no_grad():
        for mode in modes if model is not None else ():
            early[mode] = _inductor(model, mode)
        _wait(conn)
        results: list[dict] = []
        for mode in modes:
            try:
                if model is None:
                    raise RuntimeError(why)
                if isinstance(early[mode], Exception):
                    raise early[mode]
                results.append({"mode": mode, **_measure(model, db_path, mode, rounds, *early[mode])})
            except Exception as exc:  # noqa: BLE001 - a mode that fails must not cost the others
                results.append({"mode": mode, "error": str(exc) if model is None else first_line(exc)})
            results[0]["seconds"] = {**start, **results[0].get("seconds", {})}  # the start is the first mode's
            Path(out).write_text(json.dumps(results))


def _wait(conn: Any) -> None:
    """Until the tuning is done (the parent says go); a parent gone ends the process."""
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


def _measure(model: Any, db_path: str, mode: str, rounds: int, inductor: Any, inductor_out: Any,
             inductor_s: float) -> dict:
    """Inductor (`inductor`, compiled ahead) and the tuned kernels in one mode, on the model (a
    `subject.Subject`): warmed up, checked against each other, timed in turns."""
    import torch

    import tritune
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key

    from torch._dynamo.utils import counters

    compile_mode = None if mode == "default" else mode
    cuda_graphs = mode != "default"
    backend = tritune.compiler(db_path, mode=compile_mode, graph_verdicts=False)  # what the graphs run alone
    fns = {"tritune": model.call(torch.compile(model.fn, backend=backend), cuda_graphs)}
    counters.clear()
    watch = Stopwatch()
    watch.add("compile by Inductor alone (ahead)", inductor_s)
    with watch("compile with the tuned kernels"):
        outs = {"tritune": _first_outputs(fns["tritune"])}
    tuned = sum(kind == "tuned" for _, kind in backend.sites)
    result = {"graphs": sorted(set(backend.graphs)), "tuned_sites": tuned, "sites": len(backend.sites),
              "device": device_key(device_info(), "matmul").to_json()}
    if not backend.graphs:
        return {**result, "seconds": watch.snapshot()}  # no tuned site: the graphs reach Inductor untouched
    fns["inductor"], outs["inductor"] = inductor, inductor_out
    error = outputs_rel_error(outs["tritune"], outs["inductor"])
    with watch("timed in turns"):
        times = in_turns({**fns, "eager": model.call(model.fn, False)}, per_call_ms, rounds)
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
