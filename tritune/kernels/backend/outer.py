"""Outer products as broadcast multiplies: a mm or bmm whose inner dimension is 1 (rotary
embeddings' positions x frequencies, in fp32) computes one product per output element, which a
multiply of the operands' broadcast views computes exactly as well (each element is one rounded
product either way; with tf32 allowed, the library would also round the operands). Inductor keeps
such a bmm a library call of its own (a ~3 us fp32 GEMM launch in every decode step); as a
multiply it fuses with the cos and sin that read it.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from tritune.kernels.backend.epilogue_match import val

A = torch.ops.aten


def outer_products(gm: fx.GraphModule) -> int:
    """Replace every mm / bmm of inner dimension 1 in `gm`'s graph by a broadcast multiply of its
    operands; how many were replaced (the caller recompiles the graph)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (A.mm.default, A.bmm.default):
            continue
        a, b = node.args[:2]
        av, bv = val(a), val(b)
        if not (isinstance(av, torch.Tensor) and isinstance(bv, torch.Tensor)):
            continue
        if av.shape[-1] != 1 or av.dtype != bv.dtype:
            continue
        with gm.graph.inserting_before(node):
            product = gm.graph.call_function(A.mul.Tensor, (a, b))  # [.., M, 1] * [.., 1, N] -> [.., M, N]
        product.meta["val"] = val(node)
        node.replace_all_uses_with(product)
        gm.graph.erase_node(node)
        count += 1
    return count
