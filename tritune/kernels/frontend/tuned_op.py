"""The ops a compiled graph calls for tuned sites:

    torch.ops.tritune.matmul(a, b, bias, inputs, spec, norm=None)   epilogue(a @ b [+ bias]), `inputs`
                                                the epilogue's extra tensors (expr.inputs order)
    torch.ops.tritune.gated(x, w1, w2, b1, b2, spec, norm=None)     act(x @ w1 [+ b1]) * (x @ w2 [+ b2]),
                                                w1 and w2 the [K, N] operands of the products
    torch.ops.tritune.wide(x, ws, bs, spec, norm=None)              [x @ w_i (+ b_i) for each w_i], the
                                                [K, N_i] operands; bs empty without biases
    torch.ops.tritune.attention(q, k, v, mask, spec)                softmax(scale·q·kᵀ + mask)·v, q [B,H,Lq,D],
                                                k, v [B,H,Lk,D], mask None or broadcast to [B,H,Lq,Lk]

`norm`: the weight [K] of the RMSNorm the site reads its input (a, x) through, where its
expression has one (`tritune.kernels.norm`); the input is then the norm's input.

Each kind of site (a contraction with its epilogue, a gated pair, a wide group, attention) is one
`SiteKind` of `KINDS`: its match, how the graph is rewritten for it, its replay site and its op. A
new fused pattern is one more entry (and its functions), not a branch in the backend.

Each op is a `torch.library.triton_op`: when torch.compile traces it, its body becomes a launch of the
tuned Triton kernel in Inductor's own generated code (Inductor compiles it with its other kernels,
plans its buffers, and launches it without Python per call, under CUDA graphs too); called eagerly
it launches the kernel through Triton's JIT. `spec` (a string, so that Inductor's caches carry it)
names the expression and the config of one call site. The kernel source is specialised to the
site's sizes and strides (constexprs): a compiled model launches it with pointers alone, as
Inductor launches its own templates (each int argument is host time on every call).

Operands whose layout or dtypes are not the ones tuned run the expression as torch ops instead:
correct, and visible to Inductor like any other op.

A config with programmatic dependent launch (PDL) needs the launch attribute, which Inductor's
launch of a traced kernel does not set: traced, the site launches its kernel built without PDL
(whose weight prefetch, an inline-asm instruction on the weight's pointer, would also make
Inductor copy the weight on every call, taking it for an output). In graphs replayed from one
CUDA graph (the backend's CUDA-graph mode) such sites call the op's `<op>_graphed` twin instead:
an opaque op that launches the tuned kernel itself, with the attribute. Its host cost is paid
once, when the graph is captured.
"""
from __future__ import annotations

import functools
import json
import logging
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, ClassVar, Optional

import torch
from torch.library import triton_op, wrap_triton

from tritune.kernels.attention import launch as attention_launch
from tritune.kernels.attention.expr import Attention
from tritune.kernels.attention.family import sdpa
from tritune.kernels.codegen import use_torch_scratch
from tritune.kernels.contraction import launch
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.contraction.family import MATMUL
from tritune.kernels.device import current_sms, interpreted
from tritune.kernels.frontend import attention_match, graph, rewrites
from tritune.kernels.frontend.helpers import DTYPE_NAMES, input_problem, layout_of
from tritune.kernels.frontend.norm_match import without_norm
from tritune.kernels.gated import launch as gated_launch
from tritune.kernels.gated.expr import Gated
from tritune.kernels.gated.family import GATED
from tritune.kernels.wide import launch as wide_launch
from tritune.kernels.wide.expr import Wide
from tritune.kernels.wide.family import products
from tritune.schedules.config import Config

log = logging.getLogger("tritune.compiler")
_misfits: set[Any] = set()
# set while a `_graphed` op runs: its sites launch with the programmatic-dependence attribute
_launch_pdl: ContextVar[bool] = ContextVar("tritune_launch_pdl", default=False)


