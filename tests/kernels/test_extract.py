"""extract_tasks: contractions, layouts and fused epilogues found in small models, with counts."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tritune
from models import AWKWARD_TASKS, Awkward, Block, awkward_inputs
from tritune.kernels.epilogue import BiasAdd, Binary, Gelu, Input, Scale
from tritune.kernels.backend.extract import ExtractError


def summary(tasks):
    return [(t.expr.describe(), t.count) for t in tasks]


def test_awkward_model_tasks_counts_layouts_and_epilogues():
    tasks = tritune.extract_tasks(Awkward(), awkward_inputs())
    assert summary(tasks) == AWKWARD_TASKS
    up, down, *_, bmm, baddbmm = tasks
    assert up.expr.epilogue == (BiasAdd(), Gelu("tanh")) and up.expr.trans_b and not up.expr.trans_a
    assert down.expr.epilogue == (Binary("add", Input("mn", "fp32")),) and down.unfused == up.unfused == ()
    assert bmm.expr.epilogue == (Scale(0.25), BiasAdd()) and baddbmm.expr.epilogue == (Scale(0.5), BiasAdd())
    assert bmm.expr.batch == 3 and bmm.flops == 2 * 3 * 5 * 5 * 7


def test_meta_device_and_half_precision_give_the_same_workloads():
    with torch.device("meta"):
        model = Awkward().half()
    tasks = tritune.extract_tasks(model, awkward_inputs(torch.float16, "meta"))
    assert summary(tasks) == [(d.replace("fp32", "fp16"), n) for d, n in AWKWARD_TASKS]


def test_transformer_block():
    # on the device it runs on: on meta, attention would trace as its math form (two bmm)
    model = Block(hidden=64, heads=4).half()
    tasks = tritune.extract_tasks(model, torch.empty(2, 24, 64, dtype=torch.float16))
    # q, k, v as one wide GEMM; attention (24 query rows a head: few enough); o and down with their
    # residual add fused
    assert summary(tasks) == [("wide 48x(64+64+64)x64 fp16 +bias", 1),
                              ("attention 2x4 q24 k24 d16 fp16 causal out bqhd", 1),
                              ("matmul 48x64x64 fp16 NT+bias+add", 1), ("matmul 48x256x64 fp16 NT+bias+gelu", 1),
                              ("matmul 48x64x256 fp16 NT+bias+add", 1)]
    assert tasks[2].expr.inputs == (Input("mn", "fp16"),) and not any(t.unfused for t in tasks)


class Shared(nn.Module):
    """A contraction whose result is read twice fuses nothing; a transposed A is found as such."""

    def forward(self, a, b):
        p = a.t() @ b
        return F.relu(p), p * 2


def test_no_fusion_past_a_shared_result_and_transposed_a():
    tasks = tritune.extract_tasks(Shared(), (torch.randn(13, 9), torch.randn(13, 11)))
    assert summary(tasks) == [("matmul 9x11x13 fp32 TN", 1)]


class DataDependent(nn.Module):
    def forward(self, x):
        return x @ x if x.sum() > 0 else x


def test_a_model_export_cannot_capture_is_one_clear_error():
    with pytest.raises(ExtractError, match=r"^torch.export could not capture the model: \w+") as info:
        tritune.extract_tasks(DataDependent(), (torch.randn(4, 4),))
    assert "\n" not in str(info.value)


MODELS = str(Path(__file__).parents[1] / "helpers" / "models.py")


@pytest.mark.parametrize("args, needle", [
    (["--model", "no_such_pkg.mod:f"], "cannot import 'no_such_pkg.mod': ModuleNotFoundError"),
    (["--model", "missing.py:f"], "no such file: missing.py"),
    (["--model", f"{MODELS}:nothing"], "has no callable 'nothing'"),
    (["--model", "builtins:dict"], "the factory returned a dict, not a torch.nn.Module"),
    (["--model", f"{MODELS}:mlp", "--input-shape", "2,x"], "bad --input-shape '2,x'"),
    (["--model", f"{MODELS}:mlp", "--input-shape", "2,20,63"], "torch.export could not capture the model"),
    (["--model", f"{MODELS}:mlp", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--model", f"{MODELS}:mlp", "--strategy", "magic"], "unknown strategy 'magic'"),
])
def test_tune_model_bad_input_is_one_line_exit_2(capsys, tmp_path, args, needle):
    from tritune.tuner.cli import main

    argv = ["tune-model", "--input-shape", "2,20,64", *args, "--db", str(tmp_path / "t.db")]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and needle in err and err.count("\n") == 1 and err.startswith("tune-cli: ")
    assert not (tmp_path / "t.db").exists()


def test_the_plan_shares_trials_by_the_root_of_each_tasks_flops():
    from types import SimpleNamespace

    from tritune.tuner.model.plan import plan

    # a head of 100x the FLOPs of a projection gets 10x its trials beyond the floor, not 100x; the
    # total is kept and the largest task comes first
    tasks = [SimpleNamespace(flops=1.0), SimpleNamespace(flops=100.0)]
    planned = plan(tasks, 60, floor=5)
    assert [p.trials for p in planned] == [50, 10] and planned[0].task.flops == 100.0
    assert [round(p.share, 3) for p in planned] == [0.990, 0.010]
    assert [p.trials for p in plan(tasks, 4, floor=16)] == [2, 2]  # a budget below the floors is split evenly


@pytest.mark.system
def test_tune_model_shares_the_budget_and_tunes_every_workload(monkeypatch, tmp_path, capsys):
    from functools import partial

    import fake_worker
    from fakes import FakeBuilder
    from tritune.records.database import Database
    from tritune.tuner.gpus import start
    from tritune.tuner.cli import main
    from tritune.tuner.worker.local import LocalRunner

    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=fake_worker.session_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())
    db = tmp_path / "t.db"
    main(["tune-model", "--model", f"{MODELS}:mlp", "--input-shape", "2,20,64", "--dtype", "fp32", "--trials", "25",
          "--strategy", "random", "--no-check", "--db", str(db)])
    out = capsys.readouterr()
    assert "matmul 40x96x64 fp32 NT+bias+gelu" in out.out and "task 2/2" in out.err
    with Database(db) as d:
        stored = {spec: len(d.trials(key)) for key, _, _, spec in d.workloads()}
    # equal FLOPs: 12 each, and the trial rounding left over goes to one of them
    assert sorted(stored.values()) == [12, 13] and all('"tf32":false' in s for s in stored)


def test_an_uninitialised_build_allocates_its_weights_only_in_the_asked_dtype(monkeypatch):
    from tritune.tuner.model.load import build

    allocated = []
    to_empty = nn.Module.to_empty

    def spy(module, *args, **kwargs):
        allocated.append({p.dtype for p in module.parameters()})
        return to_empty(module, *args, **kwargs)
    monkeypatch.setattr(nn.Module, "to_empty", spy)
    model, _ = build(lambda: Block(64, 4), [], "fp16", "cpu", "empty")  # no full-precision copy first
    assert allocated == [{torch.float16}]
    assert {(p.dtype, p.device.type) for p in model.parameters()} == {(torch.float16, "cpu")}
