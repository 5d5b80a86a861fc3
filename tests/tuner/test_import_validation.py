"""`tune-cli import` checks every trial before it stores any (op known, spec valid and matching its
key, config complete and inside its op's space, times finite and not negative, statuses known) and
names the first bad line; readers (best, export, report, replay) skip a damaged stored row with a
warning, or stop with one line."""
import json
import sqlite3

import pytest

from small_db import GPU, damage_row, listing, store
from test_bad_input import one_line
from test_cli import cli
from tritune.kernels.family import parse_expr
from tritune.records.database import Database

KEY = parse_expr("matmul", "64", "fp16").key


@pytest.fixture
def dump(tmp_path, capsys):
    """An export of three trials of a 64x64x64 matmul, as lines of dicts."""
    db = store(tmp_path / "source.db")
    assert cli(capsys, "export", "--db", str(db), "--out", str(tmp_path / "d.jsonl"))[0] == 0
    return [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]


def with_second(line: dict, **changes) -> dict:
    """`line` with nested fields changed: config__BLOCK_M=48 sets line["config"]["BLOCK_M"]; None deletes."""
    line = json.loads(json.dumps(line))
    for path, value in changes.items():
        *parents, name = path.split("__")
        where = line
        for parent in parents:
            where = where[parent]
        if value is None:
            del where[name]
        else:
            where[name] = value
    return line


@pytest.mark.parametrize("changes, words", [
    ({"t_median": -1.0}, "t_median is -1.0: a time is a finite number, not below zero"),
    ({"t_min": float("nan")}, "t_min is nan"),
    ({"compile_s": float("inf")}, "compile_s is inf"),
    ({"status": "FINE"}, "unknown status 'FINE'"),
    ({"workload__op": "matmul3d", "workload__spec__op": "matmul3d"}, "unknown op 'matmul3d'"),
    ({"workload__spec__m": "sixty-four"}, "bad workload spec"),
    ({"workload__spec__m": 65}, f"workload key '{KEY}' is not its spec's"),
    ({"workload__dtype": "bf16"}, "and dtype 'bf16' differ from its spec's (matmul, fp16)"),
    ({"config__BLOCK_M": None}, "config lacks knob 'BLOCK_M'"),
    ({"config__BLOCK_M": 48}, "config BLOCK_M=48 is outside matmul's space"),
    ({"config__TILES": 2}, "config knob 'TILES' is not one of matmul's"),
    ({"config": {"library": "cublas_magic"}}, "is no library call of"),
    ({"device__capability": "nine"}, "bad device capability 'nine'"),
])
def test_the_first_bad_line_is_named_and_nothing_is_stored(tmp_path, capsys, dump, changes, words):
    lines = [dump[0], with_second(dump[1], **changes), dump[2]]
    src = tmp_path / "bad.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    db = store(tmp_path / "t.db", shapes=("96",))
    before = listing(tmp_path)
    code, _, err = cli(capsys, "import", str(src), "--db", str(db))
    assert code == 2 and f"cannot import {src}: bad trial on line 2: " in one_line(err) and words in err
    assert listing(tmp_path) == before


def test_valid_trials_import_and_a_library_call_and_an_older_config_pass(tmp_path, capsys, dump):
    assert "SPLIT_K" not in dump[1]["config"]  # nor TMA, PERSISTENT, WARP_SPEC: knobs added since take defaults
    library = with_second(dump[2], config={"library": "mm"})
    src = tmp_path / "good.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in (dump[0], dump[1], library)))
    code, _, err = cli(capsys, "import", str(src), "--db", str(tmp_path / "t.db"))
    assert code == 0 and err.strip() == "imported 3 new trials", err


def test_json_nested_100000_deep_is_one_line(tmp_path, capsys, dump):
    src = tmp_path / "deep.jsonl"
    src.write_text(json.dumps(dump[0]) + "\n" + '{"workload": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    code, _, err = cli(capsys, "import", str(src), "--db", str(tmp_path / "t.db"))
    assert code == 2 and "bad trial on line 2: nested too deeply" in one_line(err)
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("column, value", [("config", "{not json"), ("status", "EXPLODED"), ("t_median", -1.0),
                                           ("t_p20", "fast")])
def test_readers_skip_a_damaged_row_with_a_warning(tmp_path, capsys, caplog, column, value):
    db = store(tmp_path / "t.db", trials=4)
    damage_row(db, 1, **{column: value})  # row 1 has the lowest median (0.01 ms): it would be the best
    code, out, err = cli(capsys, "best", "--db", str(db))
    assert code == 0 and "0.0400" in out and "Traceback" not in err, out  # the best of the others
    code, _, err = cli(capsys, "export", "--db", str(db), "--out", str(tmp_path / "d.jsonl"))
    assert code == 0 and "exported 3 trials" in err
    warned = [r.getMessage() for r in caplog.records if r.name == "tritune.records"]  # on stderr without pytest's handler
    assert warned and warned[-1].startswith(f"tritune: skipped 1 damaged trial of {db} (row 1: ")
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 3
    with Database.open_existing(db) as reader:
        assert len(reader.trials(KEY, GPU)) == 3 and reader.best(KEY, GPU).t_median != -1.0


def test_best_leaves_out_a_workload_whose_spec_is_damaged(tmp_path, capsys):
    db = store(tmp_path / "t.db", shapes=("64", "96"))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE workloads SET spec = '{\"op\": \"matmul\"' WHERE key = ?", [KEY])
    conn.close()
    code, out, err = cli(capsys, "best", "--db", str(db))
    assert code == 0 and "96x96x96" in out and "64x64x64" not in out and "1 workload whose stored spec is damaged" in out


def test_a_report_over_a_config_its_op_cannot_read_is_one_line(tmp_path, capsys):
    db = store(tmp_path / "t.db", trials=10)
    damage_row(db, 3, config='{"BLOCK_N": 32}')  # imported before imports were checked
    code, _, err = cli(capsys, "report", "--db", str(db), "--out", str(tmp_path / "r"), "--min-trials", "8")
    assert code == 2 and "a stored workload or config is damaged" in one_line(err)
    assert not (tmp_path / "r").exists()
