"""The ops a compiled graph calls for tuned sites:

    torch.ops.tritune.matmul(a, b, bias, inputs, spec, norm=None, norm_bias=None)
                                                epilogue(a @ b [+ bias]), `inputs`
                                                the epilogue's extra tensors (expr.inputs order)
    torch.ops.tritune.gated(x, w1, w2, b1, b2, spec, norm=None)     act(x @ w1 [+ b1]) * (x @ w2 [+ b2]),
                                                w1 and w2 the [K, N] operands of the products
    torch.ops.tritune.wide(x, ws, bs, spec, norm=None)              [x @ w_i (+ b_i) for each w_i], the
                                                [K, N_i] operands; bs empty without biases
    torch.ops.tritune.attention(q, k, v, mask, spec)                softmax(scale·q·kᵀ + mask)·v, q [B,H,Lq,D],
                                                k, v [B,H,Lk,D], mask None or broadcast to [B,H,Lq,Lk]

`norm`: the weight [K] of the row norm the site reads its input (a, x) through, where its
expression has one (`tritune.kernels.norm`); the input is then the norm's input. `norm_bias`: a
LayerNorm's bias [K] (a contraction's only).

Each kind of site (a contraction with its epilogue, a gated pair, a wide group, attention) is one
`SiteKind` of `KINDS`: its match, how the graph is rewritten for it, its replay site and its op. A
new fused pattern is one more entry (and its functions), not a branch in the backend.

Each op is a `torch.library.triton_op`: when torch.compile traces it, its body becomes a launch of the
tuned Triton kernel in Inductor's own generated code (Inductor compiles it with its other kernels,
plans its buffers, and launches it without Python per call, under CUDA graphs too); called eagerly
it launches the kernel through Triton's JIT. `spec` (a string, so that Inductor's caches carry it)
names the expression and the config of one call site; its replay site (`sites`) holds the kernel
specialised to the call site and says which operands it takes.

A config with programmatic dependent launch (PDL) needs the launch attribute, which Inductor's
launch of a traced kernel does not set (traced, the site launches its kernel built without PDL).
In graphs replayed from one CUDA graph (the backend's CUDA-graph mode) such sites call the op's
`<op>_graphed` twin instead: an opaque op that launches the tuned kernel itself, with the
attribute. Its host cost is paid once, when the graph is captured.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

import torch
from torch.library import triton_op

from tritune.kernels.attention.expr import Attention
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.device import interpreted
from tritune.kernels.backend import graph, rewrites
from tritune.kernels.backend.norm_match import without_norm
from tritune.kernels.backend.sites import AttentionSite, GatedSite, Site, WideSite, _launch_pdl
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.schedules.config import Config


def spec_of(expr: Matmul | Gated | Wide | Attention, config: Config) -> str:
    """The op's spec for one call site: the expression and the config to run."""
    return json.dumps({"expr": expr.to_dict(), "config": json.loads(config.to_json())}, sort_keys=True,
                      separators=(",", ":"))


@lru_cache(maxsize=None)
def site(spec: str) -> Any:
    """The replay site of a spec (its kernel source generated and loaded once)."""
    data = json.loads(spec)
    # a spec of no kind's op is the contraction's: its from_dict says what the spec is not
    kind = _BY_OP.get(data["expr"].get("op"), CONTRACTION)
    return kind.site(kind.expr.from_dict(data["expr"]), Config.of(data["config"]))


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], inputs: list[torch.Tensor],
           spec: str, norm: Optional[torch.Tensor] = None, norm_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """epilogue(a @ b [+ bias]) by the tuned kernel of `spec` (a fresh contiguous output)."""
    return site(spec)(a, b, bias, inputs, norm, norm_bias)


