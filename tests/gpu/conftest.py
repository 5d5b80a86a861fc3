"""The GPU suite's setup: float64 references never drop to tf32, and every kernel case of the
session is compiled in parallel first (the checks then load binaries). tests/conftest.py runs this
suite only with TRITUNE_GPU_TESTS=1 on a host with a CUDA GPU."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def no_tf32():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    yield


@pytest.fixture(scope="session")
def precompiled(request):
    """Compile every (expr, config) case selected in this session in the compile pool (the checks
    then load binaries); {(workload key, config): message} of those that failed to build."""
    from tritune.kernels.device import device_info
    from tritune.kernels.family import family
    from tritune.tuner.builder import Builder
    from tritune.tuner.task import device_target

    pairs = [(item.callspec.params["expr"], item.callspec.params["config"]) for item in request.session.items
             if "expr" in getattr(getattr(item, "callspec", None), "params", {})]
    builder = Builder(device_target(device_info()))
    try:
        futures = [(c, builder.submit(e, family(e.op).canonical_problem(e), [c])[0]) for e, c in pairs]
        built = [builder.result(f, c) for c, f in futures]
    finally:
        builder.close()
    return {(e.key, r.config): r.message[:300] for (e, _), r in zip(pairs, built) if r.status is not None}
