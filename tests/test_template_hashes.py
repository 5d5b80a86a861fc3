"""Every family's template hash is part of each stored trial's device key: a change to it retires
the database's trials and the shipped recordings. These values pin the hashes, so that moving or
tidying code never changes them by accident; a deliberate template change updates them here (and
re-records what the shipped recordings need)."""
import pytest

from tritune.kernels.family import family, ops

PINNED = {
    "matmul": "6338062fb280132b",
    "bmm": "6338062fb280132b",
    "conv2d": "0963f5b4f9f1b7b3",
    "softmax": "2fe8777c40f74a89",
    "layernorm": "2fe8777c40f74a89",
    "gated": "9000f181a7c51ada",
    "wide": "b71d4c38b1389f64",
    "attention": "e2a0d7f596f7e120",
}


def test_every_family_is_pinned():
    assert set(ops()) == set(PINNED)


@pytest.mark.parametrize("op", sorted(PINNED))
def test_template_hash_unchanged(op):
    assert family(op).template_hash() == PINNED[op]


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
    # the GEMM templates grew a row-norm prologue: every contraction kernel without one is
    # generated exactly as before it, so the shipped recordings (plain contractions) still
    # describe today's kernels; the wide and gated kernels changed on purpose when they gained split-K
    from tritune.kernels.contraction import expr as contraction_expr
    from tritune.kernels.contraction import template as contraction_template
    from tritune.kernels.gated import expr as gated_expr
    from tritune.kernels.gated import template as gated_template
    from tritune.kernels.wide import expr as wide_expr
    from tritune.kernels.wide import template as wide_template

    assert _generated_sources(contraction_template, contraction_expr.AWKWARD) == "79b06303da7870ab"
    assert _generated_sources(gated_template, gated_expr.AWKWARD) == "6065249747ae3b0c"
    assert _generated_sources(wide_template, wide_expr.AWKWARD) == "30a068ae43f38e44"