def gated(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1: Optional[torch.Tensor],
          b2: Optional[torch.Tensor], spec: str, norm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """act(x @ w1 [+ b1]) * (x @ w2 [+ b2]) by the tuned kernel of `spec` (a fresh [M, N] output)."""
    return site(spec)(x, w1, w2, b1, b2, norm)


def wide(x: torch.Tensor, ws: list[torch.Tensor], bs: list[torch.Tensor], spec: str,
         norm: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """[x @ w_i (+ b_i)] by the tuned kernel of `spec` (a fresh [M, N_i] output each)."""
    return site(spec)(x, ws, bs, norm)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
              spec: str, cos_q: Optional[torch.Tensor] = None, sin_q: Optional[torch.Tensor] = None,
              cos_k: Optional[torch.Tensor] = None, sin_k: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(scale·q·kᵀ [+ mask])·v by the tuned kernel of `spec` (a fresh output), q and k
    rotated by their tables first where the spec says so, k and v shared by groups of query heads."""
    return site(spec)(q, k, v, mask, cos_q, sin_q, cos_k, sin_k)


@dataclass(frozen=True)
class SiteKind:
    """One kind of site a compiled graph runs a tuned kernel for, all of it in one record: the
    graph's match of it, the expression its specs hold, the contractions it stands for, how the
    graph is rewritten to call its op, the replay site a spec loads, and the op itself."""

    match: type  # what graph.find returns for it
    expr: type  # its expression; `expr.op` names the op (torch.ops.tritune.<op>) and tags its specs
    members: Callable[[Any], tuple]  # the contractions that are sites of their own where its kernel does not run
    rewrite: Callable[..., None]  # rewrites.<kind>(edit, match, spec, op): one call of the op in the match's place
    site: type  # the replay site of one spec
    body: Callable  # the op's body (typed: torch.library reads the op's schema from it)
    fake: Callable  # its outputs on fake tensors (where the op stays opaque to tracing)

    @property
    def name(self) -> str:
        """The op's qualified name, e.g. 'tritune::matmul'."""
        return f"tritune::{self.expr.op}"

    @property
    def op(self) -> Any:
        """The registered op, as a graph node calls it."""
        return getattr(torch.ops.tritune, self.expr.op).default

    @property
    def graphed_op(self) -> Any:
        """Its opaque twin, which launches PDL configs with their launch attribute (`_graphed`) and
        runs its body when a CUDA graph is captured."""
        return getattr(torch.ops.tritune, f"{self.expr.op}_graphed").default

    def op_for(self, spec: str, captured: bool, early: bool = False) -> Any:
        """The op a graph calls for a site. Where the graph is replayed from one CUDA graph
        (`captured`): the twin for a config that launches early (PDL) where `early` lets it, and for
        a split config (its arrival counters then zeroed once, before the capture, not by a kernel
        in every replay: `sites.counters_from`); else the traced op. A PDL config not let launch
        early stays traced, split or not: the twin would launch it early."""
        config = json.loads(spec)["config"]
        split = config.get("SPLIT_K", 1) > 1 or config.get("SPLIT", 1) > 1
        pdl = bool(config.get("PDL", 0))
        return self.graphed_op if captured and (early if pdl else split) else self.op


def _projections(m: Any) -> tuple:
    """A gated pair's or wide group's own contraction matches."""
    return m.projections


def _unnormed(m: Any) -> tuple:
    """A contraction that took a row norm into its kernel, as the contraction it is without it."""
    return () if m.norm is None else (without_norm(m),)


CONTRACTION = SiteKind(match=graph.Match, expr=Matmul, members=_unnormed, rewrite=rewrites.contraction,
                       site=Site, body=matmul,
                       fake=lambda a, b, bias, inputs, spec, norm=None, norm_bias=None: site(spec).empty_out(a, b))
KINDS = (
    CONTRACTION,
    SiteKind(match=graph.GatedMatch, expr=Gated, members=_projections, rewrite=rewrites.gated,
             site=GatedSite, body=gated,
             fake=lambda x, w1, w2, b1, b2, spec, norm=None: x.new_empty((site(spec).expr.m, site(spec).expr.n))),
    SiteKind(match=graph.WideMatch, expr=Wide, members=_projections, rewrite=rewrites.wide,
             site=WideSite, body=wide, fake=lambda x, ws, bs, spec, norm=None: site(spec).empty_outs(x)),
    SiteKind(match=graph.AttentionMatch, expr=Attention, members=lambda m: (), rewrite=rewrites.attention,
             site=AttentionSite, body=attention, fake=lambda q, k, v, mask, spec, *tables: site(spec).empty_out(q)),
)
_BY_OP = {kind.expr.op: kind for kind in KINDS}
_BY_MATCH = {kind.match: kind for kind in KINDS}


def kind_of(m: Any) -> SiteKind:
    """The kind of a site graph.find returned."""
    return _BY_MATCH[type(m)]


def _graphed(body: Callable) -> Callable:
    """An op body whose sites launch PDL configs with the programmatic-dependence attribute."""
    @functools.wraps(body)  # the same signature: torch.library reads the op's schema from it
    def launch(*args: Any, **kwargs: Any) -> Any:
        token = _launch_pdl.set(True)
        try:
            return body(*args, **kwargs)
        finally:
            _launch_pdl.reset(token)
    return launch


def _opaque(name: str, body: Callable, fake: Callable) -> None:
    torch.library.custom_op(name, body, mutates_args=())
    torch.library.register_fake(name, fake)


def _register(kind: SiteKind) -> None:
    """Define a kind's op (a triton_op, or on the interpreter an opaque custom op) and its opaque
    `_graphed` twin."""
    if interpreted():
        # The interpreter's kernels cannot be traced into Inductor's code (they are not JIT functions):
        # on a CPU the ops stay opaque and run them eagerly, so the rest of the route is testable there.
        _opaque(kind.name, kind.body, kind.fake)
    else:
        triton_op(kind.name, kind.body, mutates_args=())
    _opaque(f"{kind.name}_graphed", _graphed(kind.body), kind.fake)


for _kind in KINDS:
    _register(_kind)
OP, GATED_OP, WIDE_OP, ATTENTION_OP = (kind.op for kind in KINDS)