def spec_of(expr: Matmul | Gated | Wide | Attention, config: Config) -> str:
    """The op's spec for one call site: the expression and the config to run."""
    return json.dumps({"expr": expr.to_dict(), "config": json.loads(config.to_json())}, sort_keys=True,
                      separators=(",", ":"))


def _misfit(site: Any) -> None:
    """Log once per site (at trace time, not per call) that it runs as torch ops."""
    if site not in _misfits:
        _misfits.add(site)
        log.warning("tritune: %s was tuned for other operand layouts, dtypes or alignment than this call's: it "
                    "runs as torch ops", site.expr.describe())


def aligned(*tensors: Any) -> bool:
    """Whether every tensor (None aside) starts 16 bytes into its storage's (16-byte aligned)
    allocation: what the kernel was tuned and compiled for. A view that starts elsewhere makes
    Inductor compile the kernel without alignment hints, which Triton's sm_90 pipeline rejects for
    some configs (a fatal LLVM error), and would run slower anyway."""
    return all(t is None or t.storage_offset() * t.element_size() % 16 == 0 for t in tensors)


def _consts(module: Any, expr: Any, config: Config) -> dict[str, Any]:
    return {**module.constexprs(expr, config), "num_warps": config["num_warps"], "num_stages": config["num_stages"]}


def _launch_options(config: Config) -> dict[str, Any]:
    """What a PDL config's launch changes: the launch attribute where the launch is this package's
    own (`_graphed`), else (Inductor's launch, without it) the kernel built without PDL."""
    if not config.get("PDL", 0):
        return {}
    return {"launch_pdl": True} if _launch_pdl.get() else {"PDL": 0, "PDL_K": 0}


class Site:
    """One contraction call site: its kernel function, grid and compile-time parameters."""

    def __init__(self, expr: Matmul, config: Config) -> None:
        self.expr, self.config = expr, config
        self.fn = launch.template.load(expr, specialize=True)
        self.int_names = (*launch.INT_NAMES, *launch.template.input_int_names(expr))
        self.grid = launch.grid(expr, config, current_sms() if config.get("PERSISTENT", 0) else 0)
        self.consts = _consts(launch, expr, config)
        # split-K's fp32 partial tiles and arrival counters
        self.slots = launch.tiles(expr, config) * expr.batch
        self.ws = self.slots * config.get("SPLIT_K", 1) * config["BLOCK_M"] * config["BLOCK_N"]

    def fits(self, a: Any, b: Any, out: Any, bias: Any, inputs: list, norm: Any = None) -> bool:
        """Whether the operands have the layout the kernel was tuned for (and, for tensor-descriptor
        loads, the strides those need), start aligned (`aligned`), and the extra inputs the
        epilogue's kinds and dtypes (and the norm weight the norm's)."""
        expr, tma = self.expr, self.config.get("TMA", 0)
        if layout_of(a) is not expr.trans_a or layout_of(b) is not expr.trans_b or not aligned(a, b, bias, *inputs):
            return False
        if input_problem(expr, inputs, out.shape) or not norm_fits(expr, norm):
            return False
        problem = launch.Problem(expr.batch, launch.ints_of(expr, a, b, out, bias, *_trailing(inputs, norm)),
                                 (True,) * 4)
        return not tma or launch.tma_unfit(expr, problem, store=tma == 2) is None

    def empty_out(self, a: Any, b: Any) -> Any:
        """A fresh contiguous output for the operands (2-D, or 3-D if either is)."""
        expr = self.expr
        return a.new_empty((expr.batch, expr.m, expr.n) if 3 in (a.dim(), b.dim()) else (expr.m, expr.n))

    def __call__(self, a: Any, b: Any, bias: Any, inputs: list, norm: Any = None) -> Any:
        expr, out = self.expr, self.empty_out(a, b)
        if not self.fits(a, b, out, bias, inputs, norm):
            _misfit(self)
            return MATMUL.expression(expr)(a, b, out, bias, *_trailing(inputs, norm))
        inputs = _trailing(inputs, norm)  # the kernel takes the norm weight after the epilogue's inputs
        # split-K's scratch and the bias: what the kernel never touches is None, which Triton
        # specialises away (no allocation, no zeroing launch, no pointer to pass: each is host time
        # on every call of a compiled model)
        ws = locks = None
        if self.config.get("SPLIT_K", 1) > 1:
            ws, locks = a.new_empty(self.ws, dtype=torch.float32), a.new_zeros(self.slots, dtype=torch.int32)
        if self.config.get("TMA", 0):
            use_torch_scratch()
        ints = dict(zip(self.int_names, launch.ints_of(expr, a, b, out, bias, *inputs)))
        wrap_triton(self.fn)[self.grid](a, b, out, bias if expr.has_bias else None, ws, locks, *inputs, **ints,
                                        **{**self.consts, **_launch_options(self.config)})
        return out


