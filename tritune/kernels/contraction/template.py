"""Triton source for the contraction family, generated from a Matmul expression.

One template serves every contraction: layout and epilogue shape the generated source; tile
sizes, grouping, unrolling, split-K, TMA loads, the persistent loop, warp specialisation,
programmatic dependent launch and the GEMV path (a few rows without tensor cores) are constexpr
knobs of it.
"""
from __future__ import annotations

from typing import Any

from tritune.kernels import norm
from tritune.kernels.codegen import epilogue_source, load_source
from tritune.kernels.contraction.expr import Matmul

KERNEL_NAME = "tritune_matmul"
# the kernel's integer parameters before the extra inputs' strides: sizes, then A's, B's, C's strides, the bias's
INT_NAMES = ("M", "N", "K", *(f"stride_{t}{d}" for t, dims in (("a", "bmk"), ("b", "bkn"), ("c", "bmn"))
                               for d in dims), "stride_bias")

# The head of every generated GEMM source (the gated family's too): imports and the grouped tile order.
PRELUDE = '''\
import triton
import triton.language as tl


@triton.jit
def _tile_of(tile, grid_m, grid_n, GROUP_M: tl.constexpr):
    # grouped launch order: programs running together share rows of A in L2
    width = GROUP_M * grid_n
    first_m = (tile // width) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    return first_m + (tile % width) % group_m, (tile % width) // group_m


@triton.jit
def _prefetch_weights(W, pid_n, k_lo, N, K, stride_wk, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PDL_K: tl.constexpr, STORED_NK: tl.constexpr):
    # Asks the L2 for the first PDL_K steps along K of this program's weight slice (W as the [K, N]
    # operand), one 128-byte line per address. A weight never depends on the previous kernel, so a
    # program launched early (programmatic dependent launch) fetches it while that kernel drains.
    line: tl.constexpr = 1024 // W.dtype.element_ty.primitive_bitwidth
    if STORED_NK:  # the slice's rows, PDL_K elements of each
        rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        ks = tl.minimum(k_lo * BLOCK_K + tl.arange(0, PDL_K // line) * line, K - 1)
        ptrs = W + rows[:, None] * stride_wn + ks[None, :] * stride_wk
    else:  # stored [K, N]: PDL_K rows, the slice's BLOCK_N elements of each
        ks = tl.minimum(k_lo * BLOCK_K + tl.arange(0, PDL_K), K - 1)
        cols = tl.minimum(pid_n * BLOCK_N + tl.arange(0, (BLOCK_N + line - 1) // line) * line, N - 1)
        ptrs = W + ks[:, None] * stride_wk + cols[None, :] * stride_wn
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _gemv_step(a, b, K_LAST: tl.constexpr):
    # a step without tensor cores (GEMV): every product of the [BLOCK_M, BLOCK_K] input tile and the
    # [BLOCK_K, BLOCK_N] weight tile in fp32; the caller sums them along K once its loop ends
    # (_gemv_sum). K runs last (K_LAST), [BLOCK_M, BLOCK_N, BLOCK_K], where the weight is stored
    # [N, K]: the tile is flipped (a view: no data moves); else N does, [BLOCK_M, BLOCK_K, BLOCK_N],
    # as a [K, N] weight's rows are stored. Either way the products keep the loaded weight's
    # order, and a pipelined loop (num_stages > 1) reads each tile from its shared-memory stage
    # straight into their layout
    if K_LAST:
        return a.to(tl.float32)[:, None, :] * tl.trans(b).to(tl.float32)[None, :, :]
    else:
        return a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]


@triton.jit
def _gemv_zeros(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_LAST: tl.constexpr):
    # the GEMV's products before its loop, in _gemv_step's order
    if K_LAST:
        return tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)


@triton.jit
def _gemv_sum(products, K_LAST: tl.constexpr):
    # the GEMV's [BLOCK_M, BLOCK_N] result: its products summed along K, once
    if K_LAST:
        return tl.sum(products, axis=2)
    else:
        return tl.sum(products, axis=1)
'''

