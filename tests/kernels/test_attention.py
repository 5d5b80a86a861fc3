"""The attention family: few query rows against any number of keys, checked against float64 under
the interpreter at awkward shapes in every path (MMA and broadcast products, key tails, padded head
dims, masks broadcast over batch and heads, boolean and additive, causal, fully masked rows,
grouped-query attention, rotary embeddings on q and k, whole and partial); a
kernel without the online softmax's rescale is caught; the space prunes what cannot run well; every
knob builds for sm_90."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cases import run_case
from test_codegen_sm90 import build_sm90

from tritune.kernels.attention import template
from tritune.kernels.attention.expr import Attention
from tritune.kernels.expr import ExprError
from tritune.kernels.family import family
from tritune.schedules.config import Config
from tritune.schedules.space import Limits
from tritune.tuner.worker.candidate import rel_error

FAM = family("attention")
H100 = Limits(*Limits.KNOWN[(9, 0)])
CONFIGS = [Config.of(BLOCK_N=16, DOT=0, num_warps=2, num_stages=1),
           Config.of(BLOCK_N=32, DOT=1, num_warps=4, num_stages=2),
           Config.of(BLOCK_N=64, DOT=1, num_warps=1, num_stages=3),
           Config.of(BLOCK_N=16, DOT=0, num_warps=2, num_stages=1, SPLIT=2),  # flash-decoding
           Config.of(BLOCK_N=16, DOT=1, num_warps=4, num_stages=2, SPLIT=4)]
SHAPES = [
    Attention(2, 3, 1, 37, 80, mask="fp16", mask_dims="bk"),  # decode: a mask per sequence, shared by the heads
    Attention(3, 2, 3, 50, 80, "fp32", mask="fp32", mask_dims="hqk"),  # shared by the batch
    Attention(2, 2, 5, 19, 16, mask="bool", mask_dims="bqk"),
    Attention(1, 2, 4, 33, 24, "fp32", mask="bool", mask_dims="k"),  # one row of keys for everything
    Attention(2, 2, 3, 40, 32, "fp32", causal=True),
    Attention(2, 3, 2, 1, 64, out_order="bqhd"),  # one key, the output [B, Lq, H, D] in memory
    Attention(1, 2, 64, 100, 64, scale=0.1),  # the most rows a program holds
    # grouped-query attention (k and v shared by `group` query heads), rotary embeddings on q and k
    Attention(2, 8, 3, 37, 64, "fp32", mask="fp16", mask_dims="bhqk", group=4, rope_q=64, rope_k=64, rope_dims="bn"),
    Attention(3, 6, 1, 21, 80, group=3, rope_q=20, rope_k=20),  # a NeoX-style partial rotation, D padded
    Attention(2, 4, 2, 19, 32, "fp32", causal=True, group=2, rope_q=32, rope_dims="n"),  # q alone rotated
    Attention(1, 16, 4, 30, 16, "fp32", group=16),  # the most rows: every head of the group
    # the tables computed in the kernel from positions (up to 4095) and frequencies
    Attention(2, 8, 3, 37, 64, "fp32", group=4, rope_q=64, rope_k=64, rope_dims="bn", rope_pos="i64"),
    Attention(3, 6, 2, 21, 80, group=3, rope_q=20, rope_k=20, rope_dims="n", rope_pos="i32", rope_freq="fp16",
              rope_scale=0.75),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"N{c['BLOCK_N']}-dot{c['DOT']}-split{c.get('SPLIT', 1)}")
@pytest.mark.parametrize("expr", SHAPES, ids=lambda e: e.describe())
def test_every_path_computes_the_float64_reference(expr, config):
    err, tol = run_case(expr, config)
    assert err <= tol


def test_rows_with_every_key_masked_are_zero_as_torch_defines_them():
    expr = Attention(2, 2, 3, 37, 16, "fp32", mask="bool", mask_dims="bqk")
    x = FAM.inputs(expr, 0, "cpu")
    q, k, v, out, mask = x.args
    mask[0, 0, 1] = False  # every key of one row of sequence 0
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    for m, e in ((mask, expr), (additive, Attention(2, 2, 3, 37, 16, "fp32", mask="fp32", mask_dims="bqk"))):
        for config in CONFIGS:
            out.fill_(float("nan"))
            FAM.kernel(e, config, FAM.problem_of(e, (q, k, v, out, m)))(q, k, v, out, m)
            assert (out[0, :, 1] == 0).all() and torch.isfinite(out).all()
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # torch's: 0 there too
            assert rel_error(out, ref.double()) <= FAM.tolerance(e)
            assert rel_error(out, FAM.reference(e, (q, k, v, out, m))) <= FAM.tolerance(e)


def test_a_kernel_without_the_running_max_rescale_is_caught(monkeypatch):
    expr = Attention(2, 3, 3, 37, 80, mask="fp16", mask_dims="bqk")  # three key blocks of 16
    for config in CONFIGS[:2]:
        assert run_case(expr, config)[0] <= FAM.tolerance(expr)
    rescaled = "acc = acc * alpha[:, None] + "
    assert template._SOURCE.count(rescaled) == 3  # the broadcast and MMA steps, the splits' merge
    monkeypatch.setattr(template, "_SOURCE", template._SOURCE.replace(rescaled, "acc = acc + "))
    for config in CONFIGS[:2]:
        err, tol = run_case(expr, config)
        assert err > tol


def test_a_merge_of_key_splits_without_their_rescale_is_caught(monkeypatch):
    expr = Attention(2, 3, 3, 37, 80, mask="fp16", mask_dims="bqk")
    split = CONFIGS[3]
    merged = "acc = acc * alpha[:, None] + tl.load("
    monkeypatch.setattr(template, "_SOURCE", template._SOURCE.replace(merged, "acc = acc + tl.load("))
    assert run_case(expr, CONFIGS[0])[0] <= FAM.tolerance(expr)  # unsplit: no merge
    assert run_case(expr, split)[0] > FAM.tolerance(expr)


def test_key_splits_rearm_their_counters_launch_after_launch():
    expr = Attention(1, 2, 1, 100, 32, "fp32", mask="fp32", mask_dims="k")
    x = FAM.inputs(expr, 0, "cpu")
    kernel = FAM.kernel(expr, CONFIGS[4], FAM.problem_of(expr, x.args))
    for _ in range(3):
        x.out.fill_(float("nan"))
        kernel(*x.args)
        assert rel_error(x.out, FAM.reference(expr, x.args)) <= FAM.tolerance(expr)


def test_a_kernel_that_drops_the_key_tail_mask_is_caught(monkeypatch):
    expr = Attention(2, 2, 1, 37, 16, "fp32")  # 37 keys: a block of 16 ends 11 keys past them
    monkeypatch.setattr(template, "_SOURCE", template._SOURCE.replace(
        's = tl.where(key_ok[None, :], s, float("-inf"))', "pass"))
    assert run_case(expr, CONFIGS[0])[0] > FAM.tolerance(expr)


def test_bad_expressions_are_one_expr_error():
    for bad, match in ((dict(lq=65), "at most 64"), (dict(d=257), "at most 256"), (dict(mask="int8"), "unknown mask"),
                       (dict(mask="fp16", mask_dims="kb"), "mask_dims"), (dict(mask_dims="b"), "without a mask"),
                       (dict(mask="bool", causal=True), "causal"), (dict(out_order="bhq"), "out_order"),
                       (dict(scale=0.0), "scale"), (dict(scale=float("inf")), "scale"),
                       (dict(group=3), "divisor of heads"), (dict(group=0), "group"), (dict(lq=33, group=2), "group"),
                       (dict(rope_q=3), "rope_q"), (dict(rope_k=18), "rope_k"), (dict(rope_dims="n"), "rope_dims"),
                       (dict(rope_q=16, rope_dims="nb"), "rope_dims"), (dict(rope_q=16, rope_dims="h"), "rope_dims")):
        with pytest.raises(ExprError, match=match):
            Attention(**{**dict(batch=2, heads=2, lq=3, lk=7, d=16), **bad})


def test_the_command_line_takes_the_group_and_the_rotation():
    expr = FAM.from_cli("16,32,1,4096,128", "bf16", {"group": "8", "rope": "128"})
    # a table row per position, the same for every sequence
    assert (expr.heads, expr.kv_heads, expr.rope_q, expr.rope_k, expr.rope_dims) == (32, 4, 128, 128, "n")
    assert FAM.from_cli("1,8,4,100,64", "fp16", {}).rope_dims == ""
    for options, match in (({"group": "x"}, "--group"), ({"group": "3"}, "divisor"), ({"rope": "7"}, "rope_q"),
                           ({"mask": "fp16"}, "--mask does not apply")):
        with pytest.raises(ExprError, match=match):
            FAM.from_cli("16,32,1,4096,128", "fp16", options)


def test_the_mask_pattern_and_scale_have_one_stored_form():
    # a dimension of size 1 never varies: the same workload whether or not it is named
    assert Attention(16, 4, 4, 1, 16, mask="fp32", mask_dims="bk").key == Attention(16, 4, 4, 1, 16, mask="fp32",
                                                                                    mask_dims="b").key
    assert Attention(2, 2, 1, 9, 16).key == Attention(2, 2, 1, 9, 16, scale=0.25).key
    assert Attention(2, 2, 1, 9, 16).key != Attention(2, 2, 1, 9, 16, mask="bool", mask_dims="bk").key
    assert FAM.from_cli("16,16,1,1024,128", "bf16", {}) == Attention(16, 16, 1, 1024, 128, "bf16")


def test_the_space_prunes_what_cannot_run_well():
    space = FAM.space(Attention(16, 4, 64, 4096, 256), H100)
    configs = [space.config(int(i)) for i in space.valid_indices]
    assert configs and all(c["DOT"] == 1 for c in configs)  # 64 x N x 256 products in registers spill
    one_key = [space.config(int(i)) for i in FAM.space(Attention(16, 4, 4, 1, 128), H100).valid_indices]
    assert {c["BLOCK_N"] for c in one_key} == {16} and {c["num_stages"] for c in one_key} == {1}
    decode = FAM.space(Attention(1, 16, 1, 4096, 128), H100)
    configs = [decode.config(int(i)) for i in decode.valid_indices]
    assert {c["DOT"] for c in configs} == {0, 1} and {c["BLOCK_N"] for c in configs} >= {32, 64, 128}
    assert all(c["num_stages"] == 1 for c in configs if not c["DOT"])  # the same binary at every stage count
    # 16 heads over 4096 keys split up to 16 ways (256 programs); 32 ways: 16 already fill 132 SMs
    assert {c["SPLIT"] for c in configs} == {1, 2, 4, 8, 16}
    assert "fills" in decode.why_invalid(Config.of(BLOCK_N=64, DOT=0, num_warps=4, num_stages=1, SPLIT=32))
    assert {c["SPLIT"] for c in map(FAM.space(Attention(16, 16, 1, 1000, 64), H100).config,
                                    FAM.space(Attention(16, 16, 1, 1000, 64), H100).valid_indices)} == {1}
    short = FAM.space(Attention(1, 3, 4, 70, 64), H100)  # 4 splits of 2 blocks of 16 leave the last none
    assert "without keys" in short.why_invalid(Config.of(BLOCK_N=16, DOT=0, num_warps=1, num_stages=1, SPLIT=4))
    assert "spills" in decode.why_invalid(Config.of(BLOCK_N=256, DOT=0, num_warps=1, num_stages=1))
    narrow = FAM.space(Attention(1, 16, 1, 4096, 64), H100)
    assert "full vectors" in narrow.why_invalid(Config.of(BLOCK_N=16, DOT=0, num_warps=8, num_stages=1))
    wide = FAM.space(Attention(1, 16, 1, 4096, 128, "fp32"), H100)
    assert "shared memory" in wide.why_invalid(Config.of(BLOCK_N=64, DOT=1, num_warps=8, num_stages=4))
    rng = np.random.default_rng(0)
    for expr in FAM.examples():  # every example has candidates, each a valid feature row
        sample = FAM.space(expr, H100).sample(rng, 8)
        assert sample and np.isfinite(FAM.features(expr, H100, sample)).all()


@pytest.mark.system
def test_every_knob_builds_for_sm90():
    decode = Attention(16, 4, 4, 1024, 128, mask="fp16", mask_dims="bk")
    cases = [(decode, Config.of(BLOCK_N=n, DOT=dot, num_warps=w, num_stages=s))
             for n, dot, w, s in ((16, 0, 1, 1), (32, 0, 2, 1), (64, 0, 4, 1), (128, 0, 8, 1), (256, 1, 8, 2),
                                  (32, 1, 4, 1), (64, 1, 4, 3), (128, 1, 4, 4))]
    cases += [(Attention(16, 16, 1, 4096, 64, "bf16"), Config.of(BLOCK_N=64, DOT=1, num_warps=4, num_stages=3)),
              (Attention(1, 16, 1, 4096, 128), Config.of(BLOCK_N=64, DOT=0, num_warps=4, num_stages=1, SPLIT=16)),
              (Attention(16, 4, 4, 1024, 128, "bf16"),
               Config.of(BLOCK_N=32, DOT=1, num_warps=4, num_stages=3, SPLIT=4)),
              (Attention(2, 3, 5, 300, 80, "fp32", mask="bool", mask_dims="hqk"),
               Config.of(BLOCK_N=32, DOT=1, num_warps=4, num_stages=2)),
              (Attention(2, 3, 3, 100, 80, causal=True, out_order="bqhd"),
               Config.of(BLOCK_N=32, DOT=0, num_warps=4, num_stages=1))]
    results = build_sm90(cases)
    assert len(results) == len(cases) and all(r["warps"] == c["num_warps"] for r, (_, c) in zip(results, cases))
    limit = H100.shared_bytes
    assert all(r["shared"] <= limit for r in results)