class _OneKernel:
    """A call site of a family whose launch module (`launch`) has one kernel per expression: its
    source specialised to the site, its grid and compile-time parameters."""

    launch: ClassVar[Any]

    def __init__(self, expr: Any, config: Config) -> None:
        self.expr, self.config = expr, config
        self.fn = self.launch.template.load(expr, specialize=True)
        self.grid = self.launch.grid(expr, config)
        self.consts = _consts(self.launch, expr, config)

    def takes(self, x: Any) -> bool:
        """Whether the input every weight multiplies is row-major in the tuned dtype."""
        return layout_of(x) is False and DTYPE_NAMES.get(str(x.dtype)) == self.expr.dtype

    def descriptors_fit(self, problem: Any) -> bool:
        """Whether tensor-descriptor loads, if the config uses them, can read the operands."""
        return not self.config.get("TMA", 0) or self.launch.tma_unfit(self.expr, problem) is None

    def scratch(self, like: Any, knob: str = "SPLIT_K") -> tuple[Any, Any]:
        """The launch module's scratch for a config split by `knob`; None each unsplit (specialised
        away: no allocation, no zeroing launch)."""
        return self.launch.scratch(self.expr, self.config, like) if self.config.get(knob, 1) > 1 else (None, None)

    def run(self, *args: Any, **ints: Any) -> None:
        """Launch the site's kernel (Inductor traces this into a launch of its own)."""
        if self.config.get("TMA", 0):
            use_torch_scratch()
        wrap_triton(self.fn)[self.grid](*args, **ints, **{**self.consts, **_launch_options(self.config)})


class GatedSite(_OneKernel):
    """One gated call site."""

    launch = gated_launch

    def __call__(self, x: Any, w1: Any, w2: Any, b1: Any, b2: Any, norm: Any = None) -> Any:
        expr = self.expr
        out = x.new_empty((expr.m, expr.n))
        # the kernel takes the weights as stored ([N, K] for nn.Linear's), the graph their [K, N] views
        w1, w2 = (w1.t(), w2.t()) if expr.trans_b else (w1, w2)
        if not self.fits(x, w1, w2, out, b1, b2) or not norm_fits(expr, norm):
            _misfit(self)
            return GATED.expression(expr)(x, w1, w2, out, b1, b2, *_trailing((), norm))
        ints = dict(zip(gated_launch.INTS, gated_launch.ints_of(expr, x, w1, w2, out, b1, b2)))
        self.run(x, w1, w2, out, b1 if expr.bias else None, b2 if expr.bias else None, *_trailing((), norm),
                 *self.scratch(x), **ints)
        return out

    def fits(self, x: Any, w1: Any, w2: Any, out: Any, b1: Any, b2: Any) -> bool:
        """Whether x is row-major in the tuned dtype and the weights (as stored: [N, K] or [K, N])
        row-major and alike, as the biases are, all aligned (and, for tensor-descriptor loads, with
        the row strides those need)."""
        expr = self.expr
        biases = not expr.bias or (b1.dim() == b2.dim() == 1 and b1.stride() == b2.stride())
        if not (self.takes(x) and w1.stride()[-1] == 1 and w1.stride() == w2.stride() and biases
                and aligned(x, w1, w2, b1, b2)):
            return False
        return self.descriptors_fit(gated_launch.Problem(gated_launch.ints_of(expr, x, w1, w2, out, b1, b2),
                                                         (True,) * 6))


