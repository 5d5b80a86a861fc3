"""Compile cases for sm_90 in a process without TRITON_INTERPRET; print one JSON line per case."""
import json
import sys

from triton.backends.compiler import GPUTarget

from tritune.kernels.build import canonical_problem, compile_kernel
from tritune.kernels.expr import Matmul
from tritune.schedules.config import Config

for line in sys.stdin:
    case = json.loads(line)
    expr, config = Matmul.from_dict(case["expr"]), Config.of(case["config"])
    compiled = compile_kernel(expr, config, canonical_problem(expr), GPUTarget("cuda", 90, 32))
    print(json.dumps({"shared": compiled.metadata.shared, "wgmma": "wgmma" in compiled.asm["ptx"]}), flush=True)
