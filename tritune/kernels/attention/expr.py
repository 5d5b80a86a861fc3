"""Attention of a few query rows: out[b,h,i,:] = softmax_j(scale·q[b,h,i,:]·k[b,g,j,:] + mask[b,h,i,j])·v[b,g,j,:],
as torch's scaled_dot_product_attention computes it, for q [B,H,Lq,D] and k, v [B,H/G,Lk,D] (g =
h // G: G query heads share a key/value head, grouped-query attention; G = 1 without), with fp32
softmax whatever the storage type, q and k optionally rotated first (rotary embeddings). Decode
steps and speculative tokens have a few query rows per (batch, head) and any number of keys: the
kernel streams k and v once, so it is rated in bytes."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tritune.kernels.expr import DTYPE_BYTES, DTYPES, INT32_MAX, ExprError, Keyed, check_fields

MAX_ROWS = 64  # query rows per (batch, head): decode and speculative decoding; prefill stays with torch
MAX_HEAD_DIM = 256
MASKS = ("bool", *DTYPES)  # a boolean mask (True: attend) or an additive one in a float dtype
MASK_DIMS = "bhqk"  # the mask's dimensions: batch, head, query row, key
ROPE_DIMS = "bn"  # the rotary tables' dimensions besides the lane: batch, position (the row's)
ROPE_POSITIONS = ("i64", "i32")  # position types the kernel computes its tables from (torch's long, int)
OUT_DIMS = "bhqd"  # the output's: batch, head, query row, head dim


@dataclass(frozen=True)
class Attention(Keyed):
    """softmax(scale·q·kᵀ [+ mask | causal])·v over `lk` keys for `lq` query rows of each of
    batch x heads, head dim `d`.

    `mask`: None, "bool" (False: the key is left out) or the dtype of an additive mask; `mask_dims`:
    the dimensions (of "bhqk") along which it varies, broadcast over the others (a dimension of
    size 1 never varies: it is left out). `causal`: query row i sees keys j <= i (torch's is_causal,
    aligned top-left), never with a mask. A row whose every key is left out is 0, as torch's SDPA
    defines it. `out_order`: the output's dimensions (of "bhqd") from outermost to innermost in
    memory, as the op producing it lays it out.

    `group`: query heads per key/value head (k and v have heads / group heads). `rope_q`, `rope_k`:
    the lanes (even, at most d; 0: none) of each q / k row rotated by rotary embeddings before the
    products, with cos and sin tables [.., rows, lanes] in the storage dtype that vary along
    `rope_dims` (of "bn": batch, position) besides the lane, and are the same for every head.

    `rope_pos`: "" where the tables are operands; else the kernel computes them, as transformers'
    rotary embeddings build them, from positions of that integer type (one per batch and row,
    varying along `rope_dims`) and frequencies of dtype `rope_freq` (half the rotated lanes: lane j
    turns at frequency j mod lanes/2): cos(position·frequency)·`rope_scale` in fp32, rounded to the
    storage dtype, and the same for sin. The kernel that would compute the tables on every call is
    then not needed.
    """

    batch: int
    heads: int
    lq: int
    lk: int
    d: int
    dtype: str = "fp16"
    scale: float | None = None  # default: 1 / sqrt(d), as torch's
    mask: str | None = None
    mask_dims: str = ""
    causal: bool = False
    out_order: str = OUT_DIMS
    group: int = 1
    rope_q: int = 0
    rope_k: int = 0
    rope_dims: str = ""
    rope_pos: str = ""
    rope_freq: str = "fp32"
    rope_scale: float = 1.0
    op: ClassVar[str] = "attention"

    def __post_init__(self) -> None:
        check_fields(self, ("batch", "heads", "lq", "lk", "d"))
        if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 1 \
                or self.heads % self.group:
            raise ExprError(f"group must be a positive divisor of heads ({self.heads}), got {self.group!r}")
        if self.lq * self.group > MAX_ROWS:
            raise ExprError(f"lq x group must be at most {MAX_ROWS} query rows per key/value head (prefill is "
                            f"torch's), got {self.lq} x {self.group}")
        if self.d > MAX_HEAD_DIM:
            raise ExprError(f"d must be at most {MAX_HEAD_DIM}, got {self.d}")
        self._check_scale()
        self._check_mask()
        self._check_rope()
        if not isinstance(self.causal, bool) or (self.causal and self.mask is not None):
            raise ExprError(f"causal must be true or false, and false with a mask (torch's SDPA takes one or the "
                            f"other), got {self.causal!r} with mask {self.mask!r}")
        if not isinstance(self.out_order, str) or sorted(self.out_order) != sorted(OUT_DIMS):
            raise ExprError(f"out_order must order the dimensions {OUT_DIMS!r}, got {self.out_order!r}")
        rows = self.batch * self.heads * max(self.lq, self.lk)
        if rows * max(self.d, self.lq) > INT32_MAX:
            raise ExprError("each operand must have fewer than 2**31 elements")

    def _check_scale(self) -> None:
        scale = 1 / math.sqrt(self.d) if self.scale is None else self.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
            raise ExprError(f"scale must be a finite nonzero number, got {self.scale!r}")
        object.__setattr__(self, "scale", float(scale))  # one workload key for 0.25 and the default of d=16

    def _check_mask(self) -> None:
        if self.mask is None:
            if self.mask_dims:
                raise ExprError(f"mask_dims {self.mask_dims!r} without a mask")
            return
        if self.mask not in MASKS:
            raise ExprError(f"unknown mask {self.mask!r}; one of {', '.join(MASKS)}")
        dims = self.mask_dims
        if not isinstance(dims, str) or any(c not in MASK_DIMS for c in dims) or list(dims) != sorted(
                set(dims), key=MASK_DIMS.index):
            raise ExprError(f"mask_dims must be letters of {MASK_DIMS!r} in that order, got {dims!r}")
        sizes = dict(zip(MASK_DIMS, (self.batch, self.heads, self.lq, self.lk)))
        object.__setattr__(self, "mask_dims", "".join(c for c in dims if sizes[c] > 1))

    def _check_rope(self) -> None:
        for name in ("rope_q", "rope_k"):
            lanes = getattr(self, name)
            if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 0 or lanes % 2 or lanes > self.d:
                raise ExprError(f"{name} must be an even number of lanes at most d ({self.d}), got {lanes!r}")
        dims = self.rope_dims
        if not isinstance(dims, str) or any(c not in ROPE_DIMS for c in dims) or list(dims) != sorted(
                set(dims), key=ROPE_DIMS.index) or (dims and not (self.rope_q or self.rope_k)):
            raise ExprError(f"rope_dims must be letters of {ROPE_DIMS!r} in that order, with rotary lanes, "
                            f"got {dims!r}")
        if self.rope_pos not in ("", *ROPE_POSITIONS) or (self.rope_pos and not (self.rope_q or self.rope_k)):
            raise ExprError(f"rope_pos must be '' (tables given) or one of {', '.join(ROPE_POSITIONS)}, with rotary "
                            f"lanes, got {self.rope_pos!r}")
        if self.rope_freq not in DTYPES:
            raise ExprError(f"rope_freq must be one of {', '.join(DTYPES)}, got {self.rope_freq!r}")
        scale = self.rope_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ExprError(f"rope_scale must be a finite number, got {scale!r}")
        if not self.rope_pos and (scale != 1 or self.rope_freq != "fp32"):
            raise ExprError("rope_scale and rope_freq describe tables computed from positions: with rope_pos only")
        object.__setattr__(self, "rope_scale", float(scale))

    @property
    def kv_heads(self) -> int:
        """Heads of k and v."""
        return self.heads // self.group

    def rope_shape(self, rows: int, lanes: int) -> tuple[int, int, int, int]:
        """A rotary table's 4-D shape (batch, head, row, lane) for `rows` rows of `lanes` lanes."""
        return (self.batch if "b" in self.rope_dims else 1, 1, rows if "n" in self.rope_dims else 1, lanes)

    def mask_shape(self) -> tuple[int, int, int, int]:
        """The mask's 4-D shape: each dimension's size where it varies, else 1."""
        sizes = (self.batch, self.heads, self.lq, self.lk)
        return tuple(n if c in self.mask_dims else 1 for c, n in zip(MASK_DIMS, sizes))

    @property
    def flops(self) -> int:
        """Both products' multiply-adds counted as two operations."""
        return 4 * self.batch * self.heads * self.lq * self.lk * self.d

    @property
    def bytes(self) -> int:
        """Bytes a kernel must move at least: q, k, v and the mask read once, the output written."""
        eb = DTYPE_BYTES[self.dtype]
        mask = 0 if self.mask is None else math.prod(self.mask_shape()) * DTYPE_BYTES.get(self.mask, 1)
        return self.batch * (2 * self.heads * self.lq + 2 * self.kv_heads * self.lk) * self.d * eb + mask \
            + self._rope_bytes(self.lq, self.rope_q) + self._rope_bytes(self.lk, self.rope_k)

    def _rope_bytes(self, rows: int, lanes: int) -> int:
        """Bytes of one side's rotary operands: its cos and sin tables, or positions and frequencies."""
        if not lanes:
            return 0
        per_row = math.prod(self.rope_shape(rows, 1))
        if self.rope_pos:
            return per_row * (8 if self.rope_pos == "i64" else 4) + lanes // 2 * DTYPE_BYTES[self.rope_freq]
        return 2 * per_row * lanes * DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict:
        """Canonical dict form (the workload spec stored in the database)."""
        return {"op": self.op, "batch": self.batch, "heads": self.heads, "lq": self.lq, "lk": self.lk, "d": self.d,
                "dtype": self.dtype, "scale": self.scale, "mask": self.mask, "mask_dims": self.mask_dims,
                "causal": self.causal, "out_order": self.out_order, "group": self.group, "rope_q": self.rope_q,
                "rope_k": self.rope_k, "rope_dims": self.rope_dims, "rope_pos": self.rope_pos,
                "rope_freq": self.rope_freq, "rope_scale": self.rope_scale}

    @classmethod
    def from_dict(cls, d: dict) -> "Attention":
        """Inverse of to_dict (ExprError if it is not an attention spec)."""
        if d.get("op") != cls.op:
            raise ExprError(f"not an attention workload: op={d.get('op')!r}")
        try:
            return cls(**{k: v for k, v in d.items() if k != "op"})
        except TypeError as e:
            raise ExprError(f"bad attention workload spec: {e}") from None

    def describe(self) -> str:
        """Short human form, e.g. 'attention 16x4 q4 k1 d128 fp16 mask fp16[b]'."""
        extra = "" if self.mask is None else f" mask {self.mask}[{self.mask_dims}]"
        extra += " causal" if self.causal else ""
        extra += "" if self.out_order == OUT_DIMS else f" out {self.out_order}"
        extra += f" group {self.group}" if self.group > 1 else ""
        extra += f" rope q{self.rope_q} k{self.rope_k}" + (f"[{self.rope_dims}]" if self.rope_dims else "") \
            if self.rope_q or self.rope_k else ""
        extra += f" pos {self.rope_pos} freq {self.rope_freq}" if self.rope_pos else ""
        extra += f" x{self.rope_scale:g}" if self.rope_scale != 1 else ""
        return f"attention {self.batch}x{self.heads} q{self.lq} k{self.lk} d{self.d} {self.dtype}{extra}"


