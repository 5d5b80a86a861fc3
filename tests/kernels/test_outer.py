"""Outer products (inner dimension 1) become broadcast multiplies in a compiled graph: the same
values, one library call fewer; real contractions stay."""
import torch

from tritune.kernels.backend.graph import aten_graph
from tritune.kernels.backend.outer import outer_products

A = torch.ops.aten


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_outer_products_become_multiplies_and_contractions_stay():
    def fn(freq, pos, x, w):
        return torch.bmm(freq, pos).cos(), torch.mm(x[:, :1], w[:1]), torch.mm(x, w)

    args = (torch.randn(2, 32, 1), torch.arange(5.0).expand(2, 1, 5).contiguous(), torch.randn(3, 4),
            torch.randn(4, 6))
    gm = aten_graph(fn, args)
    assert outer_products(gm) == 2
    gm.recompile()
    targets = _targets(gm)
    assert A.bmm.default not in targets and targets.count(A.mm.default) == 1 and targets.count(A.mul.Tensor) == 2
    for got, want in zip(gm(*args), fn(*args)):
        assert got.shape == want.shape and torch.equal(got, want)


def test_a_graph_without_outer_products_is_left_alone():
    gm = aten_graph(lambda a, b: torch.bmm(a, b), (torch.randn(2, 3, 2), torch.randn(2, 2, 4)))
    before = _targets(gm)
    assert outer_products(gm) == 0 and _targets(gm) == before
