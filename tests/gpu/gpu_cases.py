"""The cases of the GPU suite: compiled kernels of every op family, each against a float64
reference on the GPU, at every dtype (bf16 included, which the interpreter computes wrongly),
awkward shapes, layouts, batch and every epilogue (general ones with every extra input kind:
residual, row and column vectors, constants, a nested chain); every knob of the contraction
template (split-K, TMA loads, the persistent loop, warp specialisation) with them; the gated dual
GEMM with every activation, both ways of feeding its MMA (FUSE), both weight layouts and biases;
split-K in the wide and gated kernels at decode sizes, with and without a row norm; attention at
decode shapes (Llama's folded query heads over one key or a cache, a sequence over 4096 keys);
the other families' examples with a few seeded random configs of their space; and every library
candidate. Each case is (expression, config); the lists are built the same way every run."""
import itertools

import numpy as np

from tritune.kernels.attention.expr import Attention
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Binary, Clamp, Gelu, Input, Relu, Scale, Unary
from tritune.kernels.family import REGISTRY, family
from tritune.kernels.gated.expr import ACTIVATIONS, Gated
from tritune.kernels.wide.expr import Wide
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.schedules.space import Limits

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
PER_EXPR = 3  # seeded random configs of each other family's example


def knob_config(knobs: dict, dtype: str = "fp16") -> Config:
    """A config with these template knobs: the big tile for the persistent loop and warp
    specialisation, else the small one without unrolling; fp32 takes K steps of 32 (shared memory)."""
    if "PERSISTENT" in knobs or "WARP_SPEC" in knobs:
        return TILE.replace(BLOCK_K=32 if dtype == "fp32" else 64, **knobs)
    return SMALL.replace(UNROLL=1, **knobs)


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
        expr = Matmul(1000, 520, 1576, batch=1 if "PERSISTENT" in knobs else 2, dtype=dtype, trans_a=lay[0] == "t",
                      trans_b=lay[1] == "t", epilogue=epi)
        out.append((expr, knob_config(knobs, dtype)))
    return out + norm_cases()


def norm_cases() -> list:
    """The RMSNorm prologue: the family's examples, and decode-sized projections (a row, 16 rows)
    in every loop it may take (pointer or tensor-descriptor loads, the persistent loop), every dtype."""
    out = [(e, c) for e in family("matmul").examples() if e.norm_eps is not None for c in (TILE, SMALL.replace(UNROLL=1))]
    loops = itertools.cycle(({}, dict(TMA=1), dict(TMA=2), dict(PERSISTENT=1), dict(PERSISTENT=2, TMA=1)))
    for m, dtype in itertools.product((1, 16), ("fp16", "bf16", "fp32")):
        epi = (BiasAdd(), Binary("add", Input("mn", dtype))) if m == 16 else ()
        expr = Matmul(m, 4000, 2048, dtype=dtype, trans_b=True, epilogue=epi, norm_eps=1e-6)
        out.append((expr, SMALL.replace(UNROLL=1, BLOCK_K=32 if dtype == "fp32" else 128, **next(loops))))
        # LayerNorm (GPT-2's [K, N] weights, GPT-NeoX's [N, K]), K no multiple of a step
        layer = Matmul(m, 3000, 776, dtype=dtype, trans_b=m == 16, epilogue=epi[:1] + (Gelu(),), norm_eps=1e-5,
                       layer_norm=True)
        out.append((layer, SMALL.replace(UNROLL=1, BLOCK_K=32 if dtype == "fp32" else 128, **next(loops))))
        out.append((layer, SMALL.replace(UNROLL=1, BLOCK_K=32 if dtype == "fp32" else 128, SPLIT_K=3)))
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
        expr = Matmul(1000, 520, 1576, batch=1 if "PERSISTENT" in knobs else 2, dtype=dtype, epilogue=epi)
        out.append((expr, knob_config(knobs, dtype)))
    layouts = itertools.cycle((True, False))
    for (act, dtype, fuse), bias in zip(itertools.product(ACTIVATIONS, ("fp16", "bf16", "fp32"), (0, 1)),
                                       itertools.cycle((False, True, True))):
        if fuse and dtype == "fp32":
            continue  # joined fp32 tiles do not compile: the space never offers them
        expr = Gated(1000, 520, 1576, dtype=dtype, activation=act, trans_b=next(layouts), bias=bias)
        tile = TILE.replace(BLOCK_K=32 if dtype == "fp32" else 64, FUSE=fuse, UNROLL=1)
        out.append((expr, tile if bias else SMALL.replace(FUSE=fuse)))
    return out


