"""What a candidate's correctness check costs, by counting (never timing): the worker loads the very
binary the builder built (so loading is a cache hit, not a compile), every family and a decoder's
attention alike; the operands and the float64 reference are made once per workload, not per
candidate; the check keeps its strength: a wrong candidate and an unwritten output are rejected."""
import functools

import pytest
import torch

from tritune.kernels.attention.expr import Attention
from tritune.kernels.family import family, ops
from tritune.records.result import Status
from tritune.schedules.config import Config
from tritune.tuner.timing import Timing
from tritune.tuner.worker import candidate

# decode attention as tune-model extracts it from Llama, Qwen2 and GPT-NeoX: the cache holds rotated
# keys, so only q is rotated, its tables computed from positions (per batch, or per batch and row)
DECODE = (Attention(2, 16, 1, 96, 128, mask="fp16", mask_dims="bk", group=4, rope_q=128, rope_dims="b",
                    rope_pos="i64", rope_freq="fp16"),
          Attention(2, 4, 3, 40, 64, "bf16", group=2, rope_q=64, rope_dims="bn", rope_pos="i32"),
          Attention(2, 4, 1, 33, 64, mask="fp16", mask_dims="bk", rope_q=16, rope_dims="b", rope_pos="i64"),
          Attention(2, 4, 1, 33, 64, rope_k=32, rope_dims="n"))
EXPRS = [e for op in ops() for e in family(op).examples()] + list(DECODE)


@pytest.mark.parametrize("expr", EXPRS, ids=lambda e: e.describe())
def test_the_worker_loads_the_binary_the_builder_built(expr):
    fam = family(expr.op)
    x = fam.inputs(expr, 0, "cpu")
    config = fam.default_config(expr)
    # the builder builds for the canonical problem, the worker for the operands it made: any
    # difference is a second compile of every candidate in the worker, counted as its check
    built = fam.binary(expr, config, fam.canonical_problem(expr))
    assert fam.binary(expr, config, fam.problem_of(expr, x.args)) == built


ATTENTION = Attention(2, 4, 1, 37, 32, mask="fp16", mask_dims="bk", group=2, rope_q=32, rope_dims="b",
                      rope_pos="i64")
CONFIGS = (Config.of(BLOCK_N=16, DOT=0, num_warps=2, num_stages=1),
           Config.of(BLOCK_N=32, DOT=1, num_warps=4, num_stages=2),
           Config.of(BLOCK_N=16, DOT=1, num_warps=4, num_stages=1, SPLIT=2))


@pytest.fixture
def calls(monkeypatch):
    """Counts of the attention family's `inputs` and `reference` calls, on a fresh worker cache."""
    fam, counts = family("attention"), {"inputs": 0, "reference": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        return call

    for name in counts:
        monkeypatch.setattr(fam, name, counted(name, getattr(fam, name)))
    monkeypatch.setattr(candidate, "_current", {})
    return counts


def test_the_reference_is_made_once_per_workload(calls):
    other = Attention(1, 2, 2, 21, 16)
    for expr, configs in ((ATTENTION, CONFIGS), (other, CONFIGS[:2]), (ATTENTION, CONFIGS[1:])):
        for config in configs:
            _, args, err, tol = candidate.check_candidate(expr, config, 0, "cpu")
            assert err <= tol, (expr.describe(), config)
            assert not args[3].isnan().any()  # each candidate wrote its whole output
    assert calls == {"inputs": 3, "reference": 3}  # one of each per workload switch, not 7 candidates


def test_each_candidate_starts_from_the_generated_operands_with_a_poisoned_output(calls):
    kernel, args, _, _ = candidate.check_candidate(ATTENTION, CONFIGS[0], 0, "cpu")
    kept = [a.clone() for a in args[:3]]
    for a in args[:3]:
        a.mul_(-1)  # a candidate that wrote over its inputs
    args[3].zero_()
    _, again, err, tol = candidate.check_candidate(ATTENTION, CONFIGS[1].replace(fault="wrong"), 0, "cpu")
    assert err > tol  # judged on the generated operands, not on what the last one left behind
    assert all(torch.equal(a, k) for a, k in zip(again[:3], kept)) and calls["reference"] == 1


def test_a_wrong_candidate_is_rejected_before_it_is_timed(monkeypatch, calls):
    monkeypatch.setattr(candidate, "check_candidate", functools.partial(candidate.check_candidate, device="cpu"))
    timed = []
    monkeypatch.setattr(candidate, "small", lambda *a: timed.append(a))
    wrong = candidate.measure_candidate(ATTENTION, CONFIGS[2].replace(fault="wrong"), 0, Timing())
    assert wrong["status"] is Status.WRONG_ANSWER and "relative error" in wrong["message"]
    assert set(wrong["spent"]) == {"check"} and not timed


def test_the_relative_error_keeps_its_meaning():
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    out = (ref + 1e-3 * torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)).half()
    expected = float(torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref))
    assert candidate.rel_error(out, ref) == pytest.approx(expected, rel=1e-12) and expected > 0
    for bad in (float("nan"), float("inf"), float("-inf")):
        spoiled = out.clone()
        spoiled[1, 2, 3] = bad  # one element never written, or overflowed
        assert candidate.rel_error(spoiled, ref) == float("inf")
