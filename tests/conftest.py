"""Test setup, before tritune is imported: a private kernel cache and database; the CPU tests run
kernels under Triton's interpreter. With TRITUNE_GPU_TESTS=1 the GPU suite (tests/gpu) runs on real
kernels instead, on a host with a CUDA GPU, and the CPU tests are skipped:

    TRITUNE_GPU_TESTS=1 python -m pytest -q tests/gpu

Tiers (pyproject.toml's addopts leave out tests marked `system`): `python -m pytest -q` is the unit
tier; `-m system` the system tier (process kills, clusters, sm_90 and real Triton builds,
whole-model compiles, long searches); `-m "system or not system"` the full suite. No test under
tests/gpu is marked `system`, so the GPU command above runs all of them.

Layout: the CPU tests lie in one folder per subpackage of tritune (tests/tuner, tests/kernels, ...,
each by what it mainly tests; the CLI is tritune/tuner/cli, so its tests are under tests/tuner),
tests/project checks what is not one package's (the layering, the docs, the scripts), and
tests/helpers holds the harness modules they import (stand-in GPUs and workers, small models,
small databases; not tests). Test modules are imported by their basename (no __init__.py files), so
every test module's name is unique across tests/; this file puts tests/helpers and each test folder
on sys.path, so `import fakes` or `from test_cli import cli` works from any folder. Data files stay
in tests/fixtures.
"""
import os
import sys
import tempfile
from pathlib import Path

import pytest

GPU_TESTS = os.environ.get("TRITUNE_GPU_TESTS", "") not in ("", "0")
GPU_SUITE = Path(__file__).parent / "gpu"
HELPERS = Path(__file__).parent / "helpers"

# the harness modules, and test modules that others import (fixtures, shared cases), by basename
for _folder in [HELPERS, *sorted(p for p in Path(__file__).parent.iterdir() if any(p.glob("test_*.py")))]:
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

if GPU_TESTS:
    os.environ.pop("TRITON_INTERPRET", None)  # the GPU suite checks compiled kernels
else:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="tritune-test-"))
os.environ["TRITUNE_DB"] = os.path.join(os.environ["TRITUNE_CACHE_DIR"], "default.db")


def pytest_collection_modifyitems(config, items):
    """tests/gpu runs only with TRITUNE_GPU_TESTS=1 and a CUDA GPU; every other test only without it."""
    gpu = GPU_TESTS and _cuda()
    skip_gpu = pytest.mark.skip(reason="the GPU suite: set TRITUNE_GPU_TESTS=1 on a host with a CUDA GPU"
                                if not GPU_TESTS else "TRITUNE_GPU_TESTS=1, but torch finds no CUDA GPU")
    skip_cpu = pytest.mark.skip(reason="a CPU test (Triton's interpreter): unset TRITUNE_GPU_TESTS to run it")
    for item in items:
        on_gpu = GPU_SUITE in Path(str(item.fspath)).parents
        if on_gpu and not gpu:
            item.add_marker(skip_gpu)
        elif not on_gpu and GPU_TESTS:
            item.add_marker(skip_cpu)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
