"""The subprocesses of scripts/bench/model_bench.py (its hidden --child mode): one model and shape each
(--models and --shapes name one), built, compiled and measured; each writes its JSON to --child-json.

- compile: one variant from empty caches: seconds from torch.compile to the end of the first call;
- latency: every variant, timed in turns with eager, --rounds rounds;
- overhead: µs per call of a 64x64x64 matmul, replayed by tritune and as Inductor's Triton template;
- profile: every variant under torch's profiler: kernels and GPU µs per call, the costliest kernels;
  the bytes of the weights one step reads (`zoo.weight_bytes`) and the device's copy bandwidth.

Besides torch.compile's modes and tritune's backend, diagnostics: "route" and "route-ro" take
tritune's path into Inductor (the graph retraced to ATen, Dynamo's input facts kept) with nothing
replaced, i.e. what the route itself costs; "sites" and "sites-ro" replay every tuned site without
reading graph verdicts (what tune-model's whole-model check measures); "reduce-overhead-early" is
Inductor's reduce-overhead with its kernels launched early (`triton.enable_pdl`, where it exists).
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from collections import Counter
from functools import partial
from pathlib import Path

from tritune.errors import first_line
from tritune.tuner.model import zoo
from tritune.tuner.model.check import outputs_rel_error
from tritune.tuner.model.load import build
from tritune.tuner.timing import busy_time, gpu_spans, in_turns, per_call_ms, step_caller

SHAPES = {"prefill": (1, 2048), "decode": (16, 1), "decode1": (1, 1)}  # (batch, tokens)
VARIANTS = ("default", "max-autotune", "reduce-overhead", "tritune", "tritune-ro", "route", "route-ro", "sites", "sites-ro",
            "reduce-overhead-early")
CUDA_GRAPHS = ("reduce-overhead", "tritune-ro", "route-ro", "sites-ro", "reduce-overhead-early")
# overhead: each round times ~0.15 s of calls back to back (about 2000 calls of a compiled 64x64x64
# matmul, ~70 µs each on an H100)
OVERHEAD_BUDGET_S, OVERHEAD_ROUNDS = 0.15, 15


def is_decode(shape: str) -> bool:
    """Whether a shape of SHAPES is a decode step (one token per sequence)."""
    return SHAPES[shape][1] == 1


def hidden_of(args: argparse.Namespace, model: str) -> int:
    """--hidden, else the zoo factory's default."""
    return args.hidden or inspect.signature(getattr(zoo, model)).parameters["hidden"].default


def model_and_input(args: argparse.Namespace) -> tuple:
    """The zoo model (seeded random weights, eval, in --dtype on --device) and its seeded input."""
    model, (batch, tokens) = args.models[0], SHAPES[args.shapes[0]]
    factory = partial(getattr(zoo, model), **({"hidden": args.hidden} if args.hidden else {}))
    net, (x,) = build(factory, [(batch, tokens, hidden_of(args, model))], args.dtype, args.device, weights="random")
    return net, x


def compile_variant(model, variant: str, db: str) -> tuple:
    """The compiled model, and the tritune backend (whose `sites` the first call fills) or None."""
    import torch

    if variant == "reduce-overhead-early":
        from tritune.kernels.backend.compiler import inductor

        return torch.compile(model, backend=inductor("reduce-overhead", early=True), fullgraph=True), None
    if variant.startswith("route"):
        return torch.compile(model, backend=route_only("reduce-overhead" if variant == "route-ro" else None),
                             fullgraph=True), None
    if not variant.startswith(("tritune", "sites")):
        return torch.compile(model, mode=None if variant == "default" else variant, fullgraph=True), None
    import tritune

    # "sites": what the tuned sites alone decide, graph verdicts not read (what tune-model's check measures)
    backend = tritune.compiler(db, mode="reduce-overhead" if variant.endswith("-ro") else None,
                               graph_verdicts=variant.startswith("tritune"))
    return torch.compile(model, backend=backend, fullgraph=True), backend


def route_only(mode):
    """A backend taking tritune's route into Inductor and replacing nothing."""
    from torch._guards import detect_fake_mode

    from tritune.kernels.backend import compiler, graph

    inner = compiler.inductor(mode)

    def backend(gm, example_inputs):
        aten = graph.aten_graph(gm, example_inputs, detect_fake_mode(example_inputs))
        compiler._keep_input_facts(gm, aten)
        return inner(aten, example_inputs)
    return backend