def family_cases(limits: Limits, per_expr: int = PER_EXPR) -> list:
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
    return out + split_cases() + pdl_cases() + gemv_cases() + attention_cases()


def pdl_cases() -> list:
    """Programmatic dependent launch (1) and with the weights prefetched (2) in every GEMM family at
    decode sizes: both weight layouts, split-K, a row norm, pointer and tensor-descriptor loads,
    edges along N and K (the prefetch's addresses are clamped there)."""
    out = []
    loads = itertools.cycle(({}, dict(TMA=1)))
    for pdl, dtype in itertools.product((1, 2), ("fp16", "bf16", "fp32")):
        tile = SMALL.replace(UNROLL=1, BLOCK_K=32 if dtype == "fp32" else 128, PDL=pdl)
        out += [(Matmul(16, 2000, 1576, dtype=dtype, trans_b=True, epilogue=(BiasAdd(),)), tile.replace(**next(loads))),
                (Matmul(1, 1000, 2048, dtype=dtype), tile.replace(SPLIT_K=4)),
                (Wide(16, (2048, 512, 520), 2048, dtype=dtype, norm_eps=1e-6), tile.replace(**next(loads))),
                (Gated(1, 1000, 2000, dtype=dtype, norm_eps=1e-6), tile.replace(SPLIT_K=2, FUSE=int(dtype == "bf16")))]
    return out


GEMV_TILE = Config.of(BLOCK_M=1, BLOCK_N=4, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1, GEMV=1)


def gemv_cases() -> list:
    """The GEMV path (no tensor cores) of every GEMM family at a few rows: both weight layouts,
    edges along N and K, split-K, unrolling, biases, a row norm, every dtype."""
    out = []
    for dtype in ("fp16", "bf16", "fp32"):
        tile = GEMV_TILE.replace(BLOCK_K=64 if dtype == "fp32" else 256)
        out += [(Matmul(1, 2000, 1576, dtype=dtype, trans_b=True, epilogue=(BiasAdd(),)), tile.replace(UNROLL=2)),
                (Matmul(3, 1000, 2048, dtype=dtype), tile.replace(BLOCK_M=4, BLOCK_N=64, BLOCK_K=32, SPLIT_K=4)),
                (Matmul(1, 4000, 1030, dtype=dtype, epilogue=(BiasAdd(),)), tile.replace(BLOCK_N=128, BLOCK_K=64, num_stages=4)),
                (Matmul(1, 4000, 2048, dtype=dtype, trans_b=True, norm_eps=1e-6), tile.replace(BLOCK_N=8, BLOCK_K=512)),
                (Matmul(1, 3000, 776, dtype=dtype, norm_eps=1e-5, layer_norm=True), tile.replace(BLOCK_N=64, BLOCK_K=32,
                                                                                                SPLIT_K=4)),
                (Matmul(2, 3000, 776, dtype=dtype, trans_b=True, epilogue=(BiasAdd(),), norm_eps=1e-5, layer_norm=True),
                 tile.replace(BLOCK_M=2, BLOCK_N=4)),
                (Wide(1, (2048, 512, 520), 2048, dtype=dtype, norm_eps=1e-6), tile.replace(BLOCK_N=8)),
                (Wide(2, (1000, 300), 1576, dtype=dtype, bias=True), tile.replace(BLOCK_M=2, SPLIT_K=2)),
                (Wide(1, (1024, 1024, 1024), 1024, dtype=dtype, bias=True, trans_b=False), tile.replace(BLOCK_N=64, BLOCK_K=128)),
                (Gated(1, 1000, 2000, dtype=dtype, norm_eps=1e-6), tile.replace(BLOCK_N=2, FUSE=0)),
                (Gated(4, 1000, 2048, dtype=dtype, bias=True, trans_b=False), tile.replace(BLOCK_M=4, BLOCK_N=32, BLOCK_K=32,
                                                                                            SPLIT_K=2, FUSE=0))]
    return out


def split_cases() -> list:
    """Split-K in the wide and gated kernels at decode sizes (a row, 16 rows), with and without a
    row norm, every dtype, pointer and tensor-descriptor loads, both ways of feeding the gated MMA."""
    out = []
    loads = itertools.cycle(({}, dict(TMA=1)))
    for m, dtype, norm in itertools.product((1, 16), ("fp16", "bf16", "fp32"), (None, 1e-6)):
        tile = SMALL.replace(UNROLL=1, BLOCK_K=32 if dtype == "fp32" else 128, **next(loads))
        out.append((Wide(m, (2048, 512, 512), 2048, dtype=dtype, bias=m == 16, norm_eps=norm), tile.replace(SPLIT_K=4)))
        for fuse in (0, 1) if dtype != "fp32" else (0,):
            out.append((Gated(m, 1000, 2048, dtype=dtype, bias=m == 1, norm_eps=norm), tile.replace(SPLIT_K=3, FUSE=fuse)))
    return out


