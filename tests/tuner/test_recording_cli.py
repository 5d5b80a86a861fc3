"""`tune-cli recording`: a sample measured and written, re-timed and loaded into a database on a
stand-in GPU (real worker processes, fake measurements); bad input is one line and exit code 2."""
import gzip
import json
from functools import partial

import pytest

import fake_worker
from fakes import FakeBuilder
from tritune.records.database import Database
from tritune.records.result import DeviceKey
from tritune.tuner.cli import main
from tritune.tuner.gpus import start
from tritune.tuner.recordings import read_lines
from tritune.tuner.worker.local import LocalRunner

TORCH_MS = 2.0


def recording_handlers(timing):
    """The session's stand-in GPU, which also times torch (at TORCH_MS)."""
    return {**fake_worker.session_handlers(timing), "torch": lambda p: (TORCH_MS,) * 4}


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(start, "LocalRunner", partial(LocalRunner, handlers=recording_handlers))
    monkeypatch.setattr(start, "Builder", lambda *args, **kwargs: FakeBuilder())


def cli(capsys, *args):
    """(exit code, stdout, stderr) of one tune-cli command."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.system
def test_sample_refine_and_import(fake_gpu, tmp_path, capsys):
    sampled, refined, db = tmp_path / "s.jsonl.gz", tmp_path / "r.jsonl", tmp_path / "t.db"
    code, out, _ = cli(capsys, "recording", "sample", "--shape", "512", "--n", "12", "--faults", "wrong",
                       "--refine", "3", "--repeats", "2", "--warmup-ms", "5", "--rep-ms", "25", "--out", str(sampled))
    assert code == 0 and "best config" in out
    with gzip.open(sampled, "rt") as fp:
        assert "meta" in json.loads(fp.readline())  # the meta line first, gzip by the name
    meta, rows = read_lines(sampled)
    assert meta["torch_ms"] == TORCH_MS and meta["timing_ms"] == [5.0, 25.0] and meta["space_valid"] == 12
    assert meta["device"]["gpu"] == "Fake H100" and meta["workload"]["m"] == 512
    assert len(rows) == 12 and rows[0]["status"] == "WRONG_ANSWER" and rows[0]["config"]["fault"] == "wrong"
    failed = [r for r in rows if r["config"].get("BLOCK_K") == 128 and "fault" not in r["config"]]
    assert all(r["status"] == "COMPILE_ERROR" and r["t_median"] is None for r in failed)
    assert sum(r["message"] == "[1.2, 1.2, 1.2]" for r in rows) == 3  # the first run and 2 more

    code, out, _ = cli(capsys, "recording", "refine", str(sampled), str(refined), "--top", "2", "--repeats", "1")
    meta, rows = read_lines(refined)
    assert code == 0 and "torch 2.0000 ms; best 1.2000 ms = 1.667x" in out
    assert meta["refined"] == {"top": 2, "repeats": 1, "timing_ms": [5.0, 25.0]}  # the recording's own timing
    assert sum(r["message"] == "[1.2, 1.2, 1.2, 1.2]" for r in rows) == 2

    code, out, _ = cli(capsys, "recording", "import", "--db", str(db), str(refined))
    ok = sum(r["status"] == "OK" for r in rows)
    assert code == 0 and out == f"{refined}: 12 trials\n"
    with Database(db) as d:
        (key, *_), = d.workloads()
        trials = d.trials(key, DeviceKey("Fake H100", "9.0", "3.x", "2.x", "recorded"))
    assert len(trials) == 12 and sum(t.ok for t in trials) == ok


def test_a_workload_spec_is_sampled_as_given(fake_gpu, tmp_path, capsys):
    from tritune.kernels.gated.expr import Gated

    spec = Gated(16, 256, 128, norm_eps=1e-6).to_dict()  # a row norm, which no --shape option expresses
    out = tmp_path / "g.jsonl"
    code, _, err = cli(capsys, "recording", "sample", "--workload", json.dumps(spec), "--n", "4", "--out", str(out))
    meta, rows = read_lines(out)
    assert code == 0 and meta["workload"] == spec and len(rows) == 4, err


@pytest.mark.parametrize("args, needle", [
    (["sample", "--where", "BLOCK_M"], "bad --where 'BLOCK_M'"),
    (["sample", "--faults", "boom"], "bad --faults 'boom'"),
    (["sample", "--shape", "0"], "bad --shape"),
    (["sample", "--workload", "{not json"], "bad --workload"),
    (["sample", "--workload", '{"op": "gated", "m": 16}'], "bad --workload"),
    (["merge", "OUT"], "missing argument 'parts"),
])
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, args, needle):
    code, _, err = cli(capsys, "recording", *args)
    assert code == 2 and needle.lower() in err.lower() and err.count("\n") == 1 and err.startswith("tune-cli: ")


def test_unknown_knob_is_exit_2(fake_gpu, capsys):
    code, _, err = cli(capsys, "recording", "sample", "--shape", "512", "--where", "NO_SUCH=1")
    assert code == 2 and err == "tune-cli: --where: no knob NO_SUCH in this space\n"


def test_a_file_that_is_no_recording_is_exit_2_and_stores_nothing(tmp_path, capsys):
    bad, db = tmp_path / "bad.jsonl", tmp_path / "t.db"
    bad.write_text("not json\n")
    code, _, err = cli(capsys, "recording", "import", "--db", str(db), str(bad))
    assert code == 2 and f"{bad}: not a recording" in err and err.count("\n") == 1
    assert not db.exists()


def test_parts_of_other_workloads_are_not_merged(tmp_path, capsys):
    parts = []
    for m in (64, 128):
        path = tmp_path / f"{m}.jsonl"
        meta = {"workload": {"op": "matmul", "m": m}, "device": {"gpu": "G"}, "torch_ms": 1.0}
        path.write_text(json.dumps({"meta": meta}) + "\n" + json.dumps({"config": {"BLOCK_M": m}}) + "\n")
        parts.append(str(path))
    code, _, err = cli(capsys, "recording", "merge", str(tmp_path / "out.jsonl"), *parts)
    assert code == 2 and "differ in workload" in err and not (tmp_path / "out.jsonl").exists()