def caller(compiled, x, variant: str):
    """The call to time (a CUDA-graph variant starts a new step first)."""
    return step_caller(compiled, (x,), variant in CUDA_GRAPHS)


def seed_defaults(tasks: list, db: str) -> None:
    """Each task's workload stored with its family's default config as its one trial: a database
    that replays every site without a tuning run (checks of the replay, not measurements)."""
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key, family
    from tritune.records.database import Database
    from tritune.records.result import MeasureResult, Status

    with Database(db) as d:
        for t in tasks:
            d.add_workload(t.expr.key, t.expr.op, t.expr.dtype, t.expr.to_json())
            config = family(t.expr.op).default_config(t.expr)
            d.save(t.expr.key, device_key(device_info(), t.expr.op), [MeasureResult(config, Status.OK, *[1.0] * 4)])


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def child_compile(args: argparse.Namespace) -> dict:
    """One variant from empty caches: seconds from torch.compile to the end of the first call."""
    variant = args.variants[0]
    model, x = model_and_input(args)
    ref = model(x)
    sync(args.device)
    start = time.perf_counter()
    compiled, backend = compile_variant(model, variant, args.db)
    y = caller(compiled, x, variant)()
    sync(args.device)
    return {"compile_s": time.perf_counter() - start, "rel_err": outputs_rel_error(y, ref),
            "sites": backend.sites if backend else None}


def child_latency(args: argparse.Namespace) -> dict:
    """Every variant compiled here, then timed in turns with eager, round after round (drift hits
    all alike); the JSON is rewritten after each round, for a parent that times this out."""
    model, x = model_and_input(args)
    ref = model(x)
    fns, result = {"eager": lambda: model(x)}, {"variants": {}, "rounds": 0}
    for variant in args.variants:
        try:
            compiled, backend = compile_variant(model, variant, args.db)
            fns[variant] = caller(compiled, x, variant)
            for _ in range(3):  # CUDA-graph trees warm up, then record: the error is a replay's
                y = fns[variant]()
            result["variants"][variant] = {"rel_err": outputs_rel_error(y, ref),
                                           "sites": backend.sites if backend else None}
        except Exception as exc:  # noqa: BLE001 - one variant that fails must not cost the others
            fns.pop(variant, None)
            result["variants"][variant] = {"error": first_line(exc)}
    def record(times: dict[str, list[float]]) -> None:
        result["rounds"] = len(times["eager"])
        result["eager_ms"], result["eager_rounds_ms"] = statistics.median(times["eager"]), times["eager"]
        for name in fns.keys() - {"eager"}:
            result["variants"][name].update(latency_ms=statistics.median(times[name]), rounds_ms=times[name])
        Path(args.child_json).write_text(json.dumps(result, indent=2))
    in_turns(fns, per_call_ms, args.rounds, record)  # each round: ~10 ms of calls back to back
    return result


def child_overhead(args: argparse.Namespace) -> dict:
    """µs per call of a @ w (64x64 fp16): tritune replaying a tuned record, Inductor launching its
    own Triton mm template (max-autotune with Triton the only GEMM backend), and Inductor's default
    (an extern cuBLAS call); the generated code of each."""
    import torch
    from torch._inductor import list_mode_options

    import tritune

    a, w = (torch.randn(64, 64, dtype=torch.float16, device=args.device) for _ in range(2))
    backend = tritune.compiler(str(tuned_db(a, w, Path(args.out) / "overhead.db")))

    def ours(a, w):  # two functions, two code objects: neither's calls check the other's guards
        return a @ w

    def theirs(a, w):
        return a @ w

    def library(a, w):  # Inductor's default: an extern cuBLAS call, what a decode model's sites run
        return a @ w

    # torch.compile takes a mode or options, not both: the mode's options, and Triton the only GEMM backend
    options = {**list_mode_options("max-autotune-no-cudagraphs"), "max_autotune_gemm_backends": "TRITON"}
    result: dict = {"inductor_options": options}
    # each side's code must show its kernel: ours (traced into Inductor's code, or our op where it
    # stays opaque), Inductor's template (triton_tem_*, not an ATen extern mm)
    sides = {"tritune": (ours, {"backend": backend}, ("tritune_matmul", "torch.ops.tritune")),
             "inductor": (theirs, {"options": options}, ("triton_tem_",)),
             "extern": (library, {}, ("extern_kernels.mm",))}
    fns = {}
    for name, (fn, how, markers) in sides.items():
        try:
            fns[name] = torch.compile(fn, fullgraph=True, **how)
            y, code = first_call_code(fns[name], a, w)
        except Exception as exc:  # noqa: BLE001 - e.g. an option this torch does not know: time the other side alone
            result[f"{name}_error"] = first_line(exc)
            fns.pop(name, None)
            continue
        result.update({f"{name}_rel_err": outputs_rel_error(y, a @ w),
                       f"{name}_as_intended": any(m in c for m in markers for c in code),
                       f"{name}_code": code[-1][-4000:] if code else ""})
    result["sites"] = backend.sites
    times = in_turns({name: partial(fn, a, w) for name, fn in fns.items()},
                     lambda call: 1e3 * per_call_ms(call, OVERHEAD_BUDGET_S), OVERHEAD_ROUNDS)
    result.update({f"{name}_us": statistics.median(t) for name, t in times.items()})
    if {"tritune", "inductor"} <= fns.keys():
        result["overhead_us"] = result["tritune_us"] - result["inductor_us"]
    return result


