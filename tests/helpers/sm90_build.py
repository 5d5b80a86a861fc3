"""Compile cases for sm_90 in a process without TRITON_INTERPRET; print one JSON line per case.
A case with "replay" builds what a compiled model launches instead: the call site's specialised
kernel, with the arguments the site passes (None for the pointers it never touches)."""
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tritune.kernels.family import expr_from_dict, family
from tritune.schedules.config import Config

TARGET = GPUTarget("cuda", 90, 32)


def replay(expr, config):
    """The site's launch, captured on fake CUDA operands, compiled as Triton would compile it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tritune.kernels.backend import sites, tuned_op

    launched = []

    class Capture:  # stands in for wrap_triton(fn)[grid]
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((self.fn, args, kwargs))

    sites.wrap_triton = Capture
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "bool": torch.bool}
    dtype = dtypes[expr.dtype]
    with FakeTensorMode():
        def empty(*shape):
            return torch.empty(shape, dtype=dtype, device="cuda")

        def weight(n):  # the graph's [K, N] operand of a weight stored [N, K] (or [K, N])
            return empty(n, expr.k).t() if expr.trans_b else empty(expr.k, n)
        site = tuned_op.site(tuned_op.spec_of(expr, config))
        norm = None if getattr(expr, "norm_eps", None) is None else empty(expr.k)  # a row norm's weight
        if expr.op == "attention":
            mask = None if expr.mask is None else torch.empty(expr.mask_shape(), dtype=dtypes[expr.mask], device="cuda")
            tables = [empty(*expr.rope_shape(rows, lanes)) if lanes else None
                      for rows, lanes in ((expr.lq, expr.rope_q), (expr.lk, expr.rope_k)) for _ in "cs"]
            if expr.rope_pos:  # each side's positions and frequencies instead
                kinds = {"i64": torch.int64, "i32": torch.int32}
                tables = [t if t is None else
                          torch.empty(t.shape[:3] + (1,), dtype=kinds[expr.rope_pos], device="cuda") if i % 2 == 0
                          else torch.empty(t.shape[-1] // 2, dtype=dtypes[expr.rope_freq], device="cuda")
                          for i, t in enumerate(tables)]
            site(empty(expr.batch, expr.heads, expr.lq, expr.d), *[empty(expr.batch, expr.kv_heads, expr.lk, expr.d)] * 2,
                 mask, *tables)
        elif expr.op == "wide":
            site(empty(expr.m, expr.k), [weight(n) for n in expr.ns], [empty(n) for n in expr.ns] if expr.bias else [],
                 norm)
        elif expr.op == "gated":
            site(empty(expr.m, expr.k), weight(expr.n), weight(expr.n), None, None, norm)
        else:
            norm_bias = empty(expr.k) if getattr(expr, "layer_norm", False) else None  # a LayerNorm's bias
            site(empty(expr.m, expr.k), weight(expr.n), empty(expr.n) if expr.has_bias else None, [], norm, norm_bias)
    (fn, args, kwargs), = launched
    values = {**dict(zip(fn.arg_names, args)), **kwargs}
    types = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32",
             torch.int64: "*i64", torch.bool: "*i1"}
    signature = {n: types[values[n].dtype] if isinstance(values[n], torch.Tensor) else "constexpr"
                 for n in fn.arg_names}
    constants = {(i,): values[n] for i, n in enumerate(fn.arg_names) if signature[n] == "constexpr"}
    # pointers 16-byte aligned, as the JIT and Inductor find a fresh allocation's
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if signature[n] != "constexpr"}
    options = {"num_warps": kwargs["num_warps"], "num_stages": kwargs["num_stages"]}
    return triton.compile(ASTSource(fn, signature, constants, attrs), target=TARGET, options=options), \
        [n for n in fn.arg_names if values.get(n, 0) is None]


for line in sys.stdin:
    case = json.loads(line)
    expr, config = expr_from_dict(case["expr"]), Config.of(case["config"])
    fam = family(case["expr"]["op"])
    nones = None
    if case.get("replay"):
        compiled, nones = replay(expr, config)
    else:
        compiled = fam.compile(expr, config, fam.canonical_problem(expr), TARGET)
    print(json.dumps({"shared": compiled.metadata.shared, "wgmma": "wgmma" in compiled.asm["ptx"],
                      "warps": compiled.metadata.num_warps, "nones": nones,
                      "launch_pdl": bool(getattr(compiled.metadata, "launch_pdl", False)),
                      "ptx": compiled.asm["ptx"] if case.get("ptx") else None}), flush=True)
