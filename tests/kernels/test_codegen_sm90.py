"""Codegen checked for the H100's target without a GPU: Triton compiles sm_90 code on any machine."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tritune.kernels.contraction.family import MATMUL
from tritune.kernels.faults import FAULTS
from tritune.kernels.contraction.expr import Matmul
from tritune.kernels.epilogue import BiasAdd, Gelu, Relu, Scale
from tritune.kernels.gated.expr import Gated
from tritune.kernels.wide.expr import Wide
from tritune.schedules.config import Config
from tritune.schedules.contraction import shared_estimate

EPILOGUE = (Scale(0.5), BiasAdd(), Gelu("tanh"), Relu())
CASES = [
    ("fp16", dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, UNROLL=1)),
    ("bf16", dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=4, UNROLL=2)),
    ("fp32", dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=2, UNROLL=1)),
]
FAULTY = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, UNROLL=1)


def build_sm90(cases, ptx=False, replay=False):
    """Compile (expr, config) pairs in a subprocess: the interpreter is off there, as on a GPU host;
    `replay`: the call sites' specialised kernels, as a compiled model launches them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    lines = "".join(json.dumps({"expr": e.to_dict(), "config": dict(c), "ptx": ptx, "replay": replay}) + "\n"
                    for e, c in cases)
    proc = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "helpers" / "sm90_build.py")], input=lines,
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.system
def test_sm90_builds_use_wgmma_and_the_shared_estimate_is_exact():
    cases = [(Matmul(4096, 4096, 4096, dtype=d, epilogue=EPILOGUE), Config.of(k)) for d, k in CASES]
    cases += [(Matmul(256, 256, 256), Config.of(FAULTY, fault=f)) for f in FAULTS]  # built without the fault
    cases += [(Matmul(4096, 4096, 4096, epilogue=EPILOGUE), Config.of(CASES[0][1], **extra))
              for extra in (dict(TMA=1), dict(TMA=2, PERSISTENT=1), dict(PERSISTENT=1), dict(TMA=1, PERSISTENT=2))]
    cases += [(Matmul(64, 4096, 4096, epilogue=EPILOGUE), Config.of(CASES[1][1], SPLIT_K=4, UNROLL=1))]
    # q, k, v in one launch: one pipeline for every weight (a main loop per segment would take
    # one set of buffers each); a width of 1 (a constexpr where the others are ints) compiles too
    cases += [(Wide(2048, (2048, 512, 512), 2048), Config.of(CASES[0][1], BLOCK_N=128)),
              (Wide(1000, (64, 520, 72), 1576, dtype="bf16", trans_b=False, bias=True),
               Config.of(CASES[1][1], UNROLL=1)),
              (Wide(1000, (1, 520, 77), 1576, dtype="fp32", trans_b=False, bias=True), Config.of(CASES[2][1])),
              # tensor-descriptor loads: one descriptor over the segment's weight, both layouts
              (Wide(2048, (2048, 512, 512), 2048), Config.of(CASES[0][1], BLOCK_N=128, TMA=1)),
              (Wide(1000, (64, 520, 72), 1576, dtype="bf16", trans_b=False), Config.of(CASES[1][1], UNROLL=1, TMA=1))]
    results = build_sm90(cases)
    assert len(results) == len(cases)
    for (expr, config), got in zip(cases, results):
        assert got["wgmma"]  # Hopper tensor-core instructions, not the mma.sync fallback
        over = shared_estimate(config, 4 if expr.dtype == "fp32" else 2) - got["shared"]
        # layout-conversion scratch (unrolled loops, flattened persistent loops) is an upper bound
        assert over == 0 if config["UNROLL"] == 1 and config.get("PERSISTENT", 0) != 2 else 0 <= over <= 8192