# Small awkward attentions (query rows 1, 3, 5; keys past a block and not a multiple of one; head
# dims 80 and 8; masks broadcast over batch and/or heads, boolean and additive; causal; every dtype)
# for correctness checks on a GPU and under the interpreter (which computes bf16 dots wrongly: CPU
# tests skip those). The first has several key blocks, so a kernel that loses the running max shows.
AWKWARD = (
    Attention(2, 3, 3, 37, 80, mask="fp16", mask_dims="bqk"),
    Attention(3, 2, 1, 19, 16),
    Attention(2, 4, 5, 50, 8, "fp32", mask="bool", mask_dims="hqk"),
    Attention(1, 3, 4, 70, 64, "fp32", scale=0.3, causal=True, out_order="bqhd"),
    Attention(2, 2, 3, 33, 80, "bf16", mask="bf16", mask_dims="bk"),
    Attention(4, 2, 1, 130, 128, "bf16", mask="bool", mask_dims="bk", out_order="bqhd"),
    # grouped-query attention with rotary embeddings: whole heads, a NeoX-style partial rotation
    # (a quarter of each head), tables per batch and position, a mask per query head
    Attention(2, 8, 3, 37, 64, "fp32", mask="fp32", mask_dims="bhqk", group=4, rope_q=64, rope_k=64, rope_dims="bn"),
    Attention(3, 6, 1, 21, 80, group=3, rope_q=20, rope_k=20),
    Attention(2, 4, 2, 19, 32, causal=True, group=2, rope_q=32, rope_dims="n"),
    Attention(2, 8, 1, 40, 128, "bf16", mask="bf16", mask_dims="bk", group=4, rope_q=128, rope_k=128),
    # the tables computed from positions: per batch and row, long positions and fp32 frequencies;
    # int positions, fp16 frequencies, a scale and a partial rotation; bf16 with positions per batch
    Attention(2, 8, 3, 37, 64, "fp32", group=4, rope_q=64, rope_k=64, rope_dims="bn", rope_pos="i64"),
    Attention(3, 6, 2, 21, 80, group=3, rope_q=20, rope_k=20, rope_dims="n", rope_pos="i32", rope_freq="fp16",
              rope_scale=0.75),
    Attention(2, 8, 1, 40, 128, "bf16", group=4, rope_q=128, rope_k=128, rope_dims="b", rope_pos="i64"),
)
