"""The tuning database: round trip, resume, best per device, JSONL, and refusing bad files untouched."""
import io
import json
import random
import sqlite3

import pytest

from tritune.records.database import SCHEMA_VERSION, Database, DatabaseError
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config

H100 = DeviceKey("NVIDIA H100", "9.0", "3.6.0", "2.11.0", "tmplA")
OTHER_TEMPLATE = DeviceKey("NVIDIA H100", "9.0", "3.6.0", "2.11.0", "tmplB")
CFG = Config.of(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, UNROLL=1)


def ok(config, median):
    return MeasureResult(config, Status.OK, median * 0.9, median * 0.95, median, median * 1.1, 1.5, 1000.0, "err 1e-4")


@pytest.fixture
def db(tmp_path):
    d = Database(tmp_path / "t.db")
    d.add_workload("w1", "matmul", "fp16", '{"m":64,"op":"matmul"}')
    d.add_workload("w2", "matmul", "bf16", '{"m":128,"op":"matmul"}')
    yield d
    d.close()


def test_round_trip_keeps_every_field(db):
    results = [ok(CFG, 0.5), MeasureResult(CFG.replace(BLOCK_M=128), Status.TIMEOUT, compile_s=2.0,
                                           timestamp=5.0, message="no answer within 30 s")]
    assert db.save("w1", H100, results) == 2
    assert db.trials("w1", H100) == results
    assert db.trials("w1", H100)[1].t_median is None
    db.close()
    with Database(db.path) as again:
        assert again.trials("w1", H100) == results and again.trials("w2") == []


def test_stored_configs_are_skipped_not_overwritten(db):
    db.save("w1", H100, [ok(CFG, 0.5)])
    assert db.save("w1", H100, [ok(CFG, 0.1), ok(CFG.replace(GROUP_M=8), 0.7)]) == 1
    assert [r.t_median for r in db.trials("w1", H100)] == [0.5, 0.7]
    assert {r.config.key for r in db.trials("w1", H100)} == {CFG.key, CFG.replace(GROUP_M=8).key}


def test_best_is_the_lowest_median_among_correct_results(db):
    wrong_but_fast = MeasureResult(CFG.replace(GROUP_M=8), Status.WRONG_ANSWER, 0.01, 0.01, 0.01, 0.01)
    db.save("w1", H100, [ok(CFG, 0.5), wrong_but_fast, ok(CFG.replace(GROUP_M=4), 0.3),
                         MeasureResult(CFG.replace(GROUP_M=2), Status.COMPILE_ERROR, message="boom")])
    assert db.best("w1", H100) == ok(CFG.replace(GROUP_M=4), 0.3)
    assert db.best("w2", H100) is None


def test_devices_are_kept_apart(db):
    db.save("w1", H100, [ok(CFG, 0.5), MeasureResult(CFG.replace(GROUP_M=8), Status.CRASH)])
    db.save("w1", OTHER_TEMPLATE, [ok(CFG.replace(GROUP_M=4), 0.1)])
    db.save("w2", H100, [MeasureResult(CFG, Status.TIMEOUT)])  # no OK trial: no best row
    assert db.best("w1", H100).t_median == 0.5
    assert db.best("w1", DeviceKey("NVIDIA A100", "8.0", "3.6.0", "2.11.0", "tmplA")) is None
    assert len(db.trials("w1")) == 3 and len(db.trials("w1", H100)) == 2
    assert {r.config.key for r in db.trials("w1", OTHER_TEMPLATE)} == {CFG.replace(GROUP_M=4).key}
    rows = db.best_rows("matmul")
    assert {(r.device, r.result.config, r.result.t_median, r.n_trials) for r in rows} == {
        (H100, CFG, 0.5, 2), (OTHER_TEMPLATE, CFG.replace(GROUP_M=4), 0.1, 1)}
    assert {(r.workload_key, r.op, r.dtype, r.workload_spec) for r in rows} == {
        ("w1", "matmul", "fp16", '{"m":64,"op":"matmul"}')}
    assert db.best_rows() == rows and db.best_rows("conv") == []


def test_unknown_workload_is_refused(db):
    with pytest.raises(DatabaseError, match="unknown workload"):
        db.save("nope", H100, [ok(CFG, 1.0)])


