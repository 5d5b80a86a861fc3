"""Tracing tuned ops with real JIT functions (no interpreter) on fake CUDA tensors, in a subprocess:
what AOT autograd hands Inductor, and which tensors Inductor reads from a kernel's TTIR that it
writes. `run(code)` runs PREAMBLE + code and returns its stdout."""
import os
import subprocess
import sys

PREAMBLE = """
import torch
import triton
from triton.backends.compiler import GPUTarget
from torch._subclasses.fake_tensor import FakeTensorMode


class H100:  # the driver Inductor asks for a target when it reads which tensors a kernel writes
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(H100())
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from tritune.kernels.backend import tuned_op
from tritune.schedules.config import Config
"""


def run(code: str, cache_dir) -> str:
    """stdout of PREAMBLE + code in a fresh process without TRITON_INTERPRET (kernels cached in `cache_dir`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITUNE_CACHE_DIR"] = str(cache_dir)
    proc = subprocess.run([sys.executable, "-c", PREAMBLE + code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
