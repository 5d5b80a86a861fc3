"""Every family's template hash is part of each stored trial's device key: a change to it retires
the database's trials and the shipped recordings. These values pin the hashes, so that moving or
tidying code never changes them by accident; a deliberate template change updates them here (and
re-records what the shipped recordings need)."""
import pytest

from tritune.kernels.family import family, ops

PINNED = {
    "matmul": "e9b79b6723f8bdbc",
    "bmm": "e9b79b6723f8bdbc",
    "conv2d": "0963f5b4f9f1b7b3",
    "softmax": "2fe8777c40f74a89",
    "layernorm": "2fe8777c40f74a89",
    "gated": "ff43071314bde4f7",
    "wide": "30f81a3e707bcd07",
}


def test_every_family_is_pinned():
    assert set(ops()) == set(PINNED)


@pytest.mark.parametrize("op", sorted(PINNED))
def test_template_hash_unchanged(op):
    assert family(op).template_hash() == PINNED[op]
