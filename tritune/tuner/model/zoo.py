"""Real architectures built from configs of a model-zoo package (Hugging Face `transformers`;
random weights, nothing downloaded), as factories for `tune-cli tune-model` and the model
benchmarks. Each model takes embeddings [batch, tokens, hidden] in the model's dtype (what
`--input-shape` gives) and returns the last hidden states (or, with an LM head, the logits):

- `llama`: decoder with gated MLP (SiLU) and grouped-query attention, no biases, LM head;
- `gpt2`: decoder with biases and GELU written as pointwise ops (`gelu_new`), LM head;
- `qwen2`: decoder as `llama`, with q/k/v biases and a 151936-word LM head tied to the embeddings;
- `neox`: GPT-NeoX decoder with a parallel residual (x + attn(ln1(x)) + mlp(ln2(x))), one fused
  q/k/v projection, biases, GELU (erf), LayerNorm, partial rotary embeddings, LM head;
- `phi3`: Phi-3-style decoder as `llama`, with one q/k/v projection sliced into q, k and v and one
  gate/up projection chunked into up * SiLU(gate), no biases, LM head;
- `bert`: encoder with biases and GELU.

`weight_bytes(model)` is what one decode step must read of the weights: the floor of a decode
step's time is that over the device's memory bandwidth.

    tune-cli tune-model --model tritune/tuner/model/zoo.py:llama --input-shape 1,2048,2048 --trials 192
"""
from __future__ import annotations

from torch import nn

LAYERS = 2


class FromEmbeddings(nn.Module):
    """Runs a transformers model on input embeddings, returning a tensor (not a ModelOutput)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(inputs_embeds=x, use_cache=False) if hasattr(self.model.config, "use_cache") \
            else self.model(inputs_embeds=x)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def llama(hidden: int = 2048, layers: int = LAYERS) -> nn.Module:
    """A Llama-style decoder: 16 query heads over 4 key/value heads, SiLU-gated MLP, 32000-word head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                         max_position_embeddings=4096, attn_implementation="sdpa")
    return FromEmbeddings(LlamaForCausalLM(config))


def gpt2(hidden: int = 1024, layers: int = LAYERS) -> nn.Module:
    """A GPT-2-style decoder: biases everywhere, tanh-approximated GELU as pointwise ops, 50257-word head."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=16, n_positions=4096,
                        activation_function="gelu_new", attn_implementation="sdpa")
    return FromEmbeddings(GPT2LMHeadModel(config))


def qwen2(hidden: int = 2048, layers: int = LAYERS) -> nn.Module:
    """A Qwen2-style decoder: `llama`'s shape with q/k/v biases; a 151936-word head tied to the
    embeddings (as the Qwen2 models of this width tie theirs)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, vocab_size=151936,
                         max_position_embeddings=4096, tie_word_embeddings=True, attn_implementation="sdpa")
    return FromEmbeddings(Qwen2ForCausalLM(config))


def neox(hidden: int = 1024, layers: int = LAYERS) -> nn.Module:
    """A GPT-NeoX-style decoder: attention and MLP read the same input (parallel residual), one
    q/k/v projection, biases, GELU, LayerNorm, rotary embeddings on a quarter of each head, 50432-word head."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                           num_attention_heads=16, vocab_size=50432, max_position_embeddings=4096,
                           use_parallel_residual=True, tie_word_embeddings=False, attn_implementation="sdpa")
    return FromEmbeddings(GPTNeoXForCausalLM(config))


def phi3(hidden: int = 3072, layers: int = LAYERS) -> nn.Module:
    """A Phi-3-style decoder: q/k/v in one projection and gate/up in another (each cut into its
    parts in the graph), SiLU, RMSNorm, rotary embeddings, 16 query heads over 4 key/value heads
    (as Phi-3-medium groups 40 over 10), an MLP 8/3 as wide as the model, 32064-word head."""
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                        num_attention_heads=16, num_key_value_heads=4, vocab_size=32064,
                        max_position_embeddings=4096, attn_implementation="sdpa")
    return FromEmbeddings(Phi3ForCausalLM(config))


def bert(hidden: int = 1024, layers: int = LAYERS) -> nn.Module:
    """A BERT-style encoder: biases, GELU, no head."""
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=16,
                        intermediate_size=4 * hidden, max_position_embeddings=4096, attn_implementation="sdpa")
    return FromEmbeddings(BertModel(config, add_pooling_layer=False))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights one decode step reads, each once: every parameter of a module other than
    an embedding table, a tied one (an LM head sharing the token embeddings) counted once. Embedding
    tables alone are left out: `FromEmbeddings` feeds embeddings, so the token table is not read, and
    of a position (or token-type) table a step reads one row per token. Buffers (rotary frequencies)
    are not weights."""
    read = {id(p): p for m in model.modules() if not isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    return sum(p.numel() * p.element_size() for p in read.values())
