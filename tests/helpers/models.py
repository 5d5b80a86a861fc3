"""Small models for the extraction and torch.compile backend tests."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class Awkward(nn.Module):
    """Every contraction pattern the matcher knows, at sizes that are no multiple of any tile."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(29, 47)  # 3-D input: view, addmm (B transposed), view; then gelu (tanh)
        self.again = nn.Linear(29, 47)  # the same workload once more
        self.down = nn.Linear(47, 29, bias=False)  # mm, then a residual add (an extra input)
        self.w = nn.Parameter(torch.randn(29, 31) / 6)  # row-major B: x @ w
        self.vec = nn.Parameter(torch.randn(5))

    def forward(self, x, y):
        z = self.down(F.gelu(self.up(x), approximate="tanh")) + x
        u = torch.relu(z @ self.w) * 0.5
        s = torch.sigmoid(z @ self.w)
        g = F.gelu(self.again(x), approximate="tanh")
        yt = y.transpose(1, 2)
        v = torch.bmm(y, yt) / 4.0 + self.vec
        w = torch.baddbmm(self.vec, y, yt, alpha=0.5)
        return u, s, g, v, w


AWKWARD_TASKS = [  # what extract_tasks must find in Awkward (fp32), in order, with counts
    ("matmul 66x47x29 fp32 NT+bias+gelu", 2),
    ("matmul 66x29x47 fp32 NT+add", 1),
    ("matmul 66x31x29 fp32 NN+relu+scale", 1),
    ("matmul 66x31x29 fp32 NN+sigmoid", 1),
    ("matmul 3x5x5x7 fp32 NT+scale+bias", 1),  # bmm / 4 + vec
    ("matmul 3x5x5x7 fp32 NT+scale+bias", 1),  # baddbmm(vec, alpha=0.5)
]


def awkward_inputs(dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 33, 29, generator=gen), torch.randn(3, 5, 7, generator=gen)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def mlp():
    """A factory for `tune-cli tune-model --model tests/helpers/models.py:mlp`: two workloads of equal FLOPs."""
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 64))


class Fusions(nn.Module):
    """An elementwise epilogue of each kind after a projection, at sizes no multiple of a tile."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(29, 47)  # + bias + a residual: an extra [M, N] input
        self.w = nn.Parameter(torch.randn(29, 31) / 6)  # scaled per row ([B, T, 1]) and per column ([N])
        self.col = nn.Parameter(torch.randn(31))
        self.up = nn.Linear(29, 53)  # GPT-2's GELU written as pointwise ops
        self.sw = nn.Linear(29, 37, bias=False)  # x * sigmoid(x)

    def forward(self, x, r, rows):
        a = self.proj(x) + r
        b = (x @ self.w) * rows * self.col
        h = self.up(x)
        c = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        s = self.sw(x)
        return a, b, c, s * torch.sigmoid(s)


def fusions_inputs(dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    shapes = ((2, 33, 29), (2, 33, 47), (2, 33, 1))  # x, the residual, one scale per row
    return tuple(torch.randn(s, generator=gen).to(dtype) for s in shapes)


class GatedMLP(nn.Module):
    """Llama's MLP, down(act(gate(x)) * up(x)); with `up_first`, up(x) * act(gate(x)) as some write it."""

    def __init__(self, hidden=29, inner=37, act=F.silu, bias=False, up_first=False):
        super().__init__()
        self.gate, self.up = nn.Linear(hidden, inner, bias=bias), nn.Linear(hidden, inner, bias=bias)
        self.down = nn.Linear(inner, hidden, bias=False)
        self.act, self.up_first = act, up_first

    def forward(self, x):
        if self.up_first:
            return x + self.down(self.up(x) * self.act(self.gate(x)))
        return self.down(self.act(self.gate(x)) * self.up(x))


def swiglu():
    """A factory for `tune-cli tune-model --model tests/helpers/models.py:swiglu`: a gated MLP (input 64 wide)."""
    return GatedMLP(64, 96)


class Projections(nn.Module):
    """Attention's q, k and v projections of one input (k and v narrower: grouped-query attention),
    a fourth projection of it with a ReLU after, and a product of one output with another weight."""

    def __init__(self, hidden=29, q=29, kv=13, bias=False):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(hidden, n, bias=bias) for n in (q, kv, kv))
        self.gate = nn.Linear(hidden, kv, bias=bias)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return q * 2, k.transpose(-1, -2) @ v, torch.relu(self.gate(x)), self.k(q)


class Block(nn.Module):
    """One pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)); attention with q,
    k, v and o projections (causal scaled-dot-product attention), the MLP up, gelu (tanh), down.
    At its default sizes (hidden 4096, 32 heads, MLP 4x, on 2048 tokens), an example for
    `tune-cli tune-model --model tests/helpers/models.py:block --input-shape 1,2048,4096 --dtype fp16`:
    q, k and v are one workload (2048x4096x4096 + bias), o another (the same with its residual add
    fused), up is 2048x16384x4096 + bias + gelu, down 2048x4096x16384 + bias + residual."""

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
    """The factory `--model tests/helpers/models.py:block` names: a block at the default sizes."""
    return Block(hidden, heads)


def llama_lm(hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int, layers: int = 2) -> nn.Module:
    """A Llama-style causal LM from transformers' config (random weights): GQA, SiLU-gated MLP, rotary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=256, attn_implementation="sdpa")
    return LlamaForCausalLM(config)
