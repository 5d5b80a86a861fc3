"""A torch.compile backend that replays the tuning database: `torch.compile(m, backend=tritune.compiler(db))`.

Each contraction of the graph (with the epilogue that fuses after it, extra inputs included) whose
exact workload's best record on this device is a tritune kernel becomes a call to
`torch.ops.tritune.matmul`, each gated pair act(x @ W1ᵀ) * (x @ W2ᵀ) so tuned a call to
`torch.ops.tritune.gated`, and each wide group (projections of one input: q, k, v) one call to
`torch.ops.tritune.wide` returning its outputs: triton_ops that Inductor launches like its own
kernels. A site whose best is the library (cuBLAS measured faster while tuning), every site without
a record, and the rest of the graph go to Inductor (or to another `fallback`), in the `mode` asked
for ("reduce-overhead": CUDA graphs), as does a whole graph whose tensors are not all on CUDA; a
gated pair or wide group whose kernel does not run leaves its contractions to be sites of their
own. Misses are logged once per workload. In the "reduce-overhead" mode with Inductor, a graph with
tuned sites runs Inductor's default lowering replayed from plain CUDA graphs (`graphs`: less
host time per call than Inductor's CUDA-graph trees), unless it writes a non-static input in place.
The mode and options torch.compile passes (`torch.compile(m, backend="tritune", mode=...)`, or
transformers' `CompileConfig`) pick the fallback's, where the backend was not made with its own.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from tritune.errors import first_line
from tritune.kernels.device import device_info, interpreted
from tritune.kernels.family import device_key
from tritune.kernels.backend import access_memo, graph
from tritune.kernels.backend.constants import constants_traceable, fold_constants
from tritune.kernels.backend.cuda_graphs import GraphStep, capturable
from tritune.kernels.backend.outer import outer_products
from tritune.kernels.backend.rewrites import GraphEdit
from tritune.records import dispatch

log = logging.getLogger("tritune.compiler")
_logged: set[str] = set()
Matched = graph.Matched  # a site a compiled graph may run a tuned kernel for (tuned_op.KINDS: each kind's)


def compiler(db: Any = None, *, fallback: str | Callable = "inductor", mode: str | None = None,
             options: dict | None = None, graph_verdicts: bool = True, early_launch: bool = True) -> "Backend":
    """A torch.compile backend running tuned kernels from `db` (a path or a database; default: the
    active `apply_history_best` context, else the default database), the rest by `fallback`
    ('inductor', another torch.compile backend's name such as 'aot_eager' or 'eager', or a backend
    callable); `mode` is Inductor's (torch.compile's `mode`: 'reduce-overhead', 'max-autotune', ...;
    None: the one torch.compile passes, else the default) and `options` Inductor's config patches
    (torch.compile's `options`, merged under these). A graph that `tune-cli tune-model` measured
    slower with the tuned kernels than without them in this mode goes to the fallback whole
    (`graph_verdicts=False`: the sites alone decide). In the CUDA-graph mode, sites tuned to launch
    early (PDL) do so (`early_launch=False`: they launch their kernels built without it, as in the
    default mode). The backend is a value: it survives `copy.deepcopy` and pickling (transformers'
    CompileConfig copies it), each copy opening the database in the process that uses it."""
    return Backend(db, fallback, mode, graph_verdicts, early_launch, options)


def registered(gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
               options: dict | None = None) -> Callable:
    """`torch.compile(model, backend="tritune", mode=..., options=...)` (an entry point of the
    package): `compiler()` with the active `apply_history_best` context, else the default database,
    in the mode and with the options torch.compile passes."""
    return compiler()(gm, example_inputs, mode=mode, options=options)


def inductor(mode: str | None = None, combo: bool = False, early: bool = False, options: dict | None = None) -> Callable:
    """Inductor's lowering in a torch.compile mode (None: the default) with `options` (config
    patches, as torch.compile's `options`), launching tuned kernels as it launches its own; `combo`:
    independent small kernels (a decode step's rotary embeddings of q and k, copies of v) launched
    as one (Inductor's combo kernels), where Inductor has them; `early`: its kernels launch early
    (programmatic dependent launch), where Inductor has it."""
    import torch._inductor.config as config

    patches = dict(options or {})
    if mode not in (None, "default"):
        from torch._inductor import list_mode_options

        patches = {**list_mode_options(mode), **patches}  # raises for an unknown mode, naming the known ones
    if combo and hasattr(config, "combo_kernels"):
        patches = {**patches, "combo_kernels": True}
    if early and hasattr(config.triton, "enable_pdl"):
        patches = {**patches, "triton.enable_pdl": True}
    # Inductor launches user-defined Triton kernels through Triton's Python launcher unless told
    # otherwise: 22.5 us more per launch than its own kernels on an H100 (BENCHMARKS.md: host
    # overhead of a replayed kernel)
    if hasattr(config, "static_launch_user_defined_triton_kernels"):
        patches = {**patches, "static_launch_user_defined_triton_kernels": True}

    def run(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, list(example_inputs), config_patches=patches)
    return run


def _fallback(fallback: str | Callable, mode: str | None, options: dict | None = None) -> Callable:
    if callable(fallback):
        return fallback
    if fallback == "inductor":
        return inductor(mode, options=options)
    if options:
        raise ValueError(f"options are Inductor's config patches; the fallback {fallback!r} takes none")
    from torch._dynamo import lookup_backend

    try:
        return lookup_backend(fallback)
    except Exception:  # noqa: BLE001 - torch raises its own type for an unknown name
        raise ValueError(f"unknown fallback {fallback!r}: 'inductor', a torch.compile backend name "
                         "or a backend callable") from None


class Backend:
    """The backend callable; `sites` lists, after each compile, every contraction found and whether
    it runs a tuned kernel ('tuned'), was left to the fallback because the library measured
    fastest ('library'), because nothing was tuned for it ('miss'), or because its whole graph
    measured faster without tuned kernels ('graph'); `graphs` the signature of each graph that had
    tuned sites (what a graph verdict is stored under)."""

    def __init__(self, db: Any = None, fallback: str | Callable = "inductor", mode: str | None = None,
                 graph_verdicts: bool = True, early_launch: bool = True, options: dict | None = None) -> None:
        self._fallback, self._mode, self._options = fallback, mode, dict(options or {})
        self._lowerings(mode, None)  # an unknown mode or fallback is reported now, not inside torch.compile
        # opened now, so that a missing or broken file is reported here and not deep inside torch.compile
        if db is not None and not isinstance(db, dispatch.HistoryBest):
            db = dispatch.HistoryBest(Path(db).expanduser())
        self.db = db
        # a graph verdict holds for the fallback and mode it was measured with (a callable has no name)
        self.graph_verdicts = graph_verdicts and isinstance(fallback, str)
        self.sites: list[tuple[str, str]] = []
        self.graphs: list[str] = []
        self.early_launch = early_launch

    def _lowerings(self, mode: str | None, options: dict | None) -> tuple[Callable, Callable | None]:
        """The fallback in this mode, and (CUDA-graph mode, Inductor) the lowering of graphs with
        tuned sites: Inductor's default one replayed from one plain CUDA graph each (`cuda_graphs`), not
        through the trees Inductor's reduce-overhead builds; with combo kernels, which took 4-6
        launches and 5.6-7.5 us of GPU time off a decode step (BENCHMARKS.md)."""
        key = (mode, json.dumps(options or {}, sort_keys=True, default=repr))
        built = self.__dict__.setdefault("_built", {})
        if key not in built:
            patches = {**(options or {}), **self._options}
            try:
                fallback = _fallback(self._fallback, mode, patches)
            except (KeyError, RuntimeError) as exc:  # an unknown Inductor mode
                raise ValueError(f"unknown mode {mode!r}: {first_line(exc)}") from None
            plain = inductor(combo=True, options=patches) \
                if self._fallback == "inductor" and mode == "reduce-overhead" else None
            built[key] = fallback, plain
        return built[key]

    @property
    def fallback(self) -> Callable:
        """The fallback in the backend's own mode."""
        return self._lowerings(self._mode, None)[0]

    @property
    def plain(self) -> Callable | None:
        """The CUDA-graph mode's lowering of graphs with tuned sites (None in other modes)."""
        return self._lowerings(self._mode, None)[1]

    def __getstate__(self) -> dict:
        # a copy (transformers' CompileConfig deep-copies its backend) or a pickle holds the
        # database's path and opens it lazily in the process that uses it; lowerings are rebuilt
        state = {k: v for k, v in self.__dict__.items() if k != "_built"}
        if isinstance(self.db, dispatch.HistoryBest):
            state["db"] = self.db.db.path
        return state

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
                 options: dict | None = None) -> Callable:
        """Compile one graph; `mode` and `options` are what torch.compile passes (the backend's own
        mode, where it was given one, wins)."""
        mode = self._mode if self._mode is not None else mode
        fallback, plain = self._lowerings(mode, options)
        why = _unsupported(example_inputs)
        if why:
            _log_once(why, f"tritune: {why}; the graph goes to the fallback unchanged")
            return fallback(gm, example_inputs)
        from torch._guards import detect_fake_mode

        try:
            aten = graph.aten_graph(gm, example_inputs, detect_fake_mode(example_inputs))
        except Exception as exc:  # an op tracing cannot handle must not break the user's compile
            _log_once(repr(exc), f"tritune: the graph could not be traced ({first_line(exc)}); "
                                 "it goes to the fallback unchanged")
            return fallback(gm, example_inputs)
        matches, info = graph.find(aten, graph.tf32_allowed()), device_info(_device_index(example_inputs))
        before = len(self.sites)
        hits = self._lookup(matches, info)
        if not hits:
            return fallback(gm, example_inputs)
        signature = graph_signature(aten, hits)
        self.graphs.append(signature)
        if self._slower_whole(signature, info, len(self.sites) - before, mode):
            return fallback(gm, example_inputs)
        captured = plain is not None and capturable(aten, example_inputs)
        rewrite(aten, hits, captured, self.early_launch)
        _keep_input_facts(gm, aten)
        access_memo.install()  # the lowering analyses each tuned site's kernel: once per kernel and argument kinds
        with constants_traceable(example_inputs):
            if captured:
                return GraphStep(plain(aten, example_inputs), example_inputs)
            return fallback(aten, example_inputs)

    def _lookup(self, matches: list[Matched], info: dict) -> list[tuple[Matched, str]]:
        """(site, spec) of the sites that run a tuned kernel on the GPU `info` describes; every
        site's kind goes into `sites`."""
        history = self._history()
        hits, misses = [], Counter()
        for site in matches:
            for s, kind, config in _resolve(history, site, info):
                self.sites.append((s.expr.describe(), kind))
                if kind == "miss":
                    misses[s.expr.describe()] += 1
                elif kind == "tuned":
                    hits.append((s, self._spec(s, config)))
        if misses:
            listed = ", ".join(f"{d} (x{n})" if n > 1 else d for d, n in misses.items())
            _log_once(listed, f"tritune: no tuned record on {info['gpu']} for {sum(misses.values())} of "
                              f"{len(matches)} contractions, left to the fallback: {listed}")
        return [(m, spec) for m, spec in hits if spec]

    def _slower_whole(self, signature: str, info: dict, sites: int, mode: str | None) -> bool:
        """Whether tune-model measured this graph slower with its tuned kernels than without them in
        `mode` (its `sites` last entries are then marked 'graph')."""
        history = self._history()
        if not self.graph_verdicts or history is None:
            return False
        device, verdicts = device_key(info, "matmul"), dispatch.graph_mode(self._fallback, mode)
        if history.graph_verdict(signature, device, verdicts) != "inductor":
            return False
        _log_once(signature, f"tritune: a graph with {sites} contractions measured faster without tuned kernels "
                             f"(mode {verdicts}, tune-cli tune-model's check); it goes to the fallback unchanged")
        self.sites[-sites:] = [(d, "graph" if k == "tuned" else k) for d, k in self.sites[-sites:]]
        return True

    @staticmethod
    def _spec(m: Matched, config: Any) -> str:
        """The tuned op's spec of a site, '' if its kernel source cannot be generated (logged)."""
        from tritune.kernels.backend import tuned_op

        spec = tuned_op.spec_of(m.expr, config)
        try:
            tuned_op.site(spec)
        except Exception as exc:  # noqa: BLE001 - a record this version cannot run: Inductor runs the site
            _log_once(spec, f"tritune: the tuned kernel of {m.expr.describe()} cannot be loaded "
                            f"({first_line(exc)}); left to the fallback")
            return ""
        return spec

    def _history(self) -> dispatch.HistoryBest | None:
        return dispatch.history_of(self.db)


def _resolve(history: Any, site: Matched, info: dict) -> list[tuple[Matched, str, Any]]:
    """(site, kind, best config) of a site: 'tuned' (a tritune kernel won), 'library' or 'miss';
    where a gated pair's or wide group's kernel does not run, also its contractions that have records."""
    from tritune.kernels.backend import tuned_op  # its import needs a torch that defines triton ops

    def kind(expr: Any) -> tuple[str, Any]:
        config = None if history is None else history.best(expr.key, device_key(info, expr.op))
        return ("miss" if config is None else "library" if config.library is not None else "tuned"), config

    found = [(site, *kind(site.expr))]
    if found[0][1] != "tuned":
        members = [(p, *kind(p.expr)) for p in tuned_op.kind_of(site).members(site)]
        found += [f for f in members if f[1] != "miss"]  # the group's own record covers them
    return found


def rewrite(gm: fx.GraphModule, hits: list[tuple[Matched, str]], captured: bool = False,
            early: bool = False) -> None:
    """Replace each matched site (a contraction and its fused epilogue, a gated pair, or a wide
    group) by one call of its tuned op (its spec), as its kind rewrites it; outer products by
    broadcast multiplies (`outer`); and values computed from no input by constants (`constants`:
    a decoder's causal mask). `captured`: the graph is replayed from one CUDA graph, where split
    sites, and sites that launch early (PDL) where `early` lets them, call their op's opaque twin
    (`tuned_op.SiteKind.op_for`)."""
    from tritune.kernels.backend import tuned_op  # its import needs a torch that defines triton ops

    edit = GraphEdit(gm.graph)
    for m, spec in hits:
        kind = tuned_op.kind_of(m)
        kind.rewrite(edit, m, spec, kind.op_for(spec, captured, early))
    outer_products(gm)
    fold_constants(gm)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def graph_signature(gm: fx.GraphModule, hits: list[tuple[Matched, str]]) -> str:
    """What a graph verdict is keyed by: the ATen graph's ops (how many of each) and the tuned kernel
    of each rewritten site; a changed graph or a re-tuned site is another graph."""
    ops = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    text = json.dumps({"ops": sorted(ops.items()), "tuned": sorted(spec for _, spec in hits)})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _keep_input_facts(traced: fx.GraphModule, aten: fx.GraphModule) -> None:
    """Give the retraced graph what Dynamo told AOT autograd about the original (its compile id,
    its inputs' sources, which of them are parameters): CUDA graphs then keep the weights in place
    instead of copying them into the graph's memory on every call."""
    old, new = traced.graph.find_nodes(op="placeholder"), aten.graph.find_nodes(op="placeholder")
    sources = getattr(traced, "_param_name_to_source", None)
    lifted = [name for name, _ in (*aten.named_parameters(), *aten.named_buffers())]
    if len(old) != len(new) or sources is None or any(name not in sources for name in lifted):
        return  # not a Dynamo graph as AOT autograd expects one: it treats every input as a plain one
    for o, n in zip(old, new):
        n.meta = {**o.meta, **n.meta}
        n._dynamo_source = getattr(o, "_dynamo_source", None)
    aten.meta.update({k: v for k, v in traced.meta.items() if k not in aten.meta})
    aten._param_name_to_source = sources


def _unsupported(example_inputs: Sequence[Any]) -> str:
    """Why a graph cannot be rewritten ('' when it can)."""
    try:
        importlib.import_module("tritune.kernels.backend.tuned_op")  # needs torch.library.triton_op (torch >= 2.6)
    except ImportError as exc:
        return f"this torch cannot define the replay op ({first_line(exc)})"
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return "dynamic shapes are not replayed (compile with dynamic=False)"
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if not interpreted() and not (tensors and all(x.is_cuda for x in tensors)):
        where = ", ".join(sorted({str(x.device) for x in tensors})) or "no tensor"
        return f"tuned kernels run on CUDA tensors, and this graph's are on {where}"
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return "tuned kernels have no backward: run under torch.no_grad() or torch.inference_mode() to use them"
    return ""


def _device_index(example_inputs: Sequence[Any]) -> int:
    return next((x.device.index or 0 for x in example_inputs if isinstance(x, torch.Tensor) and x.is_cuda), 0)


def _log_once(key: str, message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        log.warning(message)
