"""Weights applied to one input by the gated and wide families: their layouts as the command line
names them, their kernels' tensor descriptors over them (and what a launch with those needs), a
weight as the [K, N] operand of x @ w, and weights concatenated once, as a user concatenates them
when loading a model (the families' 'mm_cat' library candidates)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tritune.kernels.codegen import use_torch_scratch
from tritune.kernels.device import interpreted
from tritune.kernels.expr import ExprError

LAYOUTS = {"nt": True, "nn": False}  # weights [N, K] as nn.Linear keeps them, or [K, N]


def weight_options(options: dict[str, str], op: str) -> tuple[bool, bool]:
    """(trans_b, bias) from `--layout nt|nn` and `--epilogue bias`; ExprError (one line) otherwise."""
    layout = options.get("layout", "nt")
    if layout not in LAYOUTS:
        raise ExprError(f"bad --layout {layout!r} for --op {op}: nt (weights [N,K]) or nn ([K,N])")
    epilogue = options.get("epilogue", "")
    if epilogue not in ("", "bias"):
        raise ExprError(f"bad --epilogue {epilogue!r} for --op {op}: only 'bias' (one on each projection)")
    return LAYOUTS[layout], epilogue == "bias"


def weight_descriptor(trans_b: bool, pointer: str, name: str) -> str:
    """Triton source: a tensor descriptor over a weight as stored, [N, K] (nn.Linear's; its tiles
    are flipped after the load) or [K, N] (the gated and wide kernels' TMA loads)."""
    if trans_b:
        return f"{name} = tl.make_tensor_descriptor({pointer}, shape=[N, K], strides=[stride_wn, 1], " \
               "block_shape=[BLOCK_N, BLOCK_K])"
    return f"{name} = tl.make_tensor_descriptor({pointer}, shape=[K, N], strides=[stride_wk, 1], " \
           "block_shape=[BLOCK_K, BLOCK_N])"


def ready_for_tma(config: Any, unfit: Callable[[], str | None]) -> None:
    """Before a gated or wide launcher of a config with tensor-descriptor loads (TMA): ValueError,
    naming why, where `unfit()` says the operands cannot be read so; else the descriptors'
    scratch from torch (on a GPU)."""
    if not config.get("TMA", 0):
        return
    if why := unfit():
        raise ValueError(f"config uses TMA but {why}")
    if not interpreted():
        use_torch_scratch()


def as_kn(trans_b: bool, w: Any) -> Any:
    """A weight as the [K, N] operand of x @ w."""
    return w.t() if trans_b else w


class Concatenated:
    """[W_1; W_2; ...] as one [K, sum N_i] operand (and [b_1; b_2; ...]), built on the first call
    and again only when a weight changes (a new tensor, or an in-place write: torch's version
    counter), as a user concatenates once when loading the model."""

    def __init__(self, trans_b: bool) -> None:
        self.trans_b, self.key, self.value = trans_b, None, None

    def __call__(self, ws: Sequence[Any], bs: Sequence[Any]) -> tuple[Any, Any]:
        import torch

        tensors = [t for t in (*ws, *bs) if t is not None]
        key = tuple((t.data_ptr(), t._version) for t in tensors)
        if key != self.key:
            w = torch.cat(list(ws), 0).t() if self.trans_b else torch.cat(list(ws), 1)
            self.key, self.value = key, (w, None if bs[0] is None else torch.cat(list(bs)))
        return self.value
