"""Compiled kernels of every op family against a float64 reference on the GPU: every dtype (bf16
included, which the interpreter computes wrongly), awkward shapes, layouts, batch, every epilogue
(general ones with every extra input kind: residual, row and column vectors, constants, a nested
chain), every knob of the contraction template (split-K, TMA loads, persistent loop, warp
specialisation) with them, and the gated dual GEMM with every activation, both ways of feeding its
MMA (FUSE), both weight layouts and biases.

Families other than matmul contribute their examples (`Family.examples()`), each run with a few
seeded random configs of its space. Every library candidate (`Family.libraries`: mm / addmm /
addmm_activation, torch's softmax / layer_norm / conv2d) is checked the same way. The replay route
(`torch.ops.tritune.matmul`, a triton_op that Inductor launches itself) is checked with every knob
of the template compiled by Inductor in its default mode, and with CUDA graphs (reduce-overhead)
without and with split-K. Zoo models (llama, gpt2) are then compiled by the tritune backend with
every site's default config stored as its best, and their outputs checked against float64 (fp16
in the default mode, bf16 with CUDA graphs). `--faults` then checks the fault hook of every family
through the crash-isolated runner: "oob" must come back CRASH, "hang" TIMEOUT, "wrong"
WRONG_ANSWER, and a plain run after each OK.

Usage: python scripts/gpu_correctness.py [--out results.json] [--per-expr 3] [--faults]
       [--cases kernels,libraries,route,frontend] [--ops gated,wide]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter

import numpy as np
import torch

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.device import device_info
from tritune.kernels.epilogue import Binary, BiasAdd, Clamp, Gelu, Input, Relu, Scale, Unary
from tritune.kernels.gated.expr import ACTIVATIONS, Gated
from tritune.kernels.family import REGISTRY, family
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.schedules.space import Limits
from tritune.tuner.builder import Builder
from tritune.tuner.worker.candidate import Timing, match_precision, rel_error
from tritune.tuner.worker.local import Runner
from tritune.tuner.run import device_target

SHAPES = [(1, 1, 4096, 4096), (1, 37, 29, 53), (3, 129, 257, 67), (2, 1000, 1, 300), (1, 3000, 5000, 1000)]
EPILOGUES = [(), (BiasAdd(),), (Scale(0.125),), (Relu(),), (Gelu(),), (Gelu("tanh"),),
             (Scale(0.5), BiasAdd(), Gelu("tanh"))]
# general epilogues: a residual after bias + GELU; row and column scales around silu; x*sigmoid(x)
# as a nested chain, a clamp and a reversed subtraction of a residual; bf16 and fp32 inputs
GENERAL = [(BiasAdd(), Gelu("tanh"), Binary("add", Input("mn", "bf16"))),
           (Binary("mul", Input("m", "fp32")), Unary("silu"), Binary("add", Input("n", "fp16"))),
           (Scale(0.1), Binary("mul", (Unary("sigmoid"),)), Clamp(-1.0, 2.0), Binary("rsub", Input("mn", "fp32")))]
TILE = Config.of(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, UNROLL=1)
SMALL = Config.of(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=4, UNROLL=2)
KNOBS = [dict(SPLIT_K=4), dict(TMA=1), dict(TMA=2, PERSISTENT=1), dict(PERSISTENT=2), dict(TMA=2, SPLIT_K=3),
         dict(TMA=1, PERSISTENT=2), dict(TMA=1, WARP_SPEC=1, num_warps=4),
         dict(TMA=2, PERSISTENT=1, WARP_SPEC=1, num_warps=4)]


def matmul_cases() -> list:
    """Every shape x dtype (layouts rotating), every epilogue x dtype, every knob x epilogue."""
    out = []
    layouts = itertools.cycle(("nn", "tn", "nt", "tt"))
    for (b, m, n, k), dtype in itertools.product(SHAPES, ("fp16", "bf16", "fp32")):
        lay = next(layouts)
        out.append((Matmul(m, n, k, batch=b, dtype=dtype, trans_a=lay[0] == "t", trans_b=lay[1] == "t"), TILE))
    configs = itertools.cycle((TILE, SMALL))
    for epi, dtype in itertools.product(EPILOGUES, ("fp16", "bf16", "fp32")):
        out.append((Matmul(77, 95, 130, batch=2, dtype=dtype, epilogue=epi), next(configs)))
    # 16-byte aligned rows (TMA's condition) with partial edge tiles everywhere
    for knobs, epi, dtype in zip(itertools.cycle(KNOBS), EPILOGUES * 2, ("fp16", "bf16", "fp32") * 5):
        if "WARP_SPEC" in knobs and dtype == "fp32":
            dtype = "bf16"  # Triton cannot specialise a tf32 dot
        lay = next(layouts)
        batch = 1 if "PERSISTENT" in knobs else 2
        expr = Matmul(1000, 520, 1576, batch=batch, dtype=dtype, trans_a=lay[0] == "t", trans_b=lay[1] == "t",
                      epilogue=epi)
        tile = TILE.replace(BLOCK_K=32 if dtype == "fp32" else 64)  # fp32 + TMA store: fit shared memory
        big = "PERSISTENT" in knobs or "WARP_SPEC" in knobs
        out.append((expr, tile.replace(**knobs) if big else SMALL.replace(UNROLL=1, **knobs)))
    return out


def general_cases() -> list:
    """Every general epilogue with every knob of the template (dtypes rotating), batched where the
    knob allows, and the gated dual GEMM: every activation x dtype x FUSE, layouts and biases rotating."""
    out = []
    dtypes = itertools.cycle(("fp16", "bf16", "fp32"))
    for epi, knobs in itertools.product(GENERAL, [{}] + KNOBS):
        dtype = next(dtypes)
        if "WARP_SPEC" in knobs and dtype == "fp32":
            dtype = "bf16"  # Triton cannot specialise a tf32 dot
        big = "PERSISTENT" in knobs or "WARP_SPEC" in knobs
        expr = Matmul(1000, 520, 1576, batch=1 if "PERSISTENT" in knobs else 2, dtype=dtype, epilogue=epi)
        tile = TILE.replace(BLOCK_K=32 if dtype == "fp32" else 64)
        out.append((expr, tile.replace(**knobs) if big else SMALL.replace(UNROLL=1, **knobs)))
    layouts = itertools.cycle((True, False))
    for (act, dtype, fuse), bias in zip(itertools.product(ACTIVATIONS, ("fp16", "bf16", "fp32"), (0, 1)),
                                       itertools.cycle((False, True, True))):
        if fuse and dtype == "fp32":
            continue  # joined fp32 tiles do not compile: the space never offers them
        expr = Gated(1000, 520, 1576, dtype=dtype, activation=act, trans_b=next(layouts), bias=bias)
        tile = TILE.replace(BLOCK_K=32 if dtype == "fp32" else 64, FUSE=fuse, UNROLL=1)
        out.append((expr, tile if bias else SMALL.replace(FUSE=fuse)))
    return out


def family_cases(limits: Limits, per_expr: int) -> list:
    """The examples of every other family, each with seeded random configs of its space."""
    out = []
    for op in REGISTRY:
        if op in ("matmul", "bmm"):
            continue
        fam = family(op)
        for i, expr in enumerate(fam.examples()):
            out += [(expr, c) for c in fam.space(expr, limits).sample(np.random.default_rng(i), per_expr)]
    # the gated kernel's tensor-descriptor loads, which random configs of the examples rarely pick:
    # both weight layouts, 16-bit dtypes, both ways of feeding the MMA, edges of every dimension
    tma = TILE.replace(BLOCK_N=64, UNROLL=1, TMA=1)
    out += [(Gated(1000, 520, 1576, dtype, act, trans_b=t, bias=t), tma.replace(FUSE=f))
            for (dtype, act, t), f in itertools.product((("fp16", "silu", True), ("bf16", "gelu_tanh", False)), (0, 1))]
    return out


def library_cases() -> list:
    """Every library candidate of the epilogue cases and of every other family's examples."""
    exprs = [Matmul(77, 95, 130, batch=b, dtype=d, epilogue=e) for e, d, b in
             itertools.product(EPILOGUES + GENERAL + [(BiasAdd(), Relu())], ("fp16", "bf16", "fp32"), (1, 2))]
    exprs += [e for op in REGISTRY if op not in ("matmul", "bmm") for e in family(op).examples()]
    return [(e, Config.of(library=name)) for e in exprs for name in family(e.op).libraries(e)]


