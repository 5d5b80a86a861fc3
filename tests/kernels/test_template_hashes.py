"""Every family's template key is part of each stored trial's device key: a change to it retires
the database's trials. The key is the compiled text of the family's sources and its template
version (`tritune.kernels.template_key`), so comments, docstrings and blank lines never move it.
These values pin the keys, so that moving or tidying code never changes them by accident; a
deliberate change of a template's code (or of its `template_version`) updates them here, and
removes the family from BYTE_KEYS: its trials stored before compiled-text keys are retired with
the code they were measured with."""
import pytest

from tritune.kernels.family import family, ops
from tritune.kernels.former_keys import former_templates

PINNED = {
    "matmul": "0fe0321c3146997d",
    "bmm": "0fe0321c3146997d",
    "conv2d": "a6b76c5fdac79a87",
    "softmax": "e83d52c2a384565a",
    "layernorm": "e83d52c2a384565a",
    "gated": "be9b52ff6f7165b8",
    "wide": "9bcac5b7a3a87b1a",
    "attention": "951de0490466dcd1",
}
# each family's last key before compiled-text keys (a hash of its sources' bytes), of the same code
# as PINNED's: `tune-cli carry-over` moves the trials stored under them to today's keys
BYTE_KEYS = {
    "matmul": "e90c416ba8874e75",
    "bmm": "e90c416ba8874e75",
    "conv2d": "0963f5b4f9f1b7b3",
    "softmax": "2fe8777c40f74a89",
    "layernorm": "2fe8777c40f74a89",
    "gated": "3a3e1857e753eff7",
    "wide": "4c79e208893eb38b",
    "attention": "147e70b24097f6d0",
}


def test_every_family_is_pinned():
    assert set(ops()) == set(PINNED)


@pytest.mark.parametrize("op", sorted(PINNED))
def test_template_hash_unchanged(op):
    assert family(op).template_hash() == PINNED[op]


@pytest.mark.parametrize("op", sorted(BYTE_KEYS))
def test_trials_of_the_byte_keys_carry_over(op):
    assert former_templates(op) == {BYTE_KEYS[op]: PINNED[op]}


def _generated_sources(module, examples) -> str:
    """The sha256 (16 hex) of the generated source of every awkward example without a norm of one
    GEMM family, generic and specialised."""
    import hashlib

    digest = hashlib.sha256()
    for expr in examples:
        if getattr(expr, "norm_eps", None) is None:
            for specialize in (False, True):
                digest.update(module.source(expr, specialize).encode())
    return digest.hexdigest()[:16]


def test_generated_kernels_without_a_norm_unchanged():
    # the GEMM templates changed on purpose when they gained a row-norm prologue (RMSNorm, then
    # LayerNorm in the plain contraction), split-K (wide and gated), programmatic dependent launch
    # (PDL), the GEMV path, and the epilogue's bias and extra inputs loaded before the K loop; a
    # PDL=0, GEMV=0 kernel without an epilogue input compiles to the code it did before
    # (test_kernels_without_early_launch_compile_as_before)
    from tritune.kernels.contraction import expr as contraction_expr
    from tritune.kernels.contraction import template as contraction_template
    from tritune.kernels.gated import expr as gated_expr
    from tritune.kernels.gated import template as gated_template
    from tritune.kernels.wide import expr as wide_expr
    from tritune.kernels.wide import template as wide_template

    assert _generated_sources(contraction_template, contraction_expr.AWKWARD) == "8cf174299eb0237c"
    assert _generated_sources(gated_template, gated_expr.AWKWARD) == "43d60aa8fcecc5cc"
    assert _generated_sources(wide_template, wide_expr.AWKWARD) == "306c28756e3aaeb8"


# sm_90 PTX (debug lines stripped) of plain contractions, pinned per Triton version: taken before
# the PDL knob existed, so the shipped recordings (plain contractions, no PDL) still describe the
# kernels a PDL=0 config builds. The third has a bias and a residual: its pin moved when the
# epilogue's operands came to be loaded in one place (before the K loop for small tiles, after
# it for this one)
PTX_BEFORE_PDL = {"3.9.0": ["d30ea39af516ddbe", "307b7580bbf372b3", "38861c618ce7ab70"]}


@pytest.mark.system
def test_kernels_without_early_launch_compile_as_before():
    import hashlib
    import re

    import triton

    from test_codegen_sm90 import CASES, EPILOGUE, build_sm90
    from tritune.kernels.contraction.expr import Matmul
    from tritune.schedules.config import Config

    if triton.__version__ not in PTX_BEFORE_PDL:
        pytest.skip(f"no PTX pinned for Triton {triton.__version__}")
    skinny = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=3, UNROLL=1)
    cases = [(Matmul(16, 2048, 2048, trans_b=True), Config.of(skinny, TMA=1)),
             (Matmul(16, 2048, 5632, trans_b=False, dtype="fp32"), Config.of(skinny, BLOCK_K=64, SPLIT_K=2)),
             (Matmul(4096, 4096, 4096, epilogue=EPILOGUE), Config.of(CASES[0][1], TMA=2, PERSISTENT=1))]

    def code(ptx: str) -> str:  # without source locations, which move with any edit of the template
        kept = [line for line in ptx.splitlines() if not re.match(r"\s*(\.loc|\.file|//)", line)]
        return "\n".join(kept).split(".section\t.debug")[0]
    got = [hashlib.sha256(code(r["ptx"]).encode()).hexdigest()[:16] for r in build_sm90(cases, ptx=True)]
    assert got == PTX_BEFORE_PDL[triton.__version__]
