"""The replay sites of tuned ops (`tuned_op`): one call site's kernel, its grid and compile-time
parameters, what operands it takes, and its launch.

Each site's kernel source is specialised to the site's sizes and strides (constexprs): a compiled
model launches it with pointers alone, as Inductor launches its own templates (each int argument
is host time on every call). Operands whose layout or dtypes are not the ones tuned run the
expression as torch ops instead: correct, and visible to Inductor like any other op.

A config with programmatic dependent launch (PDL) launches with the attribute only inside an op's
`_graphed` twin (`_launch_pdl` set); traced by Inductor, whose launch sets no attribute, the site
launches its kernel built without PDL (whose weight prefetch, an inline-asm instruction on the
weight's pointer, would also make Inductor copy the weight on every call, taking it for an output).
"""
from __future__ import annotations

import logging
from collections import deque
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar, Iterator

import torch
from torch.library import wrap_triton

from tritune.kernels.attention import launch as attention_launch
from tritune.kernels.attention.family import sdpa
from tritune.kernels.codegen import use_torch_scratch
from tritune.kernels.contraction import launch
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.contraction.family import MATMUL
from tritune.kernels.device import current_sms
from tritune.kernels.backend import attention_match
from tritune.kernels.backend.helpers import DTYPE_NAMES, input_problem, layout_of
from tritune.kernels.gated import launch as gated_launch
from tritune.kernels.gated.family import GATED
from tritune.kernels.norm import tensors
from tritune.kernels.wide import launch as wide_launch
from tritune.kernels.wide.family import products
from tritune.schedules.config import Config

log = logging.getLogger("tritune.compiler")
_misfits: set[Any] = set()
# set while a `_graphed` op runs: its sites launch with the programmatic-dependence attribute
_launch_pdl: ContextVar[bool] = ContextVar("tritune_launch_pdl", default=False)
# Split sites' arrival counters in a compiled graph replayed from a CUDA graph (`cuda_graphs.GraphStep`).
# Zeroed inside the graph they would cost a kernel in every replay; the kernels leave them at 0, so
# zeroing once is enough. They must lie outside the graph's own memory, whose blocks the graph's
# other buffers reuse within a replay (a split kernel's fp32 partials freed before a later site's
# counters were made would overwrite them): so a run of the graph outside the capture lists what
# each site asks for (`counters_counted`), and the capture takes zeroed counters allocated before
# it, in that order (`counters_from`). Set while either runs: the list, or the counters to hand out.
_counter_plan: ContextVar[Any] = ContextVar("tritune_counter_plan", default=None)


class _Asked(list):
    """(device, count) of each split site's counters, in the order a run asked for them."""


@contextmanager
def counters_counted() -> Iterator[list]:
    """While open, each split site's counters are listed as asked for, (device, count) in order."""
    token = _counter_plan.set(_Asked())
    try:
        yield _counter_plan.get()
    finally:
        _counter_plan.reset(token)


@contextmanager
def counters_from(asked: list) -> Iterator[tuple]:
    """Zeroed counters for each request `asked` lists, allocated now (before a capture: outside its
    memory); while open, split sites take them in that order, a site that asks for other counters
    than the next ones getting zeroed fresh ones. Yields them all (to keep as long as the graph)."""
    made = tuple(torch.zeros(n, dtype=torch.int32, device=device) for device, n in asked)
    token = _counter_plan.set(deque(made))
    try:
        yield made
    finally:
        _counter_plan.reset(token)


def _counters(like: Any, n: int) -> Any:
    """`n` int32 arrival counters at 0 on `like`'s device (see `_counter_plan`)."""
    plan = _counter_plan.get()
    if isinstance(plan, _Asked):
        plan.append((like.device, n))
    elif plan and plan[0].numel() == n and plan[0].device == like.device:
        return plan.popleft()
    return like.new_zeros(n, dtype=torch.int32)


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


class _Launched:
    """A call site's kernel (`fn`, specialised to the site), its `grid`, compile-time parameters
    (`consts`) and `config`, and its launch."""

    fn: Any
    grid: tuple
    consts: dict
    config: Config

    def run(self, *args: Any, **ints: Any) -> None:
        """Launch the site's kernel (Inductor traces this into a launch of its own)."""
        if self.config.get("TMA", 0):
            use_torch_scratch()
        wrap_triton(self.fn)[self.grid](*args, **ints, **{**self.consts, **_launch_options(self.config)})