def route_rows() -> list[dict]:
    """The tuned op under torch.compile (Inductor launching the kernel) with every knob, in the
    default mode and with CUDA graphs, against float64."""
    from tritune.kernels.frontend import tuned_op
    from tritune.kernels.frontend.compiler import inductor
    from tritune.kernels.frontend.ops import contraction_expr

    rows = []
    # every knob in the default mode; with CUDA graphs the plain kernel and split-K (its scratch
    # is allocated per call: it must stay inside the graph's pool)
    cases = [(knobs, None) for knobs in [{}] + KNOBS] + [({}, "reduce-overhead"), (KNOBS[0], "reduce-overhead")]
    for i, (knobs, mode) in enumerate(cases):
        gen = torch.Generator(device="cuda").manual_seed(i)
        a, w = (torch.randn(s, generator=gen, device="cuda").half() for s in ((1000, 1576), (520, 1576)))
        bias = torch.randn(520, generator=gen, device="cuda").half()
        expr = contraction_expr(a, w.t(), (BiasAdd(), Gelu("tanh")))
        config = TILE.replace(**knobs) if knobs.get("PERSISTENT") or knobs.get("WARP_SPEC") else \
            SMALL.replace(UNROLL=1, **knobs)
        spec = tuned_op.spec_of(expr, config)
        torch._dynamo.reset()
        # Inductor as the tritune backend configures it (static launches of tuned kernels)
        f = torch.compile(lambda a, w, bias: torch.ops.tritune.matmul(a, w.t(), bias, [], spec) * 2,
                          backend=inductor(mode))
        ref = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double(), approximate="tanh") * 2
        try:
            for _ in range(3):  # CUDA graphs: warm-up, record, replay
                out = f(a, w, bias)
            torch.cuda.synchronize()
            err = rel_error(out, ref)
        except Exception as exc:  # noqa: BLE001 - reported as a failed case
            print(f"FAIL route {knobs} {mode}: {type(exc).__name__}: {str(exc)[:300]}")
            err = float("inf")
        rows.append({"case": f"route {mode or 'default'}", "dtype": "fp16", "config": str(knobs), "rel_error": err,
                     "tolerance": 2e-3, "ok": err <= 2e-3})
    return rows


