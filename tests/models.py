"""Small models for the extraction and torch.compile backend tests."""
import torch
import torch.nn.functional as F
from torch import nn


class Awkward(nn.Module):
    """Every contraction pattern the matcher knows, at sizes that are no multiple of any tile."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(29, 47)  # 3-D input: view, addmm (B transposed), view; then gelu (tanh)
        self.again = nn.Linear(29, 47)  # the same workload once more
        self.down = nn.Linear(47, 29, bias=False)  # mm, then a residual add that does not fuse
        self.w = nn.Parameter(torch.randn(29, 31) / 6)  # row-major B: x @ w
        self.vec = nn.Parameter(torch.randn(5))

    def forward(self, x, y):
        z = self.down(F.gelu(self.up(x), approximate="tanh")) + x
        u = torch.relu(z @ self.w) * 0.5
        s = torch.sigmoid(z @ self.w)  # sigmoid does not fuse: a plain NN contraction
        g = F.gelu(self.again(x), approximate="tanh")
        yt = y.transpose(1, 2)
        v = torch.bmm(y, yt) / 4.0 + self.vec
        w = torch.baddbmm(self.vec, y, yt, alpha=0.5)
        return u, s, g, v, w


AWKWARD_TASKS = [  # what extract_tasks must find in Awkward (fp32), in order, with counts
    ("matmul 66x47x29 fp32 NT+bias+gelu", 2),
    ("matmul 66x29x47 fp32 NT", 1),
    ("matmul 66x31x29 fp32 NN+relu+scale", 1),
    ("matmul 66x31x29 fp32 NN", 1),
    ("matmul 3x5x5x7 fp32 NT+scale+bias", 1),  # bmm / 4 + vec
    ("matmul 3x5x5x7 fp32 NT+scale+bias", 1),  # baddbmm(vec, alpha=0.5)
]


def awkward_inputs(dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 33, 29, generator=gen), torch.randn(3, 5, 7, generator=gen)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def mlp():
    """A factory for `tune-cli tune-model --model tests/models.py:mlp`: two workloads of equal FLOPs."""
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 64))
