"""An example model for `tune-cli tune-model` and scripts/model_bench.py: one pre-norm transformer
block (attention with q/k/v/o projections, then an MLP: up, gelu (tanh), down; residual adds), at
realistic sizes by default: hidden 4096, 32 heads, MLP 4x, fp16 on 2048 tokens.

    tune-cli tune-model --model scripts/example_model.py:block --input-shape 1,2048,4096 --dtype fp16

Its contractions: q, k and v are one workload (2048x4096x4096 + bias), o another (the same with its
residual add fused), up is 2048x16384x4096 + bias + gelu, down 2048x4096x16384 + bias + residual.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); causal scaled-dot-product attention."""

    def __init__(self, hidden: int = 4096, heads: int = 32, mlp_ratio: int = 4) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.up, self.down = nn.Linear(hidden, mlp_ratio * hidden), nn.Linear(mlp_ratio * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        y = self.norm1(x)
        q, k, v = (p(y).view(b, t, self.heads, h // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, h))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


def block(hidden: int = 4096, heads: int = 32) -> Block:
    """The factory `--model scripts/example_model.py:block` names: a block at the default sizes."""
    return Block(hidden, heads)