@pytest.mark.system
def test_sm90_replayed_kernels_take_none_for_pointers_they_never_touch():
    """What a compiled model launches: sizes and strides as constexprs, and None (specialised away,
    nothing passed per launch) for a missing bias and, without split-K, for its scratch."""
    tile = Config.of(CASES[0][1], BLOCK_N=128)
    cases = [(Matmul(2048, 2048, 2048, trans_b=True), tile),
             (Matmul(2048, 2048, 2048, trans_b=True), tile.replace(TMA=1)),
             (Matmul(64, 4096, 4096, trans_b=True, epilogue=(BiasAdd(),)), Config.of(CASES[1][1], SPLIT_K=4, UNROLL=1)),
             (Gated(2048, 8192, 2048, "bf16", "silu"), Config.of(CASES[1][1], UNROLL=1, FUSE=1)),
             (Wide(2048, (2048, 512, 512), 2048), tile),
             (Wide(2048, (2048, 512, 512), 2048), tile.replace(TMA=1))]
    results = build_sm90(cases, replay=True)
    unsplit = ["WS", "LOCKS"]  # split-K's scratch: every GEMM kernel takes it, unsplit ones as None
    assert [r["nones"] for r in results] == [["BIAS", *unsplit], ["BIAS", *unsplit], [], ["B1", "B2", *unsplit],
                                             ["B0", "B1", "B2", *unsplit], ["B0", "B1", "B2", *unsplit]]
    assert all(r["wgmma"] for r in results)
    # pipelined as the tuned kernel was: the contraction's and the wide kernel's buffers as estimated
    assert [results[i]["shared"] for i in (0, 2, 4, 5)] == [shared_estimate(cases[i][1], 2) for i in (0, 2, 4, 5)]


@pytest.mark.parametrize("rows,warps", [(16, 4), (32, 8), (128, 2)])
@pytest.mark.system
def test_mma_sync_fallback_buffers_one_stage_fewer(rows, warps):
    # tiles under 64 rows, or fewer warps than a warp group, miss Hopper's warp-group MMA; the
    # estimate must not prune these builds for shared memory they do not take
    config = Config.of(BLOCK_M=rows, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=warps, num_stages=5, UNROLL=1)
    cases = [(Matmul(16 if rows == 16 else 4096, 4096, 4096), config), (Matmul(512, 4096, 4096), config.replace(TMA=1))]
    for (expr, c), got in zip(cases, build_sm90(cases)):
        assert not got["wgmma"] and got["shared"] == shared_estimate(c, 2)
        assert got["shared"] < 5 * (rows + 128) * 128 * 2  # five stages would not even fit


@pytest.mark.system
def test_warp_specialised_builds_add_a_producer_group_and_fit_the_shared_estimate():
    ws = dict(num_warps=4, UNROLL=1, WARP_SPEC=1)
    cases = [(Matmul(4096, 4096, 4096, epilogue=EPILOGUE), Config.of(CASES[0][1], TMA=1, **ws)),
             (Matmul(4096, 4096, 4096, dtype="bf16"), Config.of(CASES[0][1], BLOCK_M=256, BLOCK_N=128, TMA=2,
                                                                PERSISTENT=1, **ws)),
             (Matmul(1000, 520, 1576, trans_a=True), Config.of(CASES[1][1], BLOCK_N=128, TMA=1, **ws))]
    for (expr, config), got in zip(cases, build_sm90(cases)):
        assert got["wgmma"] and got["warps"] == 12  # 4 requested: producer + two consumer groups
        assert abs(got["shared"] - shared_estimate(config, 2)) <= 1024


def test_unknown_fault_is_refused():
    expr = Matmul(8, 8, 8)
    with pytest.raises(ValueError):
        MATMUL.kernel(expr, Config.of(FAULTY, fault="segfault-please"), MATMUL.canonical_problem(expr))


@pytest.mark.system
def test_strides_divisible_by_8_elements_still_get_16_byte_loads():
    """3000x5000x1000: leading dims are multiples of 8 fp16 elements, not 16; the divisibility hint
    lets every load of the K loop move 16 bytes, as at 4096^3 (the JIT would give 4 or 8)."""
    config = Config.of(CASES[0][1], BLOCK_N=128, BLOCK_K=64)
    cases = [(Matmul(4096, 4096, 4096), config), (Matmul(3000, 5000, 1000), config), (Matmul(3000, 5000, 1004), config)]
    widths = [sorted(set(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, (0x[0-9a-f]+)", r["ptx"])))
              for r in build_sm90(cases, ptx=True)]
    assert widths[0] == widths[1] == ["0x10"]
    assert "0x8" in widths[2]  # multiples of 4 only: 8-byte loads, so the check can tell them apart
