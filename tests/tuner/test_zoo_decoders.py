"""The zoo's decoders (tritune/tuner/model/zoo.py) at a small width: a decode step runs on CPU, the
weights one step reads (`weight_bytes`) match a hand count, and the frontend finds each
architecture's sites in its decode graph."""
import pytest
import torch
from torch import nn

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Binary, Gelu, Input
from tritune.kernels.backend import graph
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.tuner.model import zoo

H = 64  # hidden: 16 heads of 4
VOCAB = {"llama": 32000, "gpt2": 50257, "qwen2": 151936, "neox": 50432}


def small(name: str, layers: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return getattr(zoo, name)(hidden=H, layers=layers).eval()


@pytest.mark.parametrize("name", sorted(VOCAB))
def test_a_decode_step_runs_each_sequence_on_its_own(name):
    model, x = small(name, layers=zoo.LAYERS), torch.randn(3, 1, H)
    with torch.no_grad():
        y = model(x)
        alone = torch.cat([model(x[i:i + 1]) for i in range(3)])
    assert y.shape == (3, 1, VOCAB[name]) and y.dtype == torch.float32 and torch.isfinite(y).all()
    # one token per sequence: no sequence sees another's, and the logits are not all alike
    assert torch.allclose(y, alone, atol=1e-5) and (y[0] - y[1]).abs().max() > 1e-3


def test_the_new_decoders_are_the_architectures_they_name():
    qwen2, neox = small("qwen2").model, small("neox").model
    attn = qwen2.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None and attn.k_proj.out_features == H // 4
    assert qwen2.lm_head.weight is qwen2.model.embed_tokens.weight  # tied, as the Qwen2 models of this width
    assert neox.config.use_parallel_residual and neox.config.hidden_act == "gelu"
    assert neox.lm_head.weight is not neox.gpt_neox.embed_in.weight


def test_weight_bytes_counts_a_tied_head_once_and_no_embedding_table():
    # gpt2, one layer, fp32: ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj (with biases), ln_f, and
    # the head, tied to the token table (wte); the position table (wpe) is left out
    layer = 2 * H + (H * 3 * H + 3 * H) + (H * H + H) + 2 * H + (H * 4 * H + 4 * H) + (4 * H * H + H)
    gpt2 = small("gpt2")
    assert zoo.weight_bytes(gpt2) == 4 * (layer + 2 * H + 50257 * H)
    assert zoo.weight_bytes(gpt2.half()) == 2 * (layer + 2 * H + 50257 * H)


def test_weight_bytes_of_an_untied_head_leaves_the_token_table_out():
    # llama, one layer: q, o [H, H]; k, v [H/4, H]; gate, up [176, H], down [H, 176]; two RMSNorms;
    # the final norm and the head; the token table (embed_tokens, its own weight) is not read
    inter = H * 11 // 4
    layer = 2 * H * H + 2 * (H // 4) * H + 3 * inter * H + 2 * H
    llama = small("llama")
    assert zoo.weight_bytes(llama) == 4 * (layer + H + 32000 * H)
    every = sum(p.numel() for p in llama.parameters())
    assert every * 4 - zoo.weight_bytes(llama) == 4 * 32000 * H  # exactly the token table


def test_weight_bytes_counts_a_tied_head_of_qwen2_once_with_its_biases():
    inter = H * 11 // 4
    layer = (H * H + H) + 2 * ((H // 4) * H + H // 4) + H * H + 3 * inter * H + 2 * H  # q, k, v with biases; o
    assert zoo.weight_bytes(small("qwen2")) == 4 * (layer + H + 151936 * H)


def sites(name: str) -> list:
    """The sites of a one-layer model's decode graph (2 sequences, 1 token each)."""
    return graph.find(graph.aten_graph(small(name), (torch.randn(2, 1, H),)), allow_tf32=False)


def qwen2_config_eps() -> float:
    """The RMSNorm epsilon of the zoo's qwen2."""
    return zoo.qwen2(hidden=H, layers=1).model.config.rms_norm_eps


def test_qwen2_decode_sites_are_one_wide_qkv_with_biases_and_one_gated_mlp():
    found = sites("qwen2")
    kinds = [type(s).__name__ for s in found]
    assert kinds == ["WideMatch", "AttentionMatch", "Match", "GatedMatch", "Match", "Match"]
    qkv, attention, o, mlp, down, head = found
    # transformers folds the 4 query heads of each of the 4 k/v heads into its query rows
    assert (attention.expr.heads, attention.expr.lq, attention.expr.lk, attention.expr.mask) == (4, 4, 1, "fp32")
    # the layer's input norm goes into q/k/v's prologue, the post-attention norm into gate/up's,
    # the final norm into the LM head's
    eps = qwen2_config_eps()
    assert qkv.expr == Wide(2, (H, H // 4, H // 4), H, "fp32", bias=True, allow_tf32=False, norm_eps=eps)
    assert mlp.expr == Gated(2, H * 11 // 4, H, "fp32", "silu", bias=False, allow_tf32=False, norm_eps=eps)
    assert head.expr.norm_eps == eps and o.norm is None and down.norm is None
    residual = (Binary("add", Input("mn", "fp32")),)
    assert o.expr.epilogue == residual and down.expr.epilogue == residual  # no biases after attention
    assert (head.expr.n, head.expr.k, head.expr.epilogue) == (151936, H, ())


def test_neox_decode_sites_fuse_the_parallel_residual_into_the_attention_output():
    found = sites("neox")
    # no wide or gated site: q, k, v are already one Linear (query_key_value), and the MLP is not gated
    assert [type(s).__name__ for s in found].count("AttentionMatch") == 1
    found = [s for s in found if type(s).__name__ != "AttentionMatch"]
    assert all(type(s) is graph.Match and isinstance(s.expr, Matmul) for s in found)
    qkv, dense, up, down, head = found
    add = Binary("add", Input("mn", "fp32"))
    assert (qkv.expr.n, qkv.expr.epilogue) == (3 * H, (BiasAdd(),))
    assert (up.expr.n, up.expr.epilogue) == (4 * H, (BiasAdd(), Gelu()))
    # x + attn(ln1(x)) + mlp(ln2(x)): the attention output projection comes first in the graph, so
    # its epilogue takes both adds (the MLP's output and the layer's input as extra inputs); the
    # MLP's down projection keeps its bias, and the add it feeds is already the attention's
    assert dense.expr.epilogue == (BiasAdd(), add, add) and len(dense.inputs) == 2
    assert down.expr.epilogue == (BiasAdd(),) and down.unfused == "add"
    mlp_out, layer_in = dense.inputs  # the MLP's output (a view of it: [M, N] as [batch, 1, N]) and the input
    assert mlp_out.target == torch.ops.aten.view.default and mlp_out.args[0] is down.last and layer_in.op == "placeholder"
    assert (head.expr.n, head.expr.epilogue, head.bias) == (50432, (), None)
