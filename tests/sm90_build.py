"""Compile cases for sm_90 in a process without TRITON_INTERPRET; print one JSON line per case."""
import json
import sys

from triton.backends.compiler import GPUTarget

from tritune.kernels.family import expr_from_dict, family
from tritune.schedules.config import Config

for line in sys.stdin:
    case = json.loads(line)
    expr, config = expr_from_dict(case["expr"]), Config.of(case["config"])
    fam = family(case["expr"]["op"])
    compiled = fam.compile(expr, config, fam.canonical_problem(expr), GPUTarget("cuda", 90, 32))
    print(json.dumps({"shared": compiled.metadata.shared, "wgmma": "wgmma" in compiled.asm["ptx"],
                      "warps": compiled.metadata.num_warps,
                      "ptx": compiled.asm["ptx"] if case.get("ptx") else None}), flush=True)