# Programmatic dependent launch (PDL >= 1; the binary carries the launch attribute): the kernel may
# start while the previous one in the stream drains. Every program waits for that kernel's writes
# (gdc_wait) before it reads or writes anything but weights, and lets the next kernel start
# (gdc_launch_dependents). PDL=2 prefetches the weights first (`_prefetch_weights`).
PDL_WAIT = '''    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
'''

_TEMPLATE = PRELUDE + '''{norm_helpers}

@triton.jit
def _mainloop(A, B, a_desc, b_desc, batch, pid_m, pid_n, k_lo, k_hi, M, N, K,
              stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              UNROLL: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
              WARP_SPEC: tl.constexpr, GEMV: tl.constexpr{norm_param}):
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{norm_init}    if TMA:
        for k in tl.range(k_lo, k_hi, loop_unroll_factor=UNROLL, warp_specialize=WARP_SPEC):
{tma_loads}
{norm_apply}            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        k_first = k_lo * BLOCK_K + offs_k
        # rows/columns past the edge wrap onto valid ones, so the K loop needs no M/N masks;
        # the store is masked, so the duplicates are never written
        rm = offs_m % M
        rn = offs_n % N
        a_ptrs = A + batch * stride_ab + rm[:, None] * stride_am + k_first[None, :] * stride_ak
        b_ptrs = B + batch * stride_bb + k_first[:, None] * stride_bk + rn[None, :] * stride_bn
        if GEMV:
            products = _gemv_zeros(BLOCK_M, BLOCK_N, BLOCK_K, {trans_b})
        # Triton software-pipelines (cp.async) the loads of a loop without tl.dot only where the
        # loop names its num_stages: a GEMV passes the config's (the GEMV constexpr carries it)
        for k in tl.range(k_lo, k_hi, loop_unroll_factor=UNROLL, num_stages=GEMV if GEMV else None):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
{norm_apply}            if GEMV:
                products += _gemv_step(a, b, {trans_b})
            else:
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if GEMV:
            acc = _gemv_sum(products, {trans_b})
{norm_done}    return acc{norm_returned}


{early_helper}
@triton.jit
def _finish(acc, C, batch, pid_m, pid_n, M, N, stride_cb, stride_cm, stride_cn,{finish_params}
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
{epilogue}
    if TMA == 2:
        # the TMA unit writes the tile (clipped at the edges) while the program moves on
        c_desc = tl.make_tensor_descriptor(C + batch * stride_cb, shape=[M, N], strides=[stride_cm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(C.dtype.element_ty))
    else:
        c_ptrs = C + batch * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _split_fixup(acc, WS, LOCKS, slot, split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SPLIT_K: tl.constexpr):
    # Each K slice parks its fp32 partial tile; the slice that arrives last adds the others in
    # and finishes the tile, then re-arms the tile's counter for the next launch.
    tile_elems: tl.constexpr = BLOCK_M * BLOCK_N
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    base = WS + slot.to(tl.int64) * (SPLIT_K * tile_elems)
    tl.store(base + split * tile_elems + offs, acc)
    tl.debug_barrier()  # every thread's partial is stored before the counter says so
    arrived = tl.atomic_add(LOCKS + slot, 1, sem="acq_rel")
    last = arrived == SPLIT_K - 1
    if last:
        tl.debug_barrier()
        for s in tl.static_range(SPLIT_K):
            if s != split:
                acc += tl.load(base + s * tile_elems + offs, cache_modifier=".cg")
        tl.store(LOCKS + slot, 0)
    return acc, last


@triton.jit
def {name}(
    A, B, C, BIAS, WS, LOCKS,{input_pointers}{norm_pointer}
{int_params}
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UNROLL: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SPLIT_K: tl.constexpr, TMA: tl.constexpr, PERSISTENT: tl.constexpr, WARP_SPEC: tl.constexpr,
    PDL: tl.constexpr, PDL_K: tl.constexpr, GEMV: tl.constexpr,
):
    # {description}
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    tiles = grid_m * grid_n
    k_iters = tl.cdiv(K, BLOCK_K)
    batch = tl.program_id(1).to(tl.int64)
    if PDL == 2:
        first_m, first_n = _tile_of(tl.program_id(0), grid_m, grid_n, GROUP_M)
        _prefetch_weights(B + batch * stride_bb, first_n, tl.program_id(2) * tl.cdiv(k_iters, SPLIT_K), N, K,
                          stride_bk, stride_bn, BLOCK_N, BLOCK_K, PDL_K, {trans_b})
{pdl_wait}    a_desc, b_desc = A, B  # stand-ins, never read without TMA
    if TMA:
        # tensor-descriptor loads: the TMA unit fetches whole tiles (zero-filled past the edges),
        # which needs 16-byte aligned rows but no alignment of the shape itself
{tma_descriptors}
    if PERSISTENT:
        # a fixed grid of programs per batch entry walks its tiles: no launch tail, descriptors
        # built once; PERSISTENT=2 flattens tile and K loops into one, so the pipeline already
        # loads the next tile while this one's epilogue runs. WARP_SPEC: a producer warp group
        # issues the TMA loads while two consumer groups each compute half of the tile
        for t in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=PERSISTENT == 2,
                          warp_specialize=WARP_SPEC):
            pid_m, pid_n = _tile_of(t, grid_m, grid_n, GROUP_M)
{early_persistent}            acc{norm_returned} = _mainloop(A, B, a_desc, b_desc, batch, pid_m, pid_n, 0, k_iters, M, N, K,
                            stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                            BLOCK_M, BLOCK_N, BLOCK_K, UNROLL, EVEN_K, DOT_PRECISION, TMA, 0, 0{norm_arg})
{norm_scale_persistent}{late_persistent}            _finish(acc, C, batch, pid_m, pid_n, M, N, stride_cb, stride_cm, stride_cn,{finish_args}
                    BLOCK_M, BLOCK_N, TMA)
    else:
        pid_m, pid_n = _tile_of(tl.program_id(0), grid_m, grid_n, GROUP_M)
        split = tl.program_id(2)
        per_split = tl.cdiv(k_iters, SPLIT_K)
        k_lo = split * per_split
        k_hi = tl.minimum(k_lo + per_split, k_iters)
{early}        acc{norm_returned} = _mainloop(A, B, a_desc, b_desc, batch, pid_m, pid_n, k_lo, k_hi, M, N, K,
                        stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                        BLOCK_M, BLOCK_N, BLOCK_K, UNROLL, EVEN_K, DOT_PRECISION, TMA, WARP_SPEC, GEMV{norm_arg})
{norm_scale}{late}        if SPLIT_K > 1:
            slot = tl.program_id(1) * tiles + tl.program_id(0)
            acc, last = _split_fixup(acc, WS, LOCKS, slot, split, BLOCK_M, BLOCK_N, SPLIT_K)
            if last:
                _finish(acc, C, batch, pid_m, pid_n, M, N, stride_cb, stride_cm, stride_cn,{finish_args}
                        BLOCK_M, BLOCK_N, TMA)
        else:
            _finish(acc, C, batch, pid_m, pid_n, M, N, stride_cb, stride_cm, stride_cn,{finish_args}
                    BLOCK_M, BLOCK_N, TMA)
'''