def test_jsonl_export_import_round_trip(db, tmp_path):
    db.save("w1", H100, [ok(CFG, 0.5), MeasureResult(CFG.replace(UNROLL=2), Status.CRASH, message="died")])
    db.save("w2", OTHER_TEMPLATE, [ok(CFG, 0.25)])
    buf = io.StringIO()
    assert db.export_jsonl(buf) == 3
    fresh = Database(tmp_path / "fresh.db")
    assert fresh.import_jsonl(io.StringIO(buf.getvalue())) == 3
    assert fresh.import_jsonl(io.StringIO(buf.getvalue())) == 0
    for key, device in (("w1", H100), ("w2", OTHER_TEMPLATE)):
        assert fresh.trials(key, device) == db.trials(key, device)
    assert fresh.workloads() == db.workloads()


def test_export_line_format(db):
    db.save("w1", H100, [ok(CFG, 0.5)])
    buf = io.StringIO()
    db.export_jsonl(buf)
    line = json.loads(buf.getvalue())
    assert line["workload"] == {"key": "w1", "op": "matmul", "dtype": "fp16", "spec": {"m": 64, "op": "matmul"}}
    assert line["device"]["template"] == "tmplA" and line["config"] == dict(CFG)
    assert (line["status"], line["t_median"], line["compile_s"], line["message"]) == ("OK", 0.5, 1.5, "err 1e-4")


def break_status(line):
    return json.dumps(dict(json.loads(line), status="EXPLODED"))


def drop_config(line):
    return json.dumps({k: v for k, v in json.loads(line).items() if k != "config"})


@pytest.mark.parametrize("corrupt, reason", [
    (break_status, "unknown status 'EXPLODED'"), (drop_config, "missing field 'config'"),
    (lambda line: line[:40], ""), (lambda line: "[1, 2]", "not a JSON object")])
def test_import_with_one_bad_line_writes_nothing(db, tmp_path, corrupt, reason):
    db.save("w1", H100, [ok(CFG, 0.5), ok(CFG.replace(GROUP_M=4), 0.6)])
    buf = io.StringIO()
    db.export_jsonl(buf)
    first, second = buf.getvalue().splitlines()
    fresh = Database(tmp_path / "fresh.db")
    with pytest.raises(DatabaseError, match=f"line 2: {reason}"):
        fresh.import_jsonl(io.StringIO(f"{first}\n{corrupt(second)}\n"))
    assert fresh.workloads() == [] and fresh.trials("w1") == []


@pytest.mark.parametrize("content", [bytes(random.Random(0).randrange(256) for _ in range(5000)),
                                     b"just some text\n" * 40])
@pytest.mark.parametrize("opener", [Database, Database.open_existing])
def test_not_a_database_is_refused_and_untouched(tmp_path, content, opener):
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(DatabaseError) as info:
        opener(path)
    assert str(info.value) == f"cannot open tuning database {path}: file is not a database"
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.db"]  # no -wal / -shm left behind


def test_empty_file_becomes_a_database(tmp_path):
    (tmp_path / "e.db").write_bytes(b"")
    with Database(tmp_path / "e.db") as d:
        assert d.workloads() == [] and d.journal_mode == "wal"


def test_corrupt_database_is_refused_and_untouched(tmp_path, db):
    db.save("w1", H100, [ok(CFG, 0.5)])
    db.close()
    raw = (tmp_path / "t.db").read_bytes()
    broken = tmp_path / "broken.db"
    broken.write_bytes(raw[:100] + b"\xff" * 4000)  # a valid header over garbage pages
    with pytest.raises(DatabaseError, match=f"cannot open tuning database {broken}: .*malformed"):
        Database(broken)
    assert broken.read_bytes() == raw[:100] + b"\xff" * 4000


def write_sql(path, sql):
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql)
    conn.close()


def test_newer_schema_is_refused_and_untouched(tmp_path, db):
    db.close()
    path = tmp_path / "t.db"
    write_sql(path, f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE name = 'schema_version'")
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match=f"schema version {SCHEMA_VERSION + 1} is newer"):
        Database(path)
    assert path.read_bytes() == before


def test_missing_tables_and_foreign_sqlite_are_refused(tmp_path, db):
    db.close()
    write_sql(tmp_path / "t.db", "DROP TABLE trials")
    with pytest.raises(DatabaseError, match="missing tables: trials"):
        Database(tmp_path / "t.db")
    other = tmp_path / "other.db"
    write_sql(other, "CREATE TABLE customers (id INT)")
    before = other.read_bytes()
    with pytest.raises(DatabaseError, match="not a tritune database"):
        Database(other)
    assert other.read_bytes() == before