class Site(_Launched):
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

    def fits(self, a: Any, b: Any, out: Any, bias: Any, inputs: list, norm: Any = None,
             norm_bias: Any = None) -> bool:
        """Whether the operands have the layout the kernel was tuned for (and, for tensor-descriptor
        loads, the strides those need), start aligned (`aligned`), and the extra inputs the
        epilogue's kinds and dtypes (and the norm's weight and bias the norm's)."""
        expr, tma = self.expr, self.config.get("TMA", 0)
        if layout_of(a) is not expr.trans_a or layout_of(b) is not expr.trans_b or not aligned(a, b, bias, *inputs):
            return False
        if input_problem(expr, inputs, out.shape) or not norm_fits(expr, norm, norm_bias):
            return False
        trailing = _trailing(inputs, norm, norm_bias)
        problem = launch.Problem(expr.batch, launch.ints_of(expr, a, b, out, bias, *trailing), (True,) * 4)
        return not tma or launch.tma_unfit(expr, problem, store=tma == 2) is None

    def empty_out(self, a: Any, b: Any) -> Any:
        """A fresh contiguous output for the operands (2-D, or 3-D if either is)."""
        expr = self.expr
        return a.new_empty((expr.batch, expr.m, expr.n) if 3 in (a.dim(), b.dim()) else (expr.m, expr.n))

    def __call__(self, a: Any, b: Any, bias: Any, inputs: list, norm: Any = None, norm_bias: Any = None) -> Any:
        expr, out = self.expr, self.empty_out(a, b)
        if not self.fits(a, b, out, bias, inputs, norm, norm_bias):
            _misfit(self)
            return MATMUL.expression(expr)(a, b, out, bias, *_trailing(inputs, norm, norm_bias))
        inputs = _trailing(inputs, norm, norm_bias)  # the kernel takes the norm's tensors after the epilogue's inputs
        # split-K's scratch and the bias: what the kernel never touches is None, which Triton
        # specialises away (no allocation, no zeroing launch, no pointer to pass: each is host time
        # on every call of a compiled model)
        ws = locks = None
        if self.config.get("SPLIT_K", 1) > 1:
            ws, locks = a.new_empty(self.ws, dtype=torch.float32), _counters(a, self.slots)
        ints = dict(zip(self.int_names, launch.ints_of(expr, a, b, out, bias, *inputs)))
        self.run(a, b, out, bias if expr.has_bias else None, ws, locks, *inputs, **ints)
        return out


class _OneKernel(_Launched):
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
        """A config split by `knob`: the launch module's scratch, its fp32 partials and arrival
        counters (where a CUDA graph's counters are planned, `_counter_plan`, sized on the meta
        device and the counters from the plan); None each unsplit (specialised away: no
        allocation, no zeroing launch)."""
        if self.config.get(knob, 1) == 1:
            return None, None
        if _counter_plan.get() is None:
            return self.launch.scratch(self.expr, self.config, like)
        partials, counters = self.launch.scratch(self.expr, self.config, torch.empty(0, device="meta"))
        return like.new_empty(partials.numel(), dtype=torch.float32), _counters(like, counters.numel())


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

    def __call__(self, q: Any, k: Any, v: Any, mask: Any, cos_q: Any = None, sin_q: Any = None, cos_k: Any = None,
                 sin_k: Any = None) -> Any:
        expr, out, tables = self.expr, self.empty_out(q), (cos_q, sin_q, cos_k, sin_k)
        if not self.fits(q, k, v, mask, *tables):
            _misfit(self)
            return out.copy_(sdpa(expr, q, k, v, None, mask, *tables))  # the layout the graph was traced with
        ints = attention_launch.ints_of(expr, q, k, v, out, mask, *tables)
        # None for an absent mask or table: specialised away, nothing passed per launch
        self.run(q, k, v, out, mask, *tables, *self.scratch(q, "SPLIT"),
                 **dict(zip(attention_launch.template.int_names(), ints)))
        return out

    def fits(self, q: Any, k: Any, v: Any, mask: Any, *tables: Any) -> bool:
        """Whether q, k, v have the tuned shapes and dtype, the mask (or its absence) the tuned kind
        and broadcast pattern, and the rotary tables (cos and sin of q, then of k) the tuned lanes
        and pattern, all aligned."""
        e = self.expr
        keys = (e.batch, e.kv_heads, e.lk, e.d)
        if tuple(q.shape) != (e.batch, e.heads, e.lq, e.d) or not tuple(k.shape) == tuple(v.shape) == keys:
            return False
        if any(DTYPE_NAMES.get(str(t.dtype)) != e.dtype for t in (q, k, v)) or not aligned(q, k, v, mask, *tables):
            return False
        if not (attention_match.rope_fits(e, e.rope_q, e.lq, *tables[:2])
                and attention_match.rope_fits(e, e.rope_k, e.lk, *tables[2:])):
            return False
        if mask is None:
            return e.mask is None
        kind = "bool" if mask.dtype == torch.bool else DTYPE_NAMES.get(str(mask.dtype))
        return kind == e.mask and attention_match.mask_dims(mask, (e.batch, e.heads, e.lq, e.lk)) == e.mask_dims


def norm_fits(expr: Any, norm: Any, norm_bias: Any = None) -> bool:
    """Whether a call's norm weight (and a LayerNorm's bias) is what the site was tuned for: none
    without a norm, else contiguous, aligned [K] vectors in the tuned dtype."""
    given, wanted = _trailing((), norm, norm_bias), tensors(expr.norm_eps, getattr(expr, "layer_norm", False))
    if (norm is None and norm_bias is not None) or len(given) != wanted:
        return False
    return all(t.dim() == 1 and t.shape[0] == expr.k and t.stride(0) == 1 and aligned(t)
               and DTYPE_NAMES.get(str(t.dtype)) == expr.dtype for t in given)


def _trailing(inputs: Any, norm: Any, norm_bias: Any = None) -> tuple:
    """A launch's trailing tensors: the epilogue's inputs, then the norm's weight and bias, those
    there are."""
    return (*inputs, *(t for t in (norm, norm_bias) if t is not None))