# The epilogue's bias and extra inputs are loaded before the K loop (`_epilogue_loads`), so that
# their latency hides behind the weight stream instead of following its last step: a skinny GEMM
# runs for a few microseconds, and one more dependent trip to memory at its end is a sizeable
# share. They stay in their stored dtype until _finish uses them (a conversion next to the load
# would wait for it there). A residual tile is masked at the edges; a vector runs over the tile's
# rows or columns.
_INPUT_LOADS = {
    "mn": "tl.load(E{i} + batch * stride_e{i}b + offs_m[:, None] * stride_e{i}m + offs_n[None, :] * stride_e{i}n, "
          "mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), other=0.0)",
    "m": "tl.load(E{i} + offs_m * stride_e{i}m, mask=offs_m < M, other=0.0)",
    "n": "tl.load(E{i} + offs_n * stride_e{i}n, mask=offs_n < N, other=0.0)",
}
# each loaded input in _finish: an fp32 tile that broadcasts against acc
_INPUT_USES = {"mn": "e{i}.to(tl.float32)", "m": "e{i}.to(tl.float32)[:, None]", "n": "e{i}.to(tl.float32)[None, :]"}
# the largest tile (BLOCK_M x BLOCK_N) that loads its epilogue operands before its K loop: a
# decode GEMM's (16 x 16 to 16 x 256), whose operands take at most 32 registers a thread at 2 warps
EARLY_MAX_TILE = 4096
_EARLY = '''
@triton.jit
def _epilogue_loads(BIAS, batch, pid_m, pid_n, M, N, stride_bias,{inputs}
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
{loads}    return {names}
'''


