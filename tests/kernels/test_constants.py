"""Values a compiled graph computes from no input become constants (`fold_constants`): a decoder's
causal mask is computed once, the graph's outputs stay the same, and nothing that depends on an
input, a weight or a buffer, nothing random and nothing the graph writes to is folded."""
import copy

import pytest
import torch
from torch._guards import detect_fake_mode

from tritune.kernels.backend.compiler import _fallback
from tritune.kernels.backend.constants import PREFIX, constants_traceable, fold_constants
from tritune.kernels.backend.graph import aten_graph
from tritune.tuner.model import zoo

A = torch.ops.aten
H = 64


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _folded(gm):
    """A copy of `gm` with its constants folded, the dead nodes removed; and how many were folded."""
    gm = copy.deepcopy(gm)
    count = fold_constants(gm)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm, count


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_decoders_mask_is_folded_and_its_step_computes_the_same(name):
    # the graph as the backend sees it: Dynamo's, traced to ATen on fake tensors (weights and
    # buffers are inputs), folded, then compiled as the fallback compiles it (AOT autograd traces it
    # again on fake tensors); each call runs it before and after folding on the real inputs
    torch.manual_seed(0)
    model = getattr(zoo, name)(hidden=H, layers=1).eval()
    seen = {}

    def backend(gm, example_inputs):
        aten = aten_graph(gm, example_inputs, detect_fake_mode(example_inputs))
        folded, seen["count"] = _folded(aten)
        seen["before"], seen["after"] = _targets(aten), _targets(folded)
        with constants_traceable(example_inputs):
            folded = _fallback("aot_eager", None)(folded, example_inputs)

        def run(*args):
            want, got = aten(*args), folded(*args)
            seen["equal"] = all(torch.equal(w, g) for w, g in zip(want, got))
            return want
        return run

    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(torch.randn(2, 1, H))
    assert seen["count"] >= 1 and seen["equal"]
    before, after = seen["before"], seen["after"]
    for op in (A.le.Tensor, A.bitwise_and.Tensor, A.arange.default):
        assert op in before and op not in after  # the mask's ops are computed once
    # what reads a weight, a buffer (rotary frequencies) or the input stays computed
    for op in (A.mm.default, A.cos.default) if name == "llama" else (A.addmm.default, A.tanh.default):
        assert before.count(op) == after.count(op) > 0


def test_only_what_depends_on_no_input_is_folded():
    def fn(x):
        mask = torch.arange(4)[:, None] >= torch.arange(4)[None, :]
        bias = torch.where(mask, 0.0, float("-inf"))
        return (x + bias).softmax(-1) * torch.arange(4.0)

    x = torch.randn(3, 4, 4)
    gm, count = _folded(aten_graph(fn, (x,)))
    consts = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr" and n.target.startswith(PREFIX)]
    assert count == 1 and len(consts) == 1 and consts[0].shape == (4, 4)  # the mask; a lone arange stays
    assert A.ge.Tensor not in _targets(gm) and A.add.Tensor in _targets(gm)
    assert torch.equal(gm(x), fn(x))


def test_a_graph_writing_to_a_constant_folds_nothing():
    def fn(x):
        c = torch.arange(4.0) * 2
        c.add_(x.sum())  # a write: every call must compute c afresh
        return x + c

    gm = aten_graph(fn, (torch.randn(4),))
    assert fold_constants(gm) == 0


def test_random_values_outputs_and_weights_are_not_folded():
    w = torch.nn.Parameter(torch.randn(4))

    def fn(x):
        noise = torch.rand(4) * 2  # drawn on every call
        const = torch.arange(4.0) * 3  # returned: the caller may write to it
        return x + noise + w * 2, const

    gm = aten_graph(fn, (torch.randn(4),))
    assert fold_constants(gm) == 0