def first_call_code(fn, *inputs) -> tuple:
    """The first call's output and the code Inductor wrote for it (torch's run_and_get_code would
    reset dynamo, and with it the other compiled function)."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    code: list[str] = []
    with mock.patch.object(GraphLowering, "save_output_code", code.append):
        return fn(*inputs), code


def tuned_db(a, w, path: Path) -> Path:
    """A database with one tuned record (the default config) for a @ w on this GPU."""
    from tritune.kernels.contraction.launch import DEFAULT
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key
    from tritune.kernels.backend.helpers import contraction_expr
    from tritune.records.database import Database
    from tritune.records.result import MeasureResult, Status

    expr = contraction_expr(a, w, ())
    with Database(path) as db:
        db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
        db.save(expr.key, device_key(device_info(), "matmul"), [MeasureResult(DEFAULT, Status.OK, 1.0, 1.0, 1.0, 1.0)])
    return path


def kernel_profile(fn, calls: int, top: int) -> dict:
    """GPU µs and kernels per call of `fn` over `calls` calls under torch's profiler
    (`timing.gpu_spans`): the sum of kernel times (`gpu_us`) and the GPU's busy time (`busy_us`:
    kernels that overlap, as early launches do, counted once); its `top` costliest kernels (name,
    µs per call, launches per call)."""
    spans = gpu_spans(fn, calls)
    totals, counts = Counter(), Counter()
    for start, end, name in spans:
        totals[name] += end - start
        counts[name] += 1
    return {"gpu_us": sum(totals.values()) / calls, "busy_us": busy_time([(s, e) for s, e, _ in spans]) / calls,
            "launches": len(spans) / calls,
            "top": [(name[:90], us / calls, counts[name] / calls) for name, us in totals.most_common(top)]}


def child_profile(args: argparse.Namespace, calls: int = 20, top: int = 8) -> dict:
    """Each variant after warm-up, `calls` calls under torch's profiler (`kernel_profile`); the
    weights one step reads and the device's copy bandwidth (the decode floor is their ratio)."""
    import torch

    from tritune.tuner.timing import copy_bandwidth_gbps

    model, x = model_and_input(args)
    result: dict = {"weight_bytes": zoo.weight_bytes(model), "copy_gbps": None}
    if args.device.startswith("cuda"):
        result["copy_gbps"] = copy_bandwidth_gbps()
        torch.cuda.empty_cache()  # the copy's 2 GiB back to the device, before CUDA graphs take their pools
    for variant in args.variants:
        try:
            compiled, _ = compile_variant(model, variant, args.db)
            fn = caller(compiled, x, variant)
            for _ in range(5):
                fn()
            sync(args.device)
            result[variant] = kernel_profile(fn, calls, top)
        except Exception as exc:  # noqa: BLE001 - one variant that fails must not cost the others
            result[variant] = {"error": first_line(exc)}
    return result


def run(args: argparse.Namespace) -> None:
    """model_bench's --child mode: one job under no_grad, its JSON written."""
    import torch

    with torch.no_grad():
        result = {"compile": child_compile, "latency": child_latency, "overhead": child_overhead,
                  "profile": child_profile}[args.child](args)
    Path(args.child_json).write_text(json.dumps(result, indent=2))