class WideSite(_OneKernel):
    """One wide call site (projections of one input)."""

    launch = wide_launch

    def empty_outs(self, x: Any) -> list:
        """A fresh contiguous [M, N_i] output per weight."""
        return [x.new_empty((self.expr.m, n)) for n in self.expr.ns]

    def __call__(self, x: Any, ws: list, bs: list, norm: Any = None) -> list:
        expr, outs = self.expr, self.empty_outs(x)
        # the kernel takes the weights as stored ([N, K] for nn.Linear's), the graph their [K, N] views
        ws = [w.t() for w in ws] if expr.trans_b else list(ws)
        bs = list(bs) if expr.bias else [None] * len(ws)
        if not self.fits(x, ws, outs, bs) or not norm_fits(expr, norm):
            _misfit(self)
            return products(expr, x, *ws, *outs, *bs, *_trailing((), norm))
        ints = dict(zip(wide_launch.template.int_names(expr), wide_launch.ints_of(expr, x, ws, outs, bs)))
        self.run(x, *ws, *outs, *bs, *_trailing((), norm), *self.scratch(x), **ints)
        return outs

    def fits(self, x: Any, ws: list, outs: list, bs: list) -> bool:
        """Whether x is row-major in the tuned dtype, and there are as many weights (as stored:
        [N_i, K] or [K, N_i], rows contiguous) and biases (vectors) as tuned, all aligned (and, for
        tensor-descriptor loads, with the row strides those need)."""
        expr = self.expr
        biases = not expr.bias or all(b is not None and b.dim() == 1 for b in bs)
        if not (self.takes(x) and len(ws) == len(expr.ns) and len(bs) == len(ws)
                and all(w.stride()[-1] == 1 for w in ws) and biases and aligned(x, *ws, *bs)):
            return False
        return self.descriptors_fit(wide_launch.Problem(wide_launch.ints_of(expr, x, ws, outs, bs),
                                                        (True,) * (1 + 3 * len(ws))))


class AttentionSite(_OneKernel):
    """One attention call site."""

    launch = attention_launch

    def empty_out(self, q: Any) -> Any:
        """A fresh [B, H, Lq, D] output laid out as the op it replaces laid out its own."""
        e = self.expr
        sizes = dict(zip("bhqd", (e.batch, e.heads, e.lq, e.d)))
        # allocated from q, as the other sites allocate theirs: a factory call would not be traced as fake
        out = q.new_empty([sizes[c] for c in e.out_order])
        return out if e.out_order == "bhqd" else out.permute([e.out_order.index(c) for c in "bhqd"])

    def __call__(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
        expr, out = self.expr, self.empty_out(q)
        if not self.fits(q, k, v, mask):
            _misfit(self)
            return out.copy_(sdpa(expr, q, k, v, None, mask))  # the layout the graph was traced with
        ints = dict(zip(attention_launch.template.int_names(), attention_launch.ints_of(expr, q, k, v, out, mask)))
        self.run(q, k, v, out, mask, *self.scratch(q, "SPLIT"), **ints)
        return out

    def fits(self, q: Any, k: Any, v: Any, mask: Any) -> bool:
        """Whether q, k, v have the tuned shapes and dtype, and the mask (or its absence) the tuned
        kind and broadcast pattern, all aligned."""
        e = self.expr
        keys = (e.batch, e.heads, e.lk, e.d)
        if tuple(q.shape) != (e.batch, e.heads, e.lq, e.d) or not tuple(k.shape) == tuple(v.shape) == keys:
            return False
        if any(DTYPE_NAMES.get(str(t.dtype)) != e.dtype for t in (q, k, v)) or not aligned(q, k, v, mask):
            return False
        if mask is None:
            return e.mask is None
        kind = "bool" if mask.dtype == torch.bool else DTYPE_NAMES.get(str(mask.dtype))
        return kind == e.mask and attention_match.mask_dims(mask, (e.batch, e.heads, e.lq, e.lk)) == e.mask_dims


def norm_fits(expr: Any, norm: Any) -> bool:
    """Whether a call's norm weight is what the site was tuned for: none without a norm, else a
    contiguous, aligned [K] vector in the tuned dtype."""
    if expr.norm_eps is None or norm is None:
        return expr.norm_eps is None and norm is None
    return (norm.dim() == 1 and norm.shape[0] == expr.k and norm.stride(0) == 1 and aligned(norm)
            and DTYPE_NAMES.get(str(norm.dtype)) == expr.dtype)


def _trailing(inputs: Any, norm: Any) -> tuple:
    """A launch's trailing tensors: the epilogue's inputs, then the norm weight if there is one."""
    return (*inputs, *(() if norm is None else (norm,)))


@lru_cache(maxsize=None)
def site(spec: str) -> Any:
    """The replay site of a spec (its kernel source generated and loaded once)."""
    data = json.loads(spec)
    # a spec of no kind's op is the contraction's: its from_dict says what the spec is not
    kind = _BY_OP.get(data["expr"].get("op"), CONTRACTION)
    return kind.site(kind.expr.from_dict(data["expr"]), Config.of(data["config"]))


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], inputs: list[torch.Tensor],
           spec: str, norm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """epilogue(a @ b [+ bias]) by the tuned kernel of `spec` (a fresh contiguous output)."""
    return site(spec)(a, b, bias, inputs, norm)


