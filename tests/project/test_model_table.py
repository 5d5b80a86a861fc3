"""The model benchmark's arithmetic and final table (scripts/bench/model_table.py) on a made-up
model_bench.json, and its command line for the zoo's decoders at both decode batches; no GPU."""
import json
import math
from pathlib import Path

import pytest

from scripts.bench import model_bench, model_table
from scripts.bench.bench_children import SHAPES, hidden_of

RESULTS = {
    "latency": {  # ratios as the latency phase pairs them (ours / theirs, lower is better)
        "llama/decode": {"variants": {"tritune": {"latency_ms": 0.4, "x_default": 0.8},
                                      "tritune-ro": {"latency_ms": 0.3, "x_reduce-overhead": 0.9}}},
        "qwen2/decode1": {"variants": {"tritune": {"latency_ms": 0.5, "x_default": 1.25},
                                       "tritune-ro": {"latency_ms": 0.4, "x_reduce-overhead": 1.0}}},
        "llama/prefill": {"variants": {"tritune": {"latency_ms": 9.0, "x_default": 4.0}}},
    },
    "profile": {
        "llama/decode": {"weight_bytes": 300_000_000, "copy_gbps": 3000.0,
                         "default": {"gpu_us": 150.0, "launches": 40, "top": []},
                         "tritune-ro": {"gpu_us": 120.0, "launches": 30, "top": []}},
        "qwen2/decode1": {"weight_bytes": 600_000_000, "copy_gbps": 2000.0, "error": "exit 1: boom",
                          "default": {"error": "no kernel"}, "tritune-ro": {"gpu_us": 330.0, "launches": 30, "top": []}},
        "llama/prefill": {"weight_bytes": 300_000_000, "copy_gbps": 3000.0, "default": {"gpu_us": 9000.0}},
    },
}


def section(text: str, head: str, heads: int = 1) -> tuple[list[str], dict[str, list[str]]]:
    """A table of the report: its header lines (the first starts with `head`), and its rows' cells by their first."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    rows = {}
    for line in lines[start + heads:]:
        if not line.startswith(("llama/", "qwen2/", "decode geomean")):
            break
        key = "decode geomean" if line.startswith("decode geomean") else line.split()[0]
        rows[key] = line[15:].split()
    return lines[start:start + heads], rows


def test_the_floor_is_the_weights_over_the_copy_bandwidth():
    assert model_table.floor_us(3_000_000_000, 3000.0) == pytest.approx(1000.0)  # 3 GB at 3 TB/s: 1 ms
    assert model_table.floor_us(802_717_696, 3350.0) == pytest.approx(239.617, rel=1e-4)


def test_decode_rows_give_each_variant_as_a_multiple_of_its_floor():
    (head,), rows = section(model_table.report(RESULTS), "decode floor")
    # the variants the decode rows profiled, in the benchmark's order; no prefill row
    assert [c for c in head.split() if c in ("default", "tritune", "tritune-ro")] == ["default", "tritune-ro"]
    assert set(rows) == {"llama/decode", "qwen2/decode1"}
    floor = model_table.floor_us(300_000_000, 3000.0)  # 100 us
    assert rows["llama/decode"] == ["300.0", "3000.0", f"{floor:.1f}", "150.0", "1.50x", "120.0", "1.20x"]
    # a variant that failed is a dash; the child's error is shown
    assert rows["qwen2/decode1"] == ["600.0", "2000.0", "300.0", "-", "-", "330.0", "1.10x", "[exit", "1:", "boom]"]


def test_the_ratios_and_their_geometric_mean_over_the_decode_rows_only():
    (legend, head), rows = section(model_table.report(RESULTS), "ratios", heads=2)
    assert "latency tritune/default <= 1.00; latency tritune-ro/reduce-overhead <= 1.00" in legend
    assert head.split()[1:5] == ["lat", "tr/def", "lat", "tr-ro/ro"]
    assert rows["llama/decode"] == ["0.800", "0.900", "-", "-"]
    assert rows["qwen2/decode1"] == ["1.250", "1.000", "-", "-"]
    assert rows["llama/prefill"] == ["4.000", "-", "-", "-"]
    # sqrt(0.8 * 1.25) = 1 and sqrt(0.9 * 1.0): prefill's 4.0 is not in them
    assert rows["decode geomean"] == ["1.000", "(2)", f"{math.sqrt(0.9):.3f}", "(2)", "-", "(0)", "-", "(0)"]


def test_geomean_skips_missing_values():
    assert model_table.geomean([2.0, None, 8.0]) == (pytest.approx(4.0), 2)
    assert model_table.geomean([None]) == (None, 0)


def test_the_command_line_takes_the_new_decoders_at_both_decode_batches(tmp_path):
    args = model_bench.parse_args(["--out", str(tmp_path), "--models", "llama,gpt2,qwen2,neox",
                                   "--shapes", "decode1,decode", "--phases", "tune,latency,profile"])
    assert args.models == ["llama", "gpt2", "qwen2", "neox"] and [SHAPES[s] for s in args.shapes] == [(1, 1), (16, 1)]
    assert [model_bench.step(s) for s in ("prefill", "decode", "decode1")] == ["prefill", "decode", "decode"]
    assert [hidden_of(args, m) for m in args.models] == [2048, 1024, 2048, 1024]
    with pytest.raises(SystemExit):
        model_bench.parse_args(["--out", str(tmp_path), "--shapes", "decode2"])
    # with --hidden, tune-model's factories pass it on: one per zoo model, the new ones included
    args = model_bench.parse_args(["--out", str(tmp_path), "--hidden", "256"])
    path, _, name = model_bench.factory_spec(args, tmp_path, "neox").rpartition(":")
    assert name == "neox" and "def neox():\n    return zoo.neox(hidden=256)" in Path(path).read_text()


def test_runs_on_several_gpus_make_one_table(tmp_path, capsys):
    first = {"latency": {"llama/decode": RESULTS["latency"]["llama/decode"]}, "env": {"gpu": "A"}}
    second = {"latency": {"qwen2/decode1": RESULTS["latency"]["qwen2/decode1"]}, "profile": RESULTS["profile"]}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, (first, second)):
        path.write_text(json.dumps(data))
    assert model_table.main([str(p) for p in paths]) == 0
    text = capsys.readouterr().out
    assert "llama/decode" in text and "qwen2/decode1" in text and "decode geomean" in text
    assert model_table.merged([first, second])["latency"].keys() == {"llama/decode", "qwen2/decode1"}
    assert model_table.main([str(tmp_path / "missing.json")]) == 2
    assert "model_table:" in capsys.readouterr().err
