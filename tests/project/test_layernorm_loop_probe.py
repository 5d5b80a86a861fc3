"""The kernel of scripts/probes/layernorm_loop_probe.py (a LayerNorm summed inside a projection's K
loop) against float64 under the interpreter, at awkward shapes and with rows far from zero."""
import pytest
import torch

from scripts.probes import layernorm_loop_probe as probe
from tritune.tuner.worker.candidate import rel_error

CONFIG = dict(BLOCK_N=16, BLOCK_K=32, num_warps=4, num_stages=2)


def _operands(m: int, n: int, k: int, offset: float) -> tuple:
    gen = torch.Generator().manual_seed(1000 * m + n + k)
    r = lambda *s: torch.randn(*s, generator=gen)
    return ((r(m, k) + offset).half(), (r(n, k) / k**0.5).half(), (1 + r(k) / 4).half(), (r(k) / 4).half(),
            r(n).half())


@pytest.mark.parametrize("m, n, k, offset", [(5, 40, 200, 0.0), (16, 24, 64, 0.0), (1, 33, 96, 0.0),
                                             (3, 16, 130, 50.0)])
def test_the_in_loop_layernorm_matches_float64(m, n, k, offset):
    x, w, g, b, bias = _operands(m, n, k, offset)
    got = probe.ln_gemm(x, w, g, b, bias, 1e-5, CONFIG)
    assert rel_error(got, probe.reference(x, w, g, b, bias, 1e-5)) <= 5e-3


def test_a_kernel_without_the_mean_term_is_caught(monkeypatch):
    monkeypatch.setattr(probe, "SOURCE", probe.SOURCE.replace("acc - mean_d[:, None] * acc_g", "acc"))
    x, w, g, b, bias = _operands(3, 16, 130, 50.0)
    got = probe.ln_gemm(x, w, g, b, bias, 1e-5, CONFIG)
    assert rel_error(got, probe.reference(x, w, g, b, bias, 1e-5)) > 5e-2