def _early_names(expr: Matmul) -> tuple[str, ...]:
    """What `_epilogue_loads` returns and `_finish` takes: the bias's tile, then each extra input's."""
    return (("bias",) if expr.has_bias else ()) + tuple(f"e{i}" for i in range(len(expr.inputs)))


def early_loads(expr: Matmul, indent: str, bias: str = "BIAS, batch", stride_bias: str = "stride_bias",
                warp_spec: bool = True) -> tuple[str, str, str]:
    """The statements at `indent` loading the epilogue's operands of the tile (pid_m, pid_n) before
    its K loop and, for a warp-specialised loop (`warp_spec`: the kernel has the knob), after it;
    and what _finish then takes after its strides. `bias`: the bias pointer and the batch entry,
    as the kernel names them. All empty where the epilogue has neither."""
    names = _early_names(expr)
    if not names:
        return "", "", ""
    call = f"{', '.join(names)} = _epilogue_loads({bias}, pid_m, pid_n, M, N, {stride_bias},{_input_args(expr)} BLOCK_M, BLOCK_N)\n"
    # Only small tiles load early: a tile of prefill's size would hold its operands in registers
    # through a long K loop whose end they barely delay. Values loaded before a warp-specialised
    # loop and used after it came out wrong on the GPU (Triton's partitions): that loop's
    # epilogue loads its operands after it.
    small = f"BLOCK_M * BLOCK_N <= {EARLY_MAX_TILE}"
    before, after = f"{indent}if {small}:\n{indent}    {call}", f"{indent}if not ({small}):\n{indent}    {call}"
    if warp_spec:
        before = f"{indent}if {small}:\n{indent}    if not WARP_SPEC:\n{indent}        {call}"
        after += f"{indent}elif WARP_SPEC:\n{indent}    {call}"
    return before, after, "".join(f" {n}," for n in names)


def _early_helper(expr: Matmul) -> str:
    names = _early_names(expr)
    if not names:
        return ""
    loads = "    bias = tl.load(BIAS + offs_n * stride_bias, mask=offs_n < N, other=0.0)\n" if expr.has_bias else ""
    loads += "".join(f"    e{i} = {_INPUT_LOADS[inp.shape].format(i=i)}\n" for i, inp in enumerate(expr.inputs))
    return _EARLY.format(inputs=_input_args(expr), loads=loads, names=", ".join(names))


def _input_args(expr: Matmul) -> str:
    """The epilogue's extra inputs as arguments: their pointers, then their strides (' E0, ..., stride_e0b, ...,')."""
    return "".join(f" E{i}," for i in range(len(expr.inputs))) + "".join(f" {n}," for n in input_int_names(expr))


def input_int_names(expr: Matmul) -> tuple[str, ...]:
    """The stride arguments of the epilogue's extra inputs, in order: a residual's batch, row and
    column strides, a vector's one stride."""
    return tuple(f"stride_e{i}{d}" for i, inp in enumerate(expr.inputs) for d in ("bmn" if inp.shape == "mn" else inp.shape))


# Tensor descriptors over each operand as stored ([M, K] or, transposed, [K, M]); the unit
# stride is the last one, as TMA requires; transposed tiles are flipped after the load.
_DESC = "        {x}_desc = tl.make_tensor_descriptor({X} + batch * stride_{x}b, shape=[{d0}, {d1}], " \
        "strides=[stride_{x}{s0}, 1], block_shape=[{b0}, {b1}])\n"
