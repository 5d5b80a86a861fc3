"""Real architectures built from configs of a model-zoo package (Hugging Face `transformers`;
random weights, nothing downloaded), as factories for `tune-cli tune-model` and the model
benchmarks. Each model takes embeddings [batch, tokens, hidden] in the model's dtype (what
`--input-shape` gives) and returns the last hidden states (or, with an LM head, the logits):

- `llama`: decoder with gated MLP (SiLU) and grouped-query attention, no biases, LM head;
- `gpt2`: decoder with biases and GELU written as pointwise ops (`gelu_new`), LM head;
- `bert`: encoder with biases and GELU.

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


def bert(hidden: int = 1024, layers: int = LAYERS) -> nn.Module:
    """A BERT-style encoder: biases, GELU, no head."""
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=16,
                        intermediate_size=4 * hidden, max_position_embeddings=4096, attn_implementation="sdpa")
    return FromEmbeddings(BertModel(config, add_pooling_layer=False))