def gated(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1: Optional[torch.Tensor],
          b2: Optional[torch.Tensor], spec: str, norm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """act(x @ w1 [+ b1]) * (x @ w2 [+ b2]) by the tuned kernel of `spec` (a fresh [M, N] output)."""
    return site(spec)(x, w1, w2, b1, b2, norm)


def wide(x: torch.Tensor, ws: list[torch.Tensor], bs: list[torch.Tensor], spec: str,
         norm: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """[x @ w_i (+ b_i)] by the tuned kernel of `spec` (a fresh [M, N_i] output each)."""
    return site(spec)(x, ws, bs, norm)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
              spec: str) -> torch.Tensor:
    """softmax(scale·q·kᵀ [+ mask])·v by the tuned kernel of `spec` (a fresh output)."""
    return site(spec)(q, k, v, mask)


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
        """Its opaque twin, which launches PDL configs with their launch attribute (`_graphed`)."""
        return getattr(torch.ops.tritune, f"{self.expr.op}_graphed").default

    def op_for(self, spec: str, captured: bool) -> Any:
        """The op a graph calls for a site: the twin where the graph is replayed from one CUDA graph
        (`captured`) and the site's config launches early (PDL), else the traced op."""
        return self.graphed_op if captured and json.loads(spec)["config"].get("PDL", 0) else self.op


def _projections(m: Any) -> tuple:
    """A gated pair's or wide group's own contraction matches."""
    return m.projections


def _unnormed(m: Any) -> tuple:
    """A contraction that took a row norm into its kernel, as the contraction it is without it."""
    return () if m.norm is None else (without_norm(m),)


CONTRACTION = SiteKind(match=graph.Match, expr=Matmul, members=_unnormed, rewrite=rewrites.contraction,
                       site=Site, body=matmul,
                       fake=lambda a, b, bias, inputs, spec, norm=None: site(spec).empty_out(a, b))
KINDS = (
    CONTRACTION,
    SiteKind(match=graph.GatedMatch, expr=Gated, members=_projections, rewrite=rewrites.gated,
             site=GatedSite, body=gated,
             fake=lambda x, w1, w2, b1, b2, spec, norm=None: x.new_empty((site(spec).expr.m, site(spec).expr.n))),
    SiteKind(match=graph.WideMatch, expr=Wide, members=_projections, rewrite=rewrites.wide,
             site=WideSite, body=wide, fake=lambda x, ws, bs, spec, norm=None: site(spec).empty_outs(x)),
    SiteKind(match=graph.AttentionMatch, expr=Attention, members=lambda m: (), rewrite=rewrites.attention,
             site=AttentionSite, body=attention, fake=lambda q, k, v, mask, spec: site(spec).empty_out(q)),
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