def frontend_rows(names: tuple[str, ...] = ("llama", "gpt2")) -> list[dict]:
    """Zoo models (one layer, 2x64 tokens, hidden 256) compiled by the tritune backend with every
    extracted site's default config stored as its best (no tuning): each site replayed (matmuls with
    their fused epilogues and residuals, gated pairs, ...) by Inductor, fp16 in the default mode and
    bf16 with CUDA graphs. The output against float64 may be off by at most twice what the
    eager model in the same dtype is, plus 1e-3."""
    import tempfile

    import tritune
    import zoo
    from bench_children import seed_defaults
    from tritune.kernels.frontend.ops import DTYPE_NAMES

    rows = []
    for name, (dtype, mode) in itertools.product(names, ((torch.float16, None), (torch.bfloat16, "reduce-overhead"))):
        torch.manual_seed(0)
        model = getattr(zoo, name)(hidden=256, layers=1).eval().cuda()
        x = torch.randn(2, 64, 256, device="cuda")
        with torch.no_grad():
            ref = model.double()(x.double())
            model, x = model.to(dtype), x.to(dtype)
            eager_err = rel_error(model(x), ref)
        path = tempfile.mkdtemp() + "/t.db"
        seed_defaults(tritune.extract_tasks(model, (x,)), path)
        torch._dynamo.reset()
        backend = tritune.compiler(path, mode=mode)
        try:
            with torch.no_grad():
                for _ in range(3):  # CUDA graphs: warm-up, record, replay
                    out = torch.compile(model, backend=backend, fullgraph=True)(x)
                torch.cuda.synchronize()
            err = rel_error(out, ref)
        except Exception as exc:  # noqa: BLE001 - reported as a failed case
            print(f"FAIL frontend {name} {dtype} {mode}: {type(exc).__name__}: {str(exc)[:300]}")
            err = float("inf")
        kinds = Counter(kind for _, kind in backend.sites)
        tolerance = 2 * eager_err + 1e-3
        rows.append({"case": f"frontend {name} {mode or 'default'}", "dtype": DTYPE_NAMES[str(dtype)],
                     "config": " ".join(f"{k}:{n}" for k, n in sorted(kinds.items())), "rel_error": err,
                     "tolerance": tolerance, "ok": err <= tolerance and kinds.get("tuned", 0) > 0})
    return rows


FAULT_STATUS = {"oob": Status.CRASH, "hang": Status.TIMEOUT, "wrong": Status.WRONG_ANSWER}


