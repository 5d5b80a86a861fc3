"""What the backend's parts share about torch tensors (real or fake): dtype names, operand layouts,
the Matmul a contraction computes, and whether an epilogue's extra inputs fit it. The eager ops, the
graph matcher and the compiled replay ops all read tensors this one way."""
from __future__ import annotations

from typing import Any, Sequence

from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import Epilogue
from tritune.kernels.expr import DTYPES, ExprError, torch_dtype

DTYPE_NAMES = {str(torch_dtype(name)): name for name in DTYPES}  # "torch.float16" -> "fp16"


def layout_of(t: Any) -> bool | None:
    """True when a matrix operand is stored transposed (unit stride on its rows), False when row-major,
    None when neither of its last two strides is 1 (the kernels need one of the two).
    """
    rows, cols = t.stride()[-2:]
    return False if cols == 1 else True if rows == 1 else None


def contraction_expr(a: Any, b: Any, epilogue: Sequence[Epilogue], allow_tf32: bool = True) -> Matmul:
    """The Matmul computing epilogue(a @ b) for tensors (real or fake) a [B,]M,K and b [B,]K,N."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3) or a.shape[-1] != b.shape[-2]:
        raise ExprError(f"matmul shapes do not match: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or str(a.dtype) not in DTYPE_NAMES:
        raise ExprError(f"matmul needs two fp16, bf16 or fp32 tensors of one dtype, got {a.dtype} and {b.dtype}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ExprError(f"batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    return Matmul(a.shape[-2], b.shape[-1], a.shape[-1], batch=batch, dtype=DTYPE_NAMES[str(a.dtype)],
                  trans_a=bool(layout_of(a)), trans_b=bool(layout_of(b)), epilogue=tuple(epilogue),
                  allow_tf32=allow_tf32)


def input_problem(expr: Matmul, inputs: Sequence[Any], out_shape: Sequence[int]) -> str:
    """Why `inputs` are not the extra tensors the epilogue reads for an output of `out_shape` ('' when
    they are): a residual of the output's shape (or [M, N], shared by a batch), [M] or [N] vectors,
    each in its Input's dtype."""
    if len(inputs) != len(expr.inputs):
        return f"the epilogue reads {len(expr.inputs)} extra inputs, got {len(inputs)}"
    shapes = {"mn": (tuple(out_shape), tuple(out_shape[-2:])), "m": ((expr.m,),), "n": ((expr.n,),)}
    for i, (t, kind) in enumerate(zip(inputs, expr.inputs)):
        dtype = DTYPE_NAMES.get(str(t.dtype), str(t.dtype))
        if dtype != kind.dtype or tuple(t.shape) not in shapes[kind.shape]:
            return (f"epilogue input {i} must be {kind.dtype} of shape {shapes[kind.shape][0]}, got {dtype} "
                    f"{tuple(t.shape)}")
    return ""
