"""Attention sites in a traced model: torch's scaled-dot-product attention as the ATen graph holds
it, whichever backend the device picked (`_scaled_dot_product_flash_attention_for_cpu`,
`_scaled_dot_product_efficient_attention`, `_scaled_dot_product_flash_attention`,
`_scaled_dot_product_cudnn_attention`, ...). They are told apart by their signature, not their
names: q, k, v, a mask (`attn_mask` or `attn_bias`), dropout_p, is_causal and scale; arguments that
change only their other outputs (log-sum-exp, debug masks) are ignored, and any other argument
must have its default. A node is a site when only its attention output is read, without dropout,
with at most 64 query rows per (batch, head) (decode, speculative tokens: prefill stays torch's).

A site reads q and k before rotary embeddings, and k and v before their repeat over a group of query
heads, where the graph computes those as models write them (`rotary_match`): its kernel applies them.
torch's own grouped-query attention (`enable_gqa`: k and v with fewer heads) is read as such.

Where torch padded and sliced the mask to align its rows and expanded it to [B, H, Lq, Lk] for a
fused kernel (copies of the mask on every call), the site reads the mask before those steps: the
kernel broadcasts it itself.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx

from tritune.kernels.attention.expr import MASK_DIMS, OUT_DIMS, Attention
from tritune.kernels.attention.launch import dense_strides
from tritune.kernels.expr import ExprError
from tritune.kernels.backend.epilogue_match import static, val
from tritune.kernels.backend.helpers import DTYPE_NAMES
from tritune.kernels.backend.rope_angles import FREQ_TYPES, POSITION_TYPES, angles
from tritune.kernels.backend.rotary_match import (VIEWS, Rotary, repeated, rotary, same_for_rows, table_dims,
                                                   table_fits)

A = torch.ops.aten
MASK_NAMES = ("attn_mask", "attn_bias")
# arguments that shape only the other outputs (which a site leaves unread)
IGNORED = ("compute_log_sumexp", "return_debug_mask")
KNOWN = ("query", "key", "value", *MASK_NAMES, "dropout_p", "is_causal", "scale", "enable_gqa", *IGNORED)


@dataclass(frozen=True)
class AttentionMatch:
    """One SDPA node computed by the attention kernel: its inputs as the kernel reads them (q and k
    before their rotation, k and v before their repeat), the mask as the kernel reads it (None
    without one), the rotary tables (cos and sin of q, then of k; None for a side not rotated), the
    shape q is viewed to (None: as it is; a rotation the same for every head and row commutes with
    the view SDPA's input went through) and the nodes reading its attention output (`outputs`,
    getitem 0), which the kernel's output replaces. Where the kernel computes the tables
    (`expr.rope_pos`), `tables` are each side's positions and frequencies, and `table_views` the
    shape each is viewed to (None: as it is)."""

    expr: Attention
    node: fx.Node
    q: fx.Node
    k: fx.Node
    v: fx.Node
    mask: fx.Node | None
    outputs: tuple[fx.Node, ...]
    unfused: str = ""
    tables: tuple[fx.Node | None, ...] = (None,) * 4
    q_shape: tuple[int, ...] | None = None
    table_views: tuple[tuple[int, ...] | None, ...] = (None,) * 4


def find(calls: Sequence[fx.Node]) -> list[AttentionMatch]:
    """Every attention site among a graph's call nodes, in order."""
    return [m for n in calls if _is_sdpa(n) and (m := _match(n)) is not None]