def fault_rows() -> list[dict]:
    """The first example of each kind of family with each fault, then without, through the
    crash-isolated runner (bmm and layernorm share matmul's and softmax's family code)."""
    rows = []
    kinds = {type(family(op)): op for op in reversed(REGISTRY)}  # the first op of each family class
    with Runner(Timing(5.0, 20.0), timeout_s=10.0) as runner:
        for op in kinds.values():
            fam = family(op)
            expr = fam.examples()[0]
            config = fam.default_config(expr)
            for fault, want in (*FAULT_STATUS.items(), (None, Status.OK)):
                got = runner.measure(expr, config if fault is None else config.replace(fault=fault))
                rows.append({"case": f"{op} fault={fault}", "dtype": expr.dtype, "config": got.status.value,
                             "rel_error": 0.0 if got.status is want else float("inf"), "tolerance": 0.0,
                             "ok": got.status is want})
        print(f"fault hook: worker restarts {runner.restarts}")
    return rows


def precompile(pairs: list) -> None:
    """Compile every case in parallel first (fills Triton's cache; the checks then load binaries)."""
    builder = Builder(device_target(device_info()))
    futures = [(c, builder.submit(e, family(e.op).canonical_problem(e), [c])[0]) for e, c in pairs]
    failed = [r for r in (builder.result(f, c) for c, f in futures) if r.status is not None]
    builder.close()
    for r in failed:
        print(f"build failed: {r.config} {r.message[:300]}")


def check(expr, config: Config, seed: int) -> dict:
    """Run one case once and compare with float64 (an exception is a failed case, with its message)."""
    fam = family(expr.op)
    x = fam.inputs(expr, seed, "cuda")
    match_precision(expr)
    try:
        out = fam.kernel(expr, config, fam.problem_of(expr, x.args))(*x.args)
        torch.cuda.synchronize()
        err = rel_error(x.out if out is None else out, fam.reference(expr, x.args))
    except Exception as exc:  # noqa: BLE001 - reported as a failure, the other cases still run
        print(f"FAIL {expr.describe()}: {type(exc).__name__}: {str(exc)[:200]}")
        err = float("inf")
    knobs = " ".join(f"{k}={v}" for k, v in config.items() if k not in ("GROUP_M", "num_stages"))
    return {"case": expr.describe(), "dtype": expr.dtype, "config": knobs, "rel_error": err,
            "tolerance": fam.tolerance(expr), "ok": err <= fam.tolerance(expr)}


CASES = ("kernels", "libraries", "route", "frontend")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None)
    parser.add_argument("--per-expr", type=int, default=3)
    parser.add_argument("--faults", action="store_true", help="also check every family's fault hook")
    parser.add_argument("--cases", default=",".join(CASES), help=f"which kinds of case, of {','.join(CASES)}")
    parser.add_argument("--ops", default=None, help="kernel and library cases of these ops only (default: every op)")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    if cases - set(CASES):
        parser.error(f"unknown --cases {','.join(sorted(cases - set(CASES)))}: of {','.join(CASES)}")
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    limits = Limits(props.shared_memory_per_block_optin, props.multi_processor_count)
    pairs = (matmul_cases() + general_cases() + family_cases(limits, args.per_expr) if "kernels" in cases else []) \
        + (library_cases() if "libraries" in cases else [])
    if args.ops:
        pairs = [(e, c) for e, c in pairs if e.op in args.ops.split(",")]
    precompile(pairs)
    rows = []
    for i, (expr, config) in enumerate(pairs):
        rows.append(check(expr, config, i))
        r = rows[-1]
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:44s} err {r['rel_error']:.2e}  {r['config']}", flush=True)
    rows += (route_rows() if "route" in cases else []) + (frontend_rows() if "frontend" in cases else [])
    for r in rows[len(pairs):]:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:44s} err {r['rel_error']:.2e}  {r['config']}", flush=True)
    for op in sorted({r["case"].split()[0] for r in rows}):
        for d in ("fp16", "bf16", "fp32"):
            rs = [r for r in rows if r["case"].split()[0] == op and r["dtype"] == d]
            if rs:
                print(f"{op} {d}: {sum(r['ok'] for r in rs)}/{len(rs)} correct, "
                      f"max rel error {max(r['rel_error'] for r in rs):.2e}")
    faults = fault_rows() if args.faults else []
    for r in faults:
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']:44s} -> {r['config']}")
    if args.out:
        with open(args.out, "w") as fp:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows, "faults": faults}, fp, indent=1)
    failures = sum(not r["ok"] for r in rows + faults)
    print(f"{sum(r['ok'] for r in rows)}/{len(rows)} cases correct"
          + (f"; fault hook {sum(r['ok'] for r in faults)}/{len(faults)} as expected" if faults else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
