"""Where a decode step's wall time goes under CUDA graphs: the host's cost of torch's CUDA-graph
trees (Inductor `reduce-overhead`) against a plain CUDA graph replayed around Inductor's default
lowering (the backend's CUDA-graph mode, `GraphStep`: inputs copied in, outputs handed out where
the graph wrote them; the same with each step's output kept until the next step has run, as
`y = model(x)` in a loop keeps it, with its second graph and without (held outputs poisoned and
fresh ones built at every step); and with each output cloned, as `GraphStep` once did), and
against the floor (a graph of the whole model call replayed by hand, no torch.compile on the way);
and the step with Dynamo checking only the guards that tell its compiled entries apart.
Each zoo model's decode step, all variants in one process, timed in turns (mean per step of steps
back to back); then each variant's GPU time per step (the profiler's).

    python -m scripts.probes.graph_replay_probe --models gpt2,llama --batch 16 [--hidden 256]

With a narrow model (--hidden 256) the GPU is never the limit: the times are the host's.
`--parts` also times the parts of a `GraphStep` call on their own (µs per call, host-bound).
"""
from __future__ import annotations

import argparse
import statistics


def plain_graph(fn, inputs):
    """fn(*inputs) captured once in a CUDA graph; each call copies `inputs`' values in, replays and
    clones the outputs."""
    import torch

    static = [x.clone() for x in inputs]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)

    def call(*args):
        for s, a in zip(static, args):
            s.copy_(a)
        graph.replay()
        return out.clone()
    return call


STEPS: list = []  # the GraphSteps lean_backend made


def lean_backend(gm, example_inputs):
    """Inductor's default lowering replayed from one plain CUDA graph, as the backend's CUDA-graph
    mode replays it (`GraphStep`)."""
    from torch._inductor.compile_fx import compile_fx

    from tritune.kernels.frontend.graphs import GraphStep

    STEPS.append(GraphStep(compile_fx(gm, list(example_inputs)), example_inputs))
    return STEPS[-1]


def one_set_backend(gm, example_inputs):
    """`lean_backend` whose graphs never take a second set of outputs: outputs still held at the
    next call raise there, and fresh ones are built (the CUDA-graph trees' contract)."""
    step = lean_backend(gm, example_inputs)
    step.second_set_max_bytes = -1
    return step


def guards_skipped(fn):
    """`fn` under torch's stance that checks only the guards telling a code object's compiled
    entries apart (`skip_guard_eval_unsafe`: the caller vouches that nothing else guarded changes),
    as a serving loop past its warm-up may run; None where this torch has no such stance."""
    import inspect

    import torch

    if "skip_guard_eval_unsafe" not in inspect.signature(torch.compiler.set_stance).parameters:
        return None

    def call():
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            return fn()
    return call


def parts(compiled, x) -> str:
    """µs per call (best of 5 runs of ~0.1 s of calls back to back) of the compiled call, the
    GraphStep inside it, and its parts: the weights' address check, the inputs' copies, the
    replay, the outputs' handout."""
    from tritune.tuner.timing import per_call_ms

    step = STEPS[-1]
    capture = step.last
    graph, handout = capture.sets[-1]  # the handout's retire is timed as a held set's replay pays it
    args = list(capture.inputs)

    def best(fn) -> float:
        return min(per_call_ms(fn, 0.1) for _ in range(5)) * 1e3
    timed = {"compiled call": lambda: compiled(x), "GraphStep": lambda: step(*args),
             "address check": lambda: step._find(args),
             "input copies": lambda: [capture.inputs[i].copy_(args[i]) for i in step.copied],
             "replay": graph.replay, "handout": lambda: (handout.retire(), handout.outputs())}
    return ", ".join(f"{k} {best(fn):.1f}" for k, fn in timed.items()) + f" ({len(step.static)} static inputs)"


def main() -> None:
    import torch

    from tritune.tuner.model import zoo
    from tritune.tuner.timing import gpu_ms_per_call, in_turns, per_call_ms, step_caller

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--hidden", type=int, default=None, help="a narrower model: the host's cost alone")
    p.add_argument("--parts", action="store_true", help="also time the parts of a GraphStep call")
    args = p.parse_args()
    for name in args.models.split(","):
        torch._dynamo.reset()
        factory = getattr(zoo, name)
        model = (factory(hidden=args.hidden) if args.hidden else factory()).cuda().half().eval()
        hidden = model.model.config.hidden_size
        x = torch.randn(args.batch, 1, hidden, device="cuda", dtype=torch.half)
        with torch.no_grad():
            ro = torch.compile(model, mode="reduce-overhead")
            default = torch.compile(model)
            lean = torch.compile(model, backend=lean_backend)
            one_set = torch.compile(model, backend=one_set_backend)
            for f in (ro, default, one_set, lean):
                for _ in range(4):
                    step_caller(f, (x,), f is ro)()
            floor = plain_graph(default, (x,))
            # the kept variants begin a step first, as reduce-overhead's caller does: once a process
            # has marked a step, steps are what its marks say (Inductor's trees count them so too)
            lean_kept, one_kept = step_caller(lean, (x,), True), step_caller(one_set, (x,), True)
            kept, kept_one = [lean_kept()], [one_kept()]  # the last step's output, held while the next step runs
            reserved = torch.cuda.memory_reserved()
            kept.append(lean_kept())  # the first held output: the second graph is captured
            kept.pop(0)
            print(f"{name}: the second graph took {(torch.cuda.memory_reserved() - reserved) / 2**20:.1f} MiB "
                  f"(the process holds {torch.cuda.memory_reserved() / 2**20:.0f} MiB)", flush=True)
            fns = {"reduce-overhead": step_caller(ro, (x,), True), "default": lambda: default(x),
                   "lean graph": lambda: lean(x), "lean graph, kept": lambda: kept.append(lean_kept()) or kept.pop(0),
                   "lean graph, kept, one set": lambda: kept_one.append(one_kept()) or kept_one.pop(0),
                   "lean graph, cloned": lambda: lean(x).clone(),
                   "hand graph": lambda: floor(x),
                   "reduce-overhead, guards skipped": guards_skipped(step_caller(ro, (x,), True)),
                   "lean graph, guards skipped": guards_skipped(lambda: lean(x))}
            fns = {k: fn for k, fn in fns.items() if fn is not None}
            ref = default(x).float()
            for key in ("lean graph", "hand graph"):
                err = (fns[key]().float() - ref).abs().max().item()
                print(f"{name}: {key} max |diff| vs default {err:.3g}")
            times = in_turns(fns, per_call_ms, args.rounds)
            gpu = {k: gpu_ms_per_call(fn) for k, fn in fns.items()}
        print(f"{name} decode {args.batch}: " + ", ".join(
            f"{k} {statistics.median(v) * 1e3:.1f} us (GPU {gpu[k] * 1e3:.1f})" for k, v in times.items()), flush=True)
        if args.parts:
            with torch.no_grad():
                print(f"{name} decode {args.batch}, µs per call: {parts(lean, x)}", flush=True)


if __name__ == "__main__":
    main()