def test_directory_and_missing_paths(tmp_path):
    with pytest.raises(DatabaseError, match=f"cannot open tuning database {tmp_path}: it is a directory"):
        Database(tmp_path)
    with pytest.raises(DatabaseError, match="no tuning database"):
        Database.open_existing(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


def test_wal_mode_and_parent_dirs(tmp_path):
    with Database(tmp_path / "a" / "b" / "t.db") as d:
        assert d.journal_mode == "wal"
    conn = sqlite3.connect(tmp_path / "a" / "b" / "t.db")
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # persisted in the file
    conn.close()


def _open_at(path, start, errors):
    import time

    while time.time() < start:  # every process opens at the same moment
        pass
    try:
        Database(path).close()
    except DatabaseError as exc:
        errors.put(str(exc))


@pytest.mark.system
def test_tuners_that_open_one_new_database_at_once_all_open_it(tmp_path):
    # Switching a new file to WAL does not wait on SQLite's busy timeout: four processes opening
    # one new file at once failed "database is locked" in about one open of twelve before the
    # switch waited for the others (here: 80 opens)
    import multiprocessing
    import time

    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for i in range(20):
        start = time.time() + 0.2
        procs = [ctx.Process(target=_open_at, args=(tmp_path / f"{i}.db", start, errors)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 4
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []


def test_a_second_connection_keeps_every_commit_visible_to_other_processes(tmp_path):
    # The measuring thread opens its own connection while the loop's is open. Reading the file
    # with anything but SQLite then (the file check of a fresh open) drops the process's POSIX
    # locks: another process that opens and closes the database takes itself for the last user,
    # resets the WAL, and every later commit of this process is lost (without `checked=True`
    # this test sees 0 trials).
    import subprocess
    import sys

    path = tmp_path / "t.db"
    db = Database(path)
    db.add_workload("w", "matmul", "fp16", "{}")
    second = Database(path, checked=True)
    count = f"import sqlite3; print(sqlite3.connect({str(path)!r}).execute('SELECT COUNT(*) FROM trials').fetchone()[0])"
    subprocess.run([sys.executable, "-c", count], check=True, capture_output=True)  # opens, reads, closes
    for i in range(5):
        second.save("w", H100, [MeasureResult(Config.of(i=i), Status.OK, 1.0, 1.0, 1.0, 1.0)])
    assert int(subprocess.run([sys.executable, "-c", count], check=True, capture_output=True, text=True).stdout) == 5


def test_a_verdict_decides_the_best_and_survives_export_and_import(db, tmp_path):
    library = Config.of(library="addmm")
    db.save("w1", H100, [ok(CFG, 0.5), ok(library, 0.6)])
    assert db.best("w1", H100).config == CFG
    db.save_verdict("w1", H100, library, {"ours_ms": 0.61, "alternatives": {"addmm": 0.6}})
    assert db.best("w1", H100).config == library and [r.result.config for r in db.best_rows()] == [library]
    buf = io.StringIO()
    db.export_jsonl(buf)
    assert [json.loads(line).get("verdict") for line in buf.getvalue().splitlines()] == [None, True]
    fresh = Database(tmp_path / "fresh.db")
    fresh.import_jsonl(io.StringIO(buf.getvalue()))
    assert fresh.best("w1", H100).config == library


def test_which_gpu_measured_a_trial_is_kept_and_older_databases_gain_the_column(tmp_path):
    """`measured_on` is a column of its own; a database made before it (no such column) gains it on
    its first write of a trial, and its old trials read as measured nowhere known."""
    path = tmp_path / "old.db"
    with Database(path) as db:
        db.add_workload("w1", "matmul", "fp16", "{}")
        db.save("w1", H100, [ok(CFG, 0.5)])
    with sqlite3.connect(path) as conn:  # as the schema was before the column
        conn.execute("ALTER TABLE trials DROP COLUMN measured_on")
    with Database(path) as db:
        assert db.trials("w1", H100)[0].measured_on == ""
        there = MeasureResult(CFG.replace(UNROLL=2), Status.OK, 1, 1, 1, 1, measured_on="gpuhost:1")
        db.save("w1", H100, [there])
        assert [r.measured_on for r in db.trials("w1", H100)] == ["", "gpuhost:1"]
        buf = io.StringIO()
        db.export_jsonl(buf)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert "measured_on" not in lines[0] and lines[1]["measured_on"] == "gpuhost:1"
    with Database(tmp_path / "fresh.db") as fresh:
        fresh.import_jsonl(io.StringIO(buf.getvalue()))
        assert fresh.trials("w1", H100)[1] == there