def _is_sdpa(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    names = {a.name for a in getattr(schema, "arguments", ())}
    return schema is not None and "scaled_dot_product" in schema.name and {"query", "key", "value"} <= names \
        and "grad_out" not in names and "out" not in names


def arguments(node: fx.Node) -> dict[str, Any]:
    """A call's arguments by their schema names, defaults filled in."""
    values = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            values[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            values[arg.name] = node.kwargs[arg.name]
        else:
            values[arg.name] = arg.default_value if arg.has_default_value() else None
    return values


def _match(node: fx.Node) -> AttentionMatch | None:
    args = arguments(node)
    outputs = tuple(node.users)
    if not outputs or any(u.target is not operator.getitem or u.args[1] != 0 for u in outputs):
        return None  # the log-sum-exp (training) or another output is read
    if any(args[name] not in (None, False, 0) for name in args if name not in KNOWN) or args["dropout_p"]:
        return None
    mask_node = next((args[n] for n in MASK_NAMES if args.get(n) is not None), None)
    mask = None if mask_node is None else mask_source(mask_node)
    sdpa_q, out = val(args["query"]), val(outputs[0])
    if not static(sdpa_q, out) or sdpa_q.dim() != 4:
        return None
    for grouped in (True, False):  # k and v read before their repeat, else as SDPA reads them
        k_node, v_node, group = _kv(args, grouped)
        if k_node is None:
            continue
        k, v = val(k_node), val(v_node)
        if not static(k, v) or k.shape != v.shape or k.dim() != 4:
            return None
        if sdpa_q.shape[0] != k.shape[0] or sdpa_q.shape[1] != k.shape[1] * group or sdpa_q.shape[3] != k.shape[3] \
                or len({sdpa_q.dtype, k.dtype, v.dtype}) != 1 or str(sdpa_q.dtype) not in DTYPE_NAMES:
            continue
        q_rot, q_shape = _q_rotary(args["query"])
        k_rot = rotary(k_node)
        fields, tables, views = _rope(q_rot, k_rot)
        try:
            expr = Attention(*sdpa_q.shape[:3], k.shape[2], sdpa_q.shape[3], DTYPE_NAMES[str(sdpa_q.dtype)],
                             args["scale"], **_mask_fields(mask, (*sdpa_q.shape[:3], k.shape[2])),
                             causal=bool(args["is_causal"]), out_order=out_order(out), group=group, **fields)
        except (ExprError, ValueError):
            continue  # too many rows (prefill), head dims past 256, a mask the kernel cannot read
        return AttentionMatch(expr, node, args["query"] if q_rot is None else q_rot.x, k_node if k_rot is None
                              else k_rot.x, v_node, mask, outputs, tables=tables, q_shape=q_shape, table_views=views)
    return None


def _kv(args: dict[str, Any], grouped: bool) -> tuple[Any, Any, int]:
    """k and v as a site reads them, and the query heads per key/value head: before a repeat over
    the group as models write it (`grouped`; (None, None, 0) where there is none), else as SDPA
    reads them (fewer heads in k and v than in q: torch's own grouping, `enable_gqa`)."""
    k, v = args["key"], args["value"]
    if grouped:
        rk, rv = repeated(k), repeated(v)
        if rk is None or rv is None or rk[1] != rv[1]:
            return None, None, 0
        return rk[0], rv[0], rk[1]
    q, kv = val(args["query"]), val(k)
    gqa = static(q, kv) and q.dim() == kv.dim() == 4 and kv.shape[1] and q.shape[1] % kv.shape[1] == 0
    return k, v, q.shape[1] // kv.shape[1] if gqa else 1


def _q_rotary(q: fx.Node) -> tuple[Rotary | None, tuple[int, ...] | None]:
    """q's rotation, and the shape the site views its input to where SDPA reads a view of it."""
    r = rotary(q)
    if r is not None or not (isinstance(q, fx.Node) and q.op == "call_function" and q.target in VIEWS):
        return r, None
    r = rotary(q.args[0])
    if r is None:
        return None, None
    x, viewed = val(r.x), val(q)
    # a view that keeps each batch's rows in that batch and each row's lanes commutes with a
    # rotation that varies along batch and lane only
    if same_for_rows(r) and r.lanes == x.shape[-1] == viewed.shape[-1] and x.shape[0] == viewed.shape[0]:
        return r, tuple(viewed.shape)
    return None, None


def _rope(q: Rotary | None, k: Rotary | None) -> tuple[dict[str, Any], tuple, tuple]:
    """The expression's rotary fields, the site's four rotary operands and the shapes they are
    viewed to: the positions and frequencies both sides' tables are computed from, where the kernel
    can compute them alike (`rope_angles`), else the tables."""
    lanes = {"rope_q": q.lanes if q else 0, "rope_k": k.lanes if k else 0}
    tables = (*_tables(q), *_tables(k))
    found = [None if r is None else angles(r.cos, r.sin) for r in (q, k)]
    given = [a for r, a in zip((q, k), found) if r is not None]
    if not given or None in given or len({(a.pos_type, a.freq_type, a.scale) for a in given}) != 1:
        return {**lanes, "rope_dims": table_dims(*tables)}, tables, (None,) * 4
    views = [a.view for a in given]
    dims = ("b" if any(v[0] > 1 for v in views) else "") + ("n" if any(v[2] > 1 for v in views) else "")
    a = given[0]
    fields = {**lanes, "rope_dims": dims, "rope_pos": a.pos_type, "rope_freq": a.freq_type, "rope_scale": a.scale}
    operands: list = []
    shapes: list = []
    for side in found:  # q's positions and frequencies, then k's (None for a side not rotated)
        operands += (None, None) if side is None else (side.positions, side.freqs)
        shapes += (None, None) if side is None else (side.view, (val(side.freqs).numel(),))
    return fields, tuple(operands), tuple(shapes)


def _tables(r: Rotary | None) -> tuple:
    return (None, None) if r is None else (r.cos, r.sin)


def rope_fits(expr: Attention, lanes: int, rows: int, cos: Any, sin: Any) -> bool:
    """Whether a call's rotary tables for `rows` rows suit a kernel rotating `lanes` lanes: none
    without a rotation, else cos and sin alike in the tuned dtype, [B or 1, 1, rows or 1, lanes]
    (`rope_pos`: positions of the tuned type [B or 1, 1, rows or 1, 1], frequencies [lanes / 2])."""
    if not lanes:
        return cos is None and sin is None
    if expr.rope_pos and cos is not None and sin is not None:  # positions and frequencies
        return POSITION_TYPES.get(cos.dtype) == expr.rope_pos and FREQ_TYPES.get(sin.dtype) == expr.rope_freq \
            and table_fits(cos, expr.batch, rows, 1) and sin.dim() == 1 and sin.shape[0] * 2 == lanes
    if cos is None or sin is None or cos.shape != sin.shape or cos.stride() != sin.stride():
        return False
    return all(DTYPE_NAMES.get(str(t.dtype)) == expr.dtype for t in (cos, sin)) and table_fits(cos, expr.batch, rows,
                                                                                              lanes)


def _mask_fields(mask: fx.Node | None, sizes: tuple[int, ...]) -> dict[str, Any]:
    """The expression's mask fields for a mask node (ValueError for one the kernel cannot read)."""
    if mask is None:
        return {}
    m = val(mask)
    kind = "bool" if static(m) and m.dtype == torch.bool else DTYPE_NAMES.get(str(getattr(m, "dtype", None)))
    dims = mask_dims(m, sizes) if kind and static(m) else None
    if dims is None:
        raise ValueError("a mask the kernel cannot read")
    return {"mask": kind, "mask_dims": dims}


def mask_dims(mask: Any, sizes: Sequence[int]) -> str | None:
    """The dimensions (of "bhqk") a mask tensor varies along when broadcast to `sizes` (B, H, Lq,
    Lk), or None if it does not broadcast to them."""
    if mask.dim() > 4:
        return None
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    if any(n not in (1, size) for n, size in zip(shape, sizes)):
        return None
    return "".join(c for c, n in zip(MASK_DIMS, shape) if n > 1)


def mask_source(node: fx.Node) -> fx.Node:
    """The mask before torch broadcast it (expand) or padded and sliced back its last dimension to
    align its rows: the same values, broadcast by the kernel."""
    while isinstance(node, fx.Node) and node.op == "call_function":
        if node.target == A.expand.default:
            node = node.args[0]
        elif _unpadded(node):
            node = node.args[0].args[0]
        else:
            break
    return node


def _unpadded(node: fx.Node) -> bool:
    """Whether `node` slices a constant_pad_nd's right padding of the last dimension back off."""
    if node.target != A.slice.Tensor or not isinstance(node.args[0], fx.Node):
        return False
    pad = node.args[0]
    if pad.target != A.constant_pad_nd.default or not isinstance(pad.args[0], fx.Node):
        return False
    dim, start, end, step = (*node.args[1:], *(0, None, None, 1)[len(node.args) - 1:])[:4]  # defaults filled in
    widths, rank = list(pad.args[1]), val(pad).dim()
    return (dim in (-1, rank - 1) and start in (0, None) and step == 1 and end == val(pad.args[0]).shape[-1]
            and len(widths) == 2 and widths[0] == 0)


def out_order(out: Any) -> str:
    """The order (of "bhqd", outermost first) in which a dense output lays out its dimensions;
    ValueError for an output that is not dense in any order."""
    dims = sorted(range(4), key=lambda i: (-out.stride(i), i))
    order = "".join(OUT_DIMS[i] for i in dims)
    if dense_strides(tuple(out.shape), order) != tuple(out.stride()):
        raise ValueError(f"an output of strides {out.stride()} is not dense")
    return order