_LOAD = "            {x} = {x}_desc.load([{o0}, {o1}]){t}\n"
_OPERANDS = {  # (operand, transposed) -> (dims, stride name, block dims, load offsets)
    ("a", False): ("M", "K", "m", "BLOCK_M", "BLOCK_K", "pid_m * BLOCK_M", "k * BLOCK_K"),
    ("a", True): ("K", "M", "k", "BLOCK_K", "BLOCK_M", "k * BLOCK_K", "pid_m * BLOCK_M"),
    ("b", False): ("K", "N", "k", "BLOCK_K", "BLOCK_N", "k * BLOCK_K", "pid_n * BLOCK_N"),
    ("b", True): ("N", "K", "n", "BLOCK_N", "BLOCK_K", "pid_n * BLOCK_N", "k * BLOCK_K"),
}


def _tma(expr: Matmul) -> tuple[str, str]:
    descs, loads = "", ""
    for x, trans in (("a", expr.trans_a), ("b", expr.trans_b)):
        d0, d1, s0, b0, b1, o0, o1 = _OPERANDS[(x, trans)]
        descs += _DESC.format(x=x, X=x.upper(), d0=d0, d1=d1, s0=s0, b0=b0, b1=b1)
        loads += _LOAD.format(x=x, o0=o0, o1=o1, t=".T" if trans else "")
    return descs, loads


def int_params(expr: Matmul, specialize: bool = False) -> str:
    """The kernel's integer parameters (sizes, strides), as arguments or, specialised, as constexprs."""
    names = (*INT_NAMES, *input_int_names(expr))
    kind = ": tl.constexpr" if specialize else ""
    groups = (names[:3], names[3:6], names[6:9], names[9:])
    return "\n".join("    " + " ".join(f"{n}{kind}," for n in group) for group in groups if group)


def source(expr: Matmul, specialize: bool = False) -> str:
    """The Triton source of the kernel computing `expr`; `specialize`: its sizes and strides are
    constexprs (one binary per shape, launched with pointers only: what a compiled model replays)."""
    descs, loads = _tma(expr)
    early, late, finish_args = early_loads(expr, " " * 8)
    early_persistent, late_persistent, _ = early_loads(expr, " " * 12)
    cast = "    bias = bias.to(tl.float32)\n" if expr.has_bias else ""
    return _TEMPLATE.format(
        input_pointers="".join(f" E{i}," for i in range(len(expr.inputs))), int_params=int_params(expr, specialize),
        finish_params=finish_args, finish_args=finish_args, early=early, late=late,
        early_persistent=early_persistent, late_persistent=late_persistent, early_helper=_early_helper(expr),
        name=KERNEL_NAME,
        description=expr.describe().replace(f" {expr.dtype}", ""),
        epilogue=cast + epilogue_source(expr.epilogue, "    ", lambda i, inp: _INPUT_USES[inp.shape].format(i=i)),
        tma_descriptors=descs.rstrip("\n"),
        tma_loads=loads.rstrip("\n"),
        pdl_wait=PDL_WAIT, trans_b=expr.trans_b,
        **norm_fields(expr.norm_eps, expr.layer_norm),
    )


def norm_fields(eps: float | None, layer: bool = False) -> dict[str, str]:
    """The template's row-norm prologue (`tritune.kernels.norm`), empty without one."""
    return {"norm_param": norm.param(eps, layer), "norm_init": norm.init(eps, "    ", layer),
            "norm_apply": norm.apply(eps, "a", " " * 12, layer), "norm_returned": norm.returned(eps, layer),
            "norm_pointer": norm.param(eps, layer).lstrip(",") + ("," if eps is not None else ""),
            "norm_arg": norm.param(eps, layer), "norm_helpers": norm.helpers(eps, layer),
            "norm_done": norm.done(eps, "    ", layer),
            "norm_scale_persistent": norm.scale(eps, ("acc",), " " * 12, layer),
            "norm_scale": norm.scale(eps, ("acc",), " " * 8, layer)}


def load(expr: Matmul, specialize: bool = False) -> Any:
    """The @triton.jit function of the generated source for `expr` (see `source`)."""
    return load_source(source(expr, specialize), KERNEL_NAME)
