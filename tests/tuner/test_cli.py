"""CLI: bad input gets one line and exit code 2 (no GPU: exit 3), nothing written; JSONL round trip."""
import os
import subprocess
import sys

import pytest

from tritune.records.database import Database
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner.cli import main, make_expr


def cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.mark.parametrize("args, needle", [
    (["run", "--op", "conv9d", "--shape", "64"], "unknown op 'conv9d'; known: matmul, bmm"),
    (["run", "--op", "bmm", "--shape", "64"], "bad --shape"),
    (["run", "--shape", "64", "--stride", "2"], "--stride does not apply to --op matmul"),
    (["run", "--shape", "64", "--eps", "1e-3"], "--eps does not apply to --op matmul"),
    (["run", "--op", "layernorm", "--shape", "64,100", "--eps", "tiny"], "bad --eps"),
    (["run", "--shape", "64,64"], "bad --shape"),
    (["run", "--shape", "a,b,c"], "bad --shape"),
    (["run", "--shape", "0"], "bad --shape"),
    (["run", "--shape", "64", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["run", "--shape", "64", "--strategy", "magic"], "unknown strategy 'magic'"),
    (["run", "--shape", "64", "--layout", "xy"], "bad --layout"),
    (["run", "--shape", "64", "--epilogue", "softmax"], "unknown epilogue 'softmax'"),
    (["run", "--shape", "64", "--trials", "0"], "--trials"),
    (["run", "--shape", "64", "--group", "2"], "--group does not apply to --op matmul"),
    (["run", "--op", "attention", "--shape", "2,6,1,9,16", "--group", "4"], "group must be a positive divisor"),
    (["run", "--op", "attention", "--shape", "2,6,1,9,16", "--rope", "half"], "bad --rope"),
    (["run", "--bogus"], "no such option"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, args, needle):
    db = tmp_path / "t.db"
    code, out, err = cli(capsys, *args, "--db", str(db))
    assert code == 2
    assert needle.lower() in err.lower() and err.count("\n") == 1 and err.startswith("tune-cli: ")
    assert not db.exists()


def test_no_gpu_is_one_line_exit_3(capsys, tmp_path):
    db = tmp_path / "t.db"
    code, _, err = cli(capsys, "run", "--shape", "64", "--db", str(db))
    assert code == 3 and "no CUDA GPU" in err and err.count("\n") == 1
    assert not db.exists()


@pytest.mark.parametrize("command", [["best"], ["export"], ["run", "--shape", "64"]])
def test_corrupt_database_is_exit_2_and_left_untouched(capsys, tmp_path, command):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    code, _, err = cli(capsys, *command, "--db", str(bad))
    assert code == 2 and str(bad) in err and err.count("\n") == 1
    assert bad.read_bytes() == b"this is not sqlite" * 100


def test_missing_database_for_reading_commands(capsys, tmp_path):
    code, _, err = cli(capsys, "best", "--db", str(tmp_path / "none.db"))
    assert code == 2 and not (tmp_path / "none.db").exists()


def test_export_import_and_best(capsys, tmp_path):
    src = Database(tmp_path / "a.db")
    key = make_expr("matmul", "64", "fp16").key  # an import checks that a workload's key is its spec's
    src.add_workload(key, "matmul", "fp16", '{"op":"matmul","batch":1,"m":64,"n":64,"k":64,"dtype":"fp16"}')
    device = DeviceKey("GPU", "9.0", "3.6", "2.11", "t")
    cfg = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, UNROLL=1)
    src.save(key, device, [MeasureResult(cfg, Status.OK, 0.01, 0.011, 0.012, 0.013, 1.0),
                           MeasureResult(cfg.replace(BLOCK_M=128), Status.TIMEOUT, message="hang")])
    src.close()
    dump = tmp_path / "dump.jsonl"
    assert cli(capsys, "export", "--db", str(tmp_path / "a.db"), "--out", str(dump))[0] == 0
    assert len(dump.read_text().splitlines()) == 2
    code, _, err = cli(capsys, "import", str(dump), "--db", str(tmp_path / "b.db"))
    assert code == 0 and "imported 2" in err
    assert cli(capsys, "import", str(dump), "--db", str(tmp_path / "b.db"))[2].startswith("imported 0")
    code, out, _ = cli(capsys, "best", "--db", str(tmp_path / "b.db"))
    assert code == 0 and "64x64x64" in out and "0.0120" in out


def test_bad_jsonl_import_is_exit_2_and_writes_nothing(capsys, tmp_path):
    dump = tmp_path / "bad.jsonl"
    dump.write_text('{"not": "a trial"}\n')
    code, _, err = cli(capsys, "import", str(dump), "--db", str(tmp_path / "b.db"))
    assert code == 2 and "line 1" in err
    assert Database(tmp_path / "b.db").workloads() == []


def test_shapes():
    dims = lambda e: (e.batch, e.m, e.n, e.k)  # noqa: E731
    assert dims(make_expr("matmul", "4096", "fp16")) == (1, 4096, 4096, 4096)
    assert dims(make_expr("matmul", "16,4096,2048", "fp16")) == (1, 16, 4096, 2048)
    assert dims(make_expr("bmm", "8,128,64,32", "fp16")) == (8, 128, 64, 32)


def test_module_entry_point_prints_no_traceback(tmp_path):
    env = dict(os.environ, TRITUNE_DB=str(tmp_path / "x.db"))
    proc = subprocess.run([sys.executable, "-m", "tritune", "run", "--op", "nope", "--shape", "8"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[0].startswith("tune-cli: unknown op 'nope'; known: matmul, bmm")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_summary_says_when_the_library_was_kept_over_the_tuned_kernel():
    from rich.console import Console

    from tritune.kernels.contraction.expr import Matmul
    from tritune.tuner.cli.display import summary_table

    h2h = {"ours_ms": 0.0174, "alternatives": {"addmm": 0.0174, "torch.compile": 0.0075},
           "best_alternative": "torch.compile", "best_alternative_ms": 0.0075}
    best = MeasureResult(Config.of(library="addmm"), Status.OK, t_median=0.0174)
    for kept, says in ((None, False), (0.0075, True)):
        console = Console(width=200, record=True)
        console.print(summary_table(Matmul(1, 4096, 1024), best, {**h2h, "tuned_kernel_ms": kept}, "GPU"))
        text = console.export_text()
        assert ("the tuned kernel (0.0075 ms)" in text) == says, text
        assert ("leaves the site to Inductor" in text) == says, text
