"""The zoo's decoders at the depth of the models they stand for (tritune/tuner/model/zoo.py, random
weights), as factories for `tune-cli tune-model --decode` and scripts/bench/generate_bench.py:

- `llama`: 16 layers at width 2048, GQA 16/4, SiLU-gated MLP (Llama 3.2 1B's depth and width);
- `qwen2`: 28 layers at width 2048, q/k/v biases, a 151936-word head (Qwen2 1.5B's depth);
- `neox`: 24 layers at width 1024, LayerNorm, GELU, parallel residual (Pythia 410M's shape).

    tune-cli tune-model --model scripts/bench/decoders.py:llama --decode 16,1024,65
"""
from tritune.tuner.model import zoo


def llama():
    """A Llama-style decoder at Llama 3.2 1B's depth and width."""
    return zoo.llama(hidden=2048, layers=16)


def qwen2():
    """A Qwen2-style decoder of 28 layers at width 2048."""
    return zoo.qwen2(hidden=2048, layers=28)


def neox():
    """A GPT-NeoX-style decoder at Pythia 410M's depth and width."""
    return zoo.neox(hidden=1024, layers=24)
