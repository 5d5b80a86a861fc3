"""How much of a decode MLP's time does one persistent kernel save against two? The MLP's two
dependent skinny GEMMs, h = act(x @ W1ᵀ + b1), y = h @ W2ᵀ + b2 + r (gpt2: tanh-GELU) or h =
silu(x @ Wgᵀ) * (x @ Wuᵀ), y = h @ W2ᵀ + r (llama: Wg, Wu the halves of one [2*N1, K1] weight),
at 16 rows and 1, fp16: `two kernels` (phase 1, an N1 tile per program; phase 2, an N2 tile and
a K slice per program, split-K with the contraction template's fixup), `persistent` (one program
per SM: its phase-1 tiles, h to a scratch, a grid-wide barrier, its phase-2 tiles; PREFETCH asks
the L2 for the program's first phase-2 weight slice, which does not depend on h: 1 before the
barrier, 2 before phase 1; 3 and 4 load the slice's first columns, up to PRE_ELEMS elements,
into registers: 3 before phase 1, 4 before the barrier) and `library` (torch: linear, gelu or
silu * up, linear, add).

A config (BLOCK_N, BLOCK_K, warps, stages) serves both phases; phase 2's split is the largest
power of two keeping its tiles within the SMs. Each config is checked against float64 (a
barrier that gives up raises a flag: the config fails, never hangs), graph-timed over operand
sets spanning 3x the L2 (weights L2-cold); each variant's best is then timed in turns.

    python -m scripts.probes.chain_probe --out DIR                 (GPU: all shapes, the default grid)
    python -m scripts.probes.chain_probe --shapes gpt2 --grid 'PREFETCH=0,1' --out DIR
    TRITON_INTERPRET=1 python -m scripts.probes.chain_probe --check-cpu   (correctness, no GPU)
    python -m scripts.probes.chain_probe --build-only              (compiles for sm_90, no GPU)
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import triton
import triton.language as tl

from tritune.kernels.codegen import load_source
from tritune.kernels.contraction import template
from tritune.kernels.contraction.expr import Matmul

# the split-K fixup of the contraction template's generated module
_split_fixup = load_source(template.source(Matmul(16, 64, 64, trans_b=True)), "_split_fixup")

MAX_SPLIT = 16
ROUNDS = 5  # head-to-head rounds of each variant's best config
SPIN_LIMIT = 2**22  # polls of the barrier's counter (~1 us each) before a program gives up
# name: (M, K1, N1, N2, gated)
SHAPES = {"gpt2": (16, 1024, 4096, 1024, False), "llama": (16, 2048, 5632, 2048, True),
          "gpt2-m1": (1, 1024, 4096, 1024, False), "llama-m1": (1, 2048, 5632, 2048, True)}
KNOBS = dict(BLOCK_N=(32, 64, 128), BLOCK_K=(128, 256), num_warps=(4, 8), num_stages=(3, 4), PREFETCH=(0, 1, 2, 3, 4),
             PRE_ELEMS=(32768,))  # PREFETCH 3 and 4: the most weight elements a program holds in registers


def pre_k(shape: tuple, c: dict, split: int) -> int:
    """PREFETCH 3 and 4: the weight columns of its K slice a program loads ahead, a power of two
    within the slice and PRE_ELEMS // BLOCK_N (at least one K block)."""
    per = triton.cdiv(triton.cdiv(shape[2], c["BLOCK_K"]), split) * c["BLOCK_K"]
    cap = min(per, max(c["BLOCK_K"], c.get("PRE_ELEMS", KNOBS["PRE_ELEMS"][0]) // c["BLOCK_N"]))
    return 1 << (cap.bit_length() - 1)


@triton.jit
def _tile_dot(X, W, offs_n, M, N, K, lo, hi, GATED: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # X [M, K] rows by W's rows offs_n over K blocks [lo, hi); GATED: also by the rows N below
    # them (the up half), with the same input tile
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(lo, hi):
        ks = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        # .cg: h was written by other SMs in this launch; their lines must not come from this L1
        x = tl.load(X + offs_m[:, None] * K + ks[None, :], mask=(offs_m[:, None] < M) & (ks[None, :] < K),
                    other=0.0, cache_modifier=".cg")
        wmask = (offs_n[:, None] < N) & (ks[None, :] < K)
        w = tl.load(W + offs_n[:, None] * K + ks[None, :], mask=wmask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        if GATED:
            wu = tl.load(W + (offs_n[:, None] + N) * K + ks[None, :], mask=wmask, other=0.0)
            acc_u = tl.dot(x, tl.trans(wu), acc_u)
    return acc, acc_u


@triton.jit
def _phase1_tile(t, X, W1, B1, H, M, K1, N1, GATED: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    acc, acc_u = _tile_dot(X, W1, offs_n, M, N1, K1, 0, tl.cdiv(K1, BLOCK_K), GATED, BLOCK_M, BLOCK_N, BLOCK_K)
    if GATED:
        h = acc * tl.sigmoid(acc) * acc_u
    else:
        if HAS_BIAS:
            acc += tl.load(B1 + offs_n, mask=offs_n < N1, other=0.0).to(tl.float32)[None, :]
        # tanh-GELU, tanh(z) = 2 sigmoid(2z) - 1
        h = acc * tl.sigmoid(1.5957691216057308 * (acc + 0.044715 * acc * acc * acc))
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N1)
    tl.store(H + offs_m[:, None] * N1 + offs_n[None, :], h.to(H.dtype.element_ty), mask=mask)


@triton.jit
def _slice(t, N1, N2, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # phase-2 tile t: its N2 tile, K slice and the slice's K blocks (none past the last tile)
    pid_n, split = t % tl.cdiv(N2, BLOCK_N), t // tl.cdiv(N2, BLOCK_N)
    per = tl.cdiv(tl.cdiv(N1, BLOCK_K), SPLIT)
    return pid_n, split, split * per, tl.minimum(split * per + per, tl.cdiv(N1, BLOCK_K))


@triton.jit
def _phase2_store(acc, pid_n, split, B2, R, Y, WS, LOCKS, M, N2, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # a phase-2 tile's K slice summed: the split's fixup, then (by the last slice) bias, residual, store
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    last = True
    if SPLIT > 1:
        acc, last = _split_fixup(acc, WS, LOCKS, pid_n, split, BLOCK_M, BLOCK_N, SPLIT)
    if last:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N2)
        if HAS_BIAS:
            acc += tl.load(B2 + offs_n, mask=offs_n < N2, other=0.0).to(tl.float32)[None, :]
        acc += tl.load(R + offs_m[:, None] * N2 + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + offs_m[:, None] * N2 + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _phase2_tile(t, H, W2, B2, R, Y, WS, LOCKS, M, N1, N2, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, split, lo, hi = _slice(t, N1, N2, SPLIT, BLOCK_N, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc, _ = _tile_dot(H, W2, offs_n, M, N2, N1, lo, hi, False, BLOCK_M, BLOCK_N, BLOCK_K)
    _phase2_store(acc, pid_n, split, B2, R, Y, WS, LOCKS, M, N2, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N)


@triton.jit
def _preload(t, W2, N1, N2, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE_K: tl.constexpr):
    # phase-2 tile t's first PRE_K weight columns of its K slice, into registers (none for a t
    # past the last tile): the load does not depend on h, so it runs while phase 1 does
    pid_n, _, lo, hi = _slice(t, N1, N2, SPLIT, BLOCK_N, BLOCK_K)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = lo * BLOCK_K + tl.arange(0, PRE_K)
    # a t past the last tile has a slice starting past N1: all masked
    mask = (rows[:, None] < N2) & (ks[None, :] < tl.minimum(hi * BLOCK_K, N1))
    return tl.load(W2 + rows[:, None] * N1 + ks[None, :], mask=mask, other=0.0)


@triton.jit
def _phase2_preloaded(t, wpre, H, W2, B2, R, Y, WS, LOCKS, M, N1, N2, HAS_BIAS: tl.constexpr,
                      SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PRE_K: tl.constexpr):
    # phase-2 tile t with its slice's first PRE_K columns already in registers (`_preload`)
    pid_n, split, lo, hi = _slice(t, N1, N2, SPLIT, BLOCK_N, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = lo * BLOCK_K + tl.arange(0, PRE_K)
    h = tl.load(H + offs_m[:, None] * N1 + ks[None, :], cache_modifier=".cg", other=0.0,
                mask=(offs_m[:, None] < M) & (ks[None, :] < tl.minimum(hi * BLOCK_K, N1)))
    acc = tl.dot(h, tl.trans(wpre))
    rest, _ = _tile_dot(H, W2, offs_n, M, N2, N1, lo + PRE_K // BLOCK_K, hi, False, BLOCK_M, BLOCK_N, BLOCK_K)
    acc += rest
    _phase2_store(acc, pid_n, split, B2, R, Y, WS, LOCKS, M, N2, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N)


@triton.jit
def _prefetch_tile(t, W2, N1, N2, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # asks the L2 for phase-2 tile t's weight slice, one 128-byte line (64 fp16) per address
    pid_n, _, lo, hi = _slice(t, N1, N2, SPLIT, BLOCK_N, BLOCK_K)
    rows = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N2 - 1)
    for kb in range(lo, hi):
        ks = tl.minimum(kb * BLOCK_K + tl.arange(0, BLOCK_K // 64) * 64, N1 - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [W2 + rows[:, None] * N1 + ks[None, :]],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_barrier(BAR, ERR, LIMIT: tl.constexpr):
    # The cooperative-groups pattern: the block's stores, one arrival (release: h is published;
    # acquire too, as the last arriver does not poll), polls, the block goes on. It needs every
    # program resident: the grid is the SM count and a kernel that launches fits one program per
    # SM (registers cap at 255 x 256 threads, shared memory is checked), while nothing else runs.
    # The counter only grows: ticket // grid names the launch, so graph replays (whose arguments
    # are frozen) need no epoch argument and no reset.
    tl.debug_barrier()
    grid = tl.num_programs(0)
    ticket = tl.atomic_add(BAR, 1, sem="acq_rel", scope="gpu")
    target = (ticket // grid + 1) * grid
    seen = ticket + 1
    polls = ticket * 0
    while (seen < target) & (polls < LIMIT):
        seen = tl.atomic_add(BAR, 0, sem="acquire", scope="gpu")
        polls += 1
    if seen < target:
        tl.atomic_xchg(ERR, 1)
    tl.debug_barrier()


@triton.jit(do_not_specialize=["M"])
def chain_kernel(X, W1, B1, W2, B2, R, H, Y, WS, LOCKS, BAR, ERR, M, K1, N1, N2, GATED: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PHASE: tl.constexpr, PREFETCH: tl.constexpr, LIMIT: tl.constexpr,
                 PRE_K: tl.constexpr = 0):
    # PHASE 0: both phases, one program per SM (persistent); 1 or 2: that phase, a tile per program.
    # PREFETCH 3 loads the program's first phase-2 weight columns (PRE_K of its slice) into
    # registers before phase 1, 4 after it (before the barrier); 1 and 2 ask the L2 instead
    pid, grid = tl.program_id(0), tl.num_programs(0)
    if PHASE == 0 and PREFETCH == 2:
        _prefetch_tile(pid, W2, N1, N2, SPLIT, BLOCK_N, BLOCK_K)
    if PREFETCH == 3:
        wpre = _preload(pid, W2, N1, N2, SPLIT, BLOCK_N, BLOCK_K, PRE_K)
    if PHASE != 2:
        for t in range(pid, tl.cdiv(N1, BLOCK_N), grid):
            _phase1_tile(t, X, W1, B1, H, M, K1, N1, GATED, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K)
    if PREFETCH == 4:
        wpre = _preload(pid, W2, N1, N2, SPLIT, BLOCK_N, BLOCK_K, PRE_K)
    if PHASE == 0:
        if PREFETCH == 1:
            _prefetch_tile(pid, W2, N1, N2, SPLIT, BLOCK_N, BLOCK_K)
        _grid_barrier(BAR, ERR, LIMIT)
    if PHASE != 1:
        for t in range(pid, tl.cdiv(N2, BLOCK_N) * SPLIT, grid):
            if PREFETCH >= 3:
                if t == pid:
                    _phase2_preloaded(t, wpre, H, W2, B2, R, Y, WS, LOCKS, M, N1, N2, HAS_BIAS, SPLIT, BLOCK_M,
                                      BLOCK_N, BLOCK_K, PRE_K)
                else:
                    _phase2_tile(t, H, W2, B2, R, Y, WS, LOCKS, M, N1, N2, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N,
                                 BLOCK_K)
            else:
                _phase2_tile(t, H, W2, B2, R, Y, WS, LOCKS, M, N1, N2, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N, BLOCK_K)


def split_of(n2: int, n1: int, c: dict, sms: int) -> int:
    """Phase 2's K split: the largest power of two (up to MAX_SPLIT, at least one K block per
    slice) keeping its tiles within the SMs."""
    tiles, blocks, split = triton.cdiv(n2, c["BLOCK_N"]), triton.cdiv(n1, c["BLOCK_K"]), 1
    while tiles * split * 2 <= sms and split * 2 <= min(blocks, MAX_SPLIT):
        split *= 2
    return split


def fits(shape: tuple, c: dict, shared: int) -> bool:
    """Whether phase 1's pipeline (num_stages - 1 buffers of the input and weight tiles, as
    Triton allocates them; the larger phase) fits a block's shared memory."""
    tile = 16 + (2 if shape[4] else 1) * c["BLOCK_N"]
    return (c["num_stages"] - 1) * 2 * tile * c["BLOCK_K"] <= shared


def operands(shape: tuple, device: str, dtype, seed: int = 0) -> dict:
    """One set of a shape's operands, its scratch (h, split-K partials, counters) and output;
    h and y start as NaN."""
    import torch

    m, k1, n1, n2, gated = shape
    g = torch.Generator(device).manual_seed(seed)
    rand = lambda *size, scale=1.0: (torch.randn(*size, generator=g, device=device) * scale).to(dtype)
    full = lambda size, v=0, dt=torch.int32: torch.full(size, v, device=device, dtype=dt)
    return dict(x=rand(m, k1), w1=rand(2 * n1 if gated else n1, k1, scale=k1 ** -0.5), b1=rand(n1, scale=0.1),
                w2=rand(n2, n1, scale=n1 ** -0.5), b2=rand(n2, scale=0.1), r=rand(m, n2),
                h=full((m, n1), float("nan"), dtype), y=full((m, n2), float("nan"), dtype),
                ws=full((MAX_SPLIT * 16 * (n2 + 128),), 0, torch.float32), locks=full((n2 // 16 + 1,)),
                bar=full((1,)), err=full((1,)))


def error_of(o: dict, shape: tuple) -> float:
    """max |y - y in float64| / max |y in float64|."""
    import torch.nn.functional as F

    n1, gated = shape[2], shape[4]
    x, w1, w2, r = o["x"].double(), o["w1"].double(), o["w2"].double(), o["r"].double()
    if gated:
        ref = (F.silu(x @ w1[:n1].T) * (x @ w1[n1:].T)) @ w2.T + r
    else:
        ref = F.gelu(x @ w1.T + o["b1"].double(), approximate="tanh") @ w2.T + o["b2"].double() + r
    return float((o["y"].double() - ref).abs().max() / ref.abs().max())


NAMES = ("x", "w1", "b1", "w2", "b2", "r", "h", "y", "ws", "locks", "bar", "err")  # chain_kernel's pointers
TYPES = ("fp16",) * 8 + ("fp32", "i32", "i32", "i32")


def binaries(shape: tuple, c: dict, split: int) -> list[dict]:
    """The constexprs and options (warps, stages) of each binary a config launches: the
    persistent kernel, and with PREFETCH 0 the two phases alone."""
    gated = shape[4]
    common = dict(GATED=gated, HAS_BIAS=not gated, SPLIT=split, BLOCK_M=16, BLOCK_N=c["BLOCK_N"],
                  BLOCK_K=c["BLOCK_K"], LIMIT=SPIN_LIMIT, num_warps=c["num_warps"], num_stages=c["num_stages"])
    phases = ((0, c["PREFETCH"]), (1, 0), (2, 0)) if c["PREFETCH"] == 0 else ((0, c["PREFETCH"]),)
    pre = pre_k(shape, c, split) if c["PREFETCH"] >= 3 else 0
    return [dict(common, PHASE=phase, PREFETCH=prefetch, PRE_K=pre) for phase, prefetch in phases]


def two_kernels(o: dict, shape: tuple, c: dict, split: int) -> None:
    """Phase 1 then phase 2, two launches of a tile per program."""
    one, two = binaries(shape, {**c, "PREFETCH": 0}, split)[1:]
    chain_kernel[(triton.cdiv(shape[2], c["BLOCK_N"]),)](*(o[n] for n in NAMES), *shape[:4], **one)
    chain_kernel[(triton.cdiv(shape[3], c["BLOCK_N"]) * split,)](*(o[n] for n in NAMES), *shape[:4], **two)


def persistent(o: dict, shape: tuple, c: dict, split: int, grid: int, limit: int = SPIN_LIMIT):
    """Both phases in one launch of `grid` programs; returns Triton's compiled kernel."""
    consts = {**binaries(shape, c, split)[0], "LIMIT": limit}
    return chain_kernel[(grid,)](*(o[n] for n in NAMES), *shape[:4], **consts)


def library(o: dict, shape: tuple) -> None:
    """torch's calls (cuBLAS), gate and up as one linear over the joined weight; replaces o["y"]."""
    import torch.nn.functional as F

    n1, gated = shape[2], shape[4]
    if gated:
        gu = F.linear(o["x"], o["w1"])
        o["y"] = F.linear(F.silu(gu[:, :n1]) * gu[:, n1:], o["w2"]) + o["r"]
    else:
        o["y"] = F.linear(F.gelu(F.linear(o["x"], o["w1"], o["b1"]), approximate="tanh"), o["w2"], o["b2"]) + o["r"]


def configs(grid: str = "") -> list[dict]:
    """The persistent configs of a grid 'KNOB=v1,v2;KNOB=v' over the defaults (the two-kernel path
    runs those with PREFETCH 0)."""
    knobs = {**KNOBS, **{k: [int(v) for v in vs.split(",")] for k, vs in (p.split("=") for p in grid.split(";") if p)}}
    every = [dict(zip(knobs, values)) for values in itertools.product(*knobs.values())]
    # PRE_ELEMS matters only where a program preloads (PREFETCH 3 and 4)
    return [c for c in every if c["PREFETCH"] >= 3 or c["PRE_ELEMS"] == knobs["PRE_ELEMS"][0]]


def check_cpu() -> None:
    """Both paths under the interpreter at awkward shapes in float32 against float64 (the
    persistent kernel as one program, called twice), and a barrier that cannot complete."""
    import torch

    bad = 0
    for shape, (bn, bk), split, path in itertools.product(
            ((3, 96, 80, 72, False), (3, 96, 80, 72, True), (1, 96, 80, 72, True)), ((32, 64), (16, 32)),
            (1, 2, 4), ("two kernels", "persistent", "persistent P=3", "persistent P=4")):
        # split 4 of 3 K blocks of 32: the last one empty; P=3 and 4 preload the first tile's slice
        c = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=3, PREFETCH=int(path[-1]) if "=" in path else 0,
                 PRE_ELEMS=2 * bn * bk)
        o = operands(shape, "cpu", torch.float32, seed=split)
        for _ in range(2):  # the second call's tickets name the second launch
            two_kernels(o, shape, c, split) if path == "two kernels" else persistent(o, shape, c, split, 1)
        err = error_of(o, shape)
        ok = err < 1e-4 and int(o["err"]) == 0 and int(o["locks"].abs().sum()) == 0
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {path:11s} {shape} {bn}x{bk} split {split}: error {err:.1e}, "
              f"flag {int(o['err'])}, barrier count {int(o['bar'])}", flush=True)
    o = operands(shape, "cpu", torch.float32)
    persistent(o, shape, c, 1, 2, limit=4)  # the interpreter runs programs in turn: the first gives up
    bad += int(o["err"]) != 1
    print(f"{'ok ' if int(o['err']) == 1 else 'BAD'} 2 programs run in turn: barrier flag {int(o['err'])}")
    print(f"{bad} checks failed" if bad else "all checks passed")
    if bad:
        raise SystemExit(1)


def build_only() -> None:
    """Compiles some configs' binaries for sm_90 (no GPU), checking the shared memory they need."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tritune.schedules.space import Limits

    limits, names = Limits.for_capability(9, 0), chain_kernel.arg_names
    cs = [c for c in configs() if c["BLOCK_N"] != 64 and c["num_stages"] == 4 and c["num_warps"] == 4]
    for (name, shape), c in itertools.product(list(SHAPES.items())[:2], cs):
        split = split_of(shape[3], shape[2], c, limits.sms)
        for consts in binaries(shape, c, split) if fits(shape, c, limits.shared_bytes) else ():
            opts = {k: consts.pop(k) for k in ("num_warps", "num_stages")}
            types = dict(zip(names, ["*" + t for t in TYPES] + ["i32"] * 4))
            sig = {a: "constexpr" if a in consts else types[a] for a in names}  # in the kernel's order
            attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a not in consts and a != "M"}
            k = triton.compile(ASTSource(chain_kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                               options=opts)
            print(f"{name} PHASE {consts['PHASE']} {c} split {split}: {k.metadata.shared} B shared", flush=True)
            assert k.metadata.shared <= limits.shared_bytes
    print("all builds passed")


def _build(items: list) -> int:
    """Compiles (shape, config, split) items for this process's GPU (fills Triton's disk cache)."""
    import torch

    types, built = dict(fp16=torch.float16, fp32=torch.float32, i32=torch.int32), 0
    for shape, c, split in items:
        try:
            for consts in binaries(shape, c, split):
                chain_kernel.warmup(*(types[t] for t in TYPES), *shape[:4], grid=(1,), **consts)
            built += 1
        except Exception:  # noqa: BLE001 - measure() meets it again and reports it
            continue
    return built


def caller(variant: str, shape: tuple, c: dict, sms: int):
    """One call of a variant's config on an operand set."""
    if variant == "library":
        return lambda o: library(o, shape)
    if variant == "two kernels":
        return lambda o: two_kernels(o, shape, c, c["SPLIT"])
    return lambda o: persistent(o, shape, c, c["SPLIT"], sms)


def measure(shape: tuple, fn, sets: list, err) -> dict:
    """us per call of fn over the operand sets, or why not (it fails, is wrong, or its barrier
    gave up); for the persistent kernel also its registers and shared memory."""
    from tritune.tuner.timing import Timing, graph_median_ms

    try:
        sets[0]["h"].fill_(float("nan")), sets[0]["y"].fill_(float("nan"))  # no earlier config's answer counts
        k = fn(sets[0])
        error = error_of(sets[0], shape)
        res = dict(regs=k.n_regs, shared=k.metadata.shared) if hasattr(k, "n_regs") else {}
        if int(err) or not error < 2e-2:
            return dict(us=None, why=f"wrong: error {error:.1e}, barrier flag {int(err)}", **res)
        us = graph_median_ms(Timing())([lambda o=o: fn(o) for o in sets]) * 1e3
        return dict(us=None, why="barrier gave up while timed", **res) if int(err) else dict(us=us, **res)
    except Exception as exc:  # noqa: BLE001 - a probe reports what does not run
        return dict(us=None, why=f"failed: {exc!r}"[:200])


def run_shape(name: str, shape: tuple, cs: list[dict], sms: int, gbps: float) -> dict:
    """Every variant and config of one shape, then the best of each variant (the persistent
    kernel's by PREFETCH) timed in turns; prints a table."""
    import torch

    from tritune.tuner.timing import COMPARE, graph_median_ms, in_turns, operand_sets

    m, k1, n1, n2, gated = shape
    wbytes = 2 * ((2 if gated else 1) * n1 * k1 + n2 * n1 + (0 if gated else n1 + n2))
    nbytes = wbytes + 2 * m * (k1 + 2 * n2)
    sets = operand_sets(lambda i: operands(shape, "cuda", torch.float16, seed=i), nbytes)
    err = sets[0]["err"]
    for o in sets[1:]:
        o["err"] = err  # one flag, checked after each config
    lib_sets = [dict(o) for o in sets]  # the library's outputs are its own
    runs = [("library", {})] + [(v, {**c, "SPLIT": split_of(n2, n1, c, sms)}) for c in cs  # two kernels: P=0 only
                                for v in ("two kernels", "persistent")[c["PREFETCH"] != 0:]]
    rows = []
    for variant, c in runs:
        for o in sets:
            o["locks"].zero_(), o["bar"].zero_()
        rows.append(dict(variant=variant, config=c, **measure(
            shape, caller(variant, shape, c, sms), lib_sets if variant == "library" else sets, err)))
        err.zero_()
    best = {}
    for r in sorted((r for r in rows if r["us"] is not None), key=lambda r: r["us"]):
        best.setdefault(r["variant"] + (f" P={r['config']['PREFETCH']}" if r["variant"] == "persistent" else ""), r)
    fns = {label: [lambda o=o, f=caller(r["variant"], shape, r["config"], sms): f(o)
                   for o in (lib_sets if label == "library" else sets)] for label, r in best.items()}
    turns = in_turns(fns, graph_median_ms(COMPARE), ROUNDS)
    turns = {label: [t * 1e3 for t in ts] for label, ts in turns.items()} if not int(err) else {}
    _table(name, shape, rows, best, turns, wbytes, nbytes, gbps)
    return dict(name=name, shape=shape[:4], gated=gated, weight_bytes=wbytes, bytes=nbytes, rows=rows,
                head_to_head={label: dict(config=best[label]["config"], us=ts) for label, ts in turns.items()})


def _table(name: str, shape: tuple, rows: list[dict], best: dict, turns: dict, wbytes: int, nbytes: int,
           gbps: float) -> None:
    """Each variant's best in the head-to-head (median over rounds), and the persistent saving."""
    from tritune.tuner.timing import paired_ratio

    failed = [r for r in rows if r["us"] is None]
    print(f"\n{name} {'x'.join(map(str, shape[:2]))} -> {shape[2]} -> {shape[3]}: {nbytes / gbps / 1e3:.2f} us at the "
          f"copy bandwidth; {len(rows) - len(failed)} ok, {len(failed)} failed", *failed[:3], sep="\n   ")
    print(f"   {'variant':15s} {'us':>7s} {'MB':>5s} {'GB/s':>6s} copy  best config (sweep us)")
    med = {label: statistics.median(ts) for label, ts in turns.items()}
    for label, us in med.items():
        print(f"   {label:15s} {us:7.2f} {wbytes / 1e6:5.1f} {nbytes / us / 1e3:6.0f} {100 * nbytes / us / 1e3 / gbps:3.0f}%  "
              f"{best[label]['config']} ({best[label]['us']:.2f})", flush=True)
    ours = min((label for label in med if label.startswith("persistent")), key=med.get, default=None)
    for other in ("two kernels", "library"):
        if ours and other in med:
            print(f"   {ours} saves {med[other] - med[ours]:.2f} us ({100 * (1 - paired_ratio(turns[ours], turns[other])):.1f}%"
                  f" by round) against {other}", flush=True)
    if not turns:
        print("   a barrier gave up in the head-to-head: no table")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder for chain_probe.json (a GPU run)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--grid", default="", help="knob values instead of the defaults, e.g. 'PREFETCH=0,1;num_warps=4'")
    p.add_argument("--check-cpu", action="store_true", help="correctness under TRITON_INTERPRET=1, no GPU")
    p.add_argument("--build-only", action="store_true", help="compile for sm_90, no GPU")
    args = p.parse_args()
    if args.check_cpu or args.build_only:
        return check_cpu() if args.check_cpu else build_only()
    if not args.out:
        p.error("--out is required for a GPU run")
    import torch

    from tritune.tuner.timing import copy_bandwidth_gbps

    props = torch.cuda.get_device_properties(0)
    sms, shapes = props.multi_processor_count, {name: SHAPES[name] for name in args.shapes}
    cs = {name: [c for c in configs(args.grid) if fits(s, c, props.shared_memory_per_block_optin)]
          for name, s in shapes.items()}
    # one build per binary: M is not specialised
    items = list({(s[1:], tuple(c.items())): (s, c, split_of(s[3], s[2], c, sms))
                  for name, s in shapes.items() for c in cs[name]}.values())
    # spawned: this process holds a CUDA context, which forked workers cannot use
    jobs = os.cpu_count()
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        built = sum(pool.map(_build, [items[i::jobs] for i in range(jobs)]))
    gbps = copy_bandwidth_gbps()
    print(f"{props.name}: {sms} SMs, {built} of {len(items)} configs built, copy {gbps:.0f} GB/s", flush=True)
    results = [run_shape(name, shape, cs[name], sms, gbps) for name, shape in shapes.items()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chain_probe.json").write_text(json.dumps(dict(device=props.name, sms=sms, copy_gbps=gbps,
                                                          results=results), default=str))


if __name__ == "__main__":
    main()
