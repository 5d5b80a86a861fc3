"""A torch.compile backend that replays the tuning database: `torch.compile(m, backend=tritune.compiler(db))`.

Each contraction of the graph (with the epilogue that fuses after it) whose exact workload has a
record on this device becomes a call to `torch.ops.tritune.matmul`, running the stored best config
from a kernel built at compile time; the rest of the graph, and every contraction without a record,
goes to Inductor (or to another `fallback`). Misses are logged once per workload.
"""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from tritune.kernels.device import device_info
from tritune.kernels.family import device_key
from tritune.kernels.frontend import graph
from tritune.kernels.frontend.extract import first_line
from tritune.records import dispatch

log = logging.getLogger("tritune.compiler")
_logged: set[str] = set()


def compiler(db: Any = None, *, fallback: str | Callable = "inductor") -> "Backend":
    """A torch.compile backend running tuned kernels from `db` (a path or a database; default: the
    active `apply_history_best` context, else the default database), the rest by `fallback`
    ('inductor', 'eager', or a backend callable)."""
    return Backend(db, fallback)


def registered(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """`torch.compile(model, backend="tritune")` (an entry point of the package): `compiler()` with
    the active `apply_history_best` context, else the default database."""
    return compiler()(gm, example_inputs)


def inductor(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """Inductor's default lowering."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, list(example_inputs))


def eager(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """Run the graph as it is (for tests and debugging)."""
    return gm.forward


class Backend:
    """The backend callable; `sites` lists, after each compile, every contraction found and whether
    it runs a tuned kernel ('tuned') or was left to the fallback ('miss')."""

    def __init__(self, db: Any = None, fallback: str | Callable = "inductor") -> None:
        self.fallback = {"inductor": inductor, "eager": eager}.get(fallback, fallback)
        if not callable(self.fallback):
            raise ValueError(f"unknown fallback {fallback!r}: 'inductor', 'eager' or a backend callable")
        # opened now, so that a missing or broken file is reported here and not deep inside torch.compile
        if db is not None and not isinstance(db, dispatch.HistoryBest):
            db = dispatch.HistoryBest(Path(db).expanduser())
        self.db = db
        self.sites: list[tuple[str, str]] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        why = _unsupported(example_inputs)
        if why:
            _log_once(why, f"tritune: {why}; the graph goes to the fallback unchanged")
            return self.fallback(gm, example_inputs)
        from torch._guards import detect_fake_mode

        try:
            aten = graph.aten_graph(gm, example_inputs, detect_fake_mode(example_inputs))
        except Exception as exc:  # an op tracing cannot handle must not break the user's compile
            _log_once(repr(exc), f"tritune: the graph could not be traced ({first_line(exc)}); "
                                 "it goes to the fallback unchanged")
            return self.fallback(gm, example_inputs)
        hits = self._built(self._lookup(graph.find(aten, graph.tf32_allowed()), _device_index(example_inputs)))
        if not hits:
            return self.fallback(gm, example_inputs)
        rewrite(aten, hits)
        return self.fallback(aten, example_inputs)

    def _lookup(self, matches: list[graph.Match], index: int) -> list[tuple[graph.Match, Any]]:
        history, device = self._history(), device_key(device_info(index), "matmul")
        hits, misses = [], Counter()
        for m in matches:
            config = None if history is None else history.best(m.expr.key, device)
            self.sites.append((m.expr.describe(), "miss" if config is None else "tuned"))
            if config is None:
                misses[m.expr.describe()] += 1
            else:
                hits.append((m, config))
        if misses:
            listed = ", ".join(f"{d} (x{n})" if n > 1 else d for d, n in misses.items())
            _log_once(listed, f"tritune: no tuned record on {device.gpu} for {sum(misses.values())} of "
                              f"{len(matches)} contractions, left to the fallback: {listed}")
        return hits

    def _built(self, hits: list[tuple[graph.Match, Any]]) -> list[tuple[graph.Match, str]]:
        """(match, spec) of the hits whose kernel builds (now: compile time pays, not the first call)."""
        from tritune.kernels.frontend import tuned_op

        built = []
        for m, config in hits:
            spec = tuned_op.spec_of(m.expr, config, graph.val(m.a), graph.val(m.b), _bias_val(m))
            try:
                tuned_op.bind(spec)
            except Exception as exc:  # e.g. a binary that no longer builds with this Triton: Inductor runs it
                _log_once(spec, f"tritune: the tuned kernel of {m.expr.describe()} does not build ({first_line(exc)}); "
                                "left to the fallback")
                continue
            built.append((m, spec))
        return built

    def _history(self) -> dispatch.HistoryBest | None:
        from tritune.kernels.frontend.ops import history_of

        return history_of(self.db)


def rewrite(gm: fx.GraphModule, hits: list[tuple[graph.Match, str]]) -> None:
    """Replace each matched contraction and its fused epilogue by one call of the tuned op (its spec)."""
    from tritune.kernels.frontend import tuned_op

    g, replaced = gm.graph, {}
    for m, spec in hits:
        a, b, bias = (replaced.get(n, n) for n in (m.a, m.b, m.bias))
        with g.inserting_before(m.last):
            if bias is not None and graph.val(m.bias).dim() != 1:
                bias = g.call_function(torch.ops.aten.view.default, (bias, [m.expr.n]))
            out = fused = g.call_function(tuned_op.OP, (a, b, bias, spec))
            fused.meta["val"] = graph.val(m.node)
            if graph.val(m.last).shape != graph.val(m.node).shape:
                out = g.call_function(torch.ops.aten.view.default, (fused, list(graph.val(m.last).shape)))
            out.meta["val"] = graph.val(m.last)
        m.last.replace_all_uses_with(out)
        replaced[m.last] = out
    g.eliminate_dead_code()
    g.lint()
    gm.recompile()


def _bias_val(m: graph.Match) -> Any:
    v = graph.val(m.bias)
    return None if v is None else v.reshape(m.expr.n)


def _unsupported(example_inputs: Sequence[Any]) -> str:
    """Why a graph cannot be rewritten ('' when it can)."""
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        return "dynamic shapes are not replayed (compile with dynamic=False)"
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return "tuned kernels have no backward: run under torch.no_grad() or torch.inference_mode() to use them"
    return ""


def _device_index(example_inputs: Sequence[Any]) -> int:
    return next((x.device.index or 0 for x in example_inputs if isinstance(x, torch.Tensor) and x.is_cuda), 0)


def _log_once(key: str, message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        log.warning(message)