# decode: Llama's 4 query heads per k/v head folded into its query rows (one new key, or a cache of
# 1024 with a mask per sequence), 16 sequences of one row over a cache (output [B, Lq, H, D] as the
# memory-efficient kernel lays it out), one sequence over 4096 keys, speculative tokens with a
# boolean mask per sequence and token
ATTENTION = [dict(batch=16, heads=4, lq=4, lk=1, d=128, mask="{dtype}", mask_dims="b"),
             dict(batch=16, heads=4, lq=4, lk=1024, d=128, mask="{dtype}", mask_dims="bk"),
             dict(batch=16, heads=16, lq=1, lk=1000, d=64, out_order="bqhd"),
             dict(batch=1, heads=16, lq=1, lk=4096, d=128),
             dict(batch=4, heads=8, lq=5, lk=777, d=80, mask="bool", mask_dims="bqk")]
ATTENTION_CONFIGS = [Config.of(BLOCK_N=n, DOT=dot, num_warps=w, num_stages=st, SPLIT=split)
                     for n, dot, w, st, split in ((16, 0, 1, 1, 1), (64, 0, 4, 1, 1), (128, 0, 8, 1, 1),
                                                  (32, 1, 4, 2, 1), (64, 1, 4, 3, 1), (128, 1, 8, 2, 1),
                                                  (64, 0, 4, 1, 8), (64, 1, 4, 2, 2), (32, 1, 4, 3, 16))]


def attention_cases() -> list:
    """Attention at decode shapes in fp16 and bf16, each with broadcast and MMA products over key
    blocks of several widths, unsplit and split over several programs (those its space keeps), and
    seeded random configs of its space."""
    out = []
    for i, (fields, dtype) in enumerate(itertools.product(ATTENTION, ("fp16", "bf16"))):
        expr = Attention(**{k: v.format(dtype=dtype) if k == "mask" else v for k, v in fields.items()}, dtype=dtype)
        space = family("attention").space(expr, Limits.for_capability(9, 0))
        configs = [c for c in ATTENTION_CONFIGS if space.valid(c)]
        configs += space.sample(np.random.default_rng(i), PER_EXPR, exclude=configs)
        out += [(expr, c) for c in configs]
    return out


def library_cases() -> list:
    """Every library candidate of the epilogue cases and of every other family's examples."""
    exprs = [Matmul(77, 95, 130, batch=b, dtype=d, epilogue=e) for e, d, b in
             itertools.product(EPILOGUES + GENERAL + [(BiasAdd(), Relu())], ("fp16", "bf16", "fp32"), (1, 2))]
    exprs += [e for op in REGISTRY if op not in ("matmul", "bmm") for e in family(op).examples()]
    return [(e, Config.of(library=name)) for e in exprs for name in family(e.op).libraries(e)]


def route_cases() -> list[tuple[dict, str | None]]:
    """(knobs, torch.compile mode) of the replay route: every knob in the default mode; with CUDA
    graphs the plain kernel and split-K (its scratch is allocated per call: it must stay inside
    the graph's pool)."""
    return [(knobs, None) for knobs in [{}] + KNOBS] + [({}, "reduce-overhead"), (KNOBS[0], "reduce-overhead")]


def store_defaults(tasks: list, path, config: Config | None = None, gemm_knobs: dict | None = None) -> str:
    """A database where each task's workload has its family's default config (or `config`; the GEMM
    families' with `gemm_knobs` set) as its one trial, so that every site replays without a tuning
    run (a check of the replay, not a measurement)."""
    from tritune.kernels.device import device_info
    from tritune.kernels.family import device_key

    with Database(path) as db:
        for task in tasks:
            expr = task.expr
            db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
            chosen = config or family(expr.op).default_config(expr)
            if gemm_knobs and expr.op in ("matmul", "bmm", "gated", "wide"):
                chosen = chosen.replace(**gemm_knobs)
            best = MeasureResult(chosen, Status.OK, *[1.0] * 4)
            db.save(expr.key, device_key(device_info(), expr.op), [best])
    return str(path)
