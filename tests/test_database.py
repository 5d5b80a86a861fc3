"""The tuning database: round trip, resume, best per device, JSONL, and refusing bad files untouched."""
import io
import json
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


def test_stored_configs_are_skipped_not_overwritten(db):
    db.save("w1", H100, [ok(CFG, 0.5)])
    assert db.save("w1", H100, [ok(CFG, 0.1), ok(CFG.replace(GROUP_M=8), 0.7)]) == 1
    assert [r.t_median for r in db.trials("w1", H100)] == [0.5, 0.7]
    assert db.measured_keys("w1", H100) == {CFG.key, CFG.replace(GROUP_M=8).key}


def test_best_is_the_lowest_median_among_correct_results(db):
    db.save("w1", H100, [ok(CFG, 0.5), ok(CFG.replace(GROUP_M=4), 0.3),
                         MeasureResult(CFG.replace(GROUP_M=8), Status.WRONG_ANSWER, message="wrong")])
    assert db.best("w1", H100).config == CFG.replace(GROUP_M=4)
    assert db.best("w2", H100) is None


def test_devices_are_kept_apart(db):
    db.save("w1", H100, [ok(CFG, 0.5)])
    db.save("w1", OTHER_TEMPLATE, [ok(CFG.replace(GROUP_M=4), 0.1)])
    assert db.best("w1", H100).t_median == 0.5
    assert len(db.trials("w1")) == 2 and len(db.trials("w1", H100)) == 1
    rows = db.best_rows("matmul")
    assert {(r.device, r.result.t_median, r.n_trials) for r in rows} == {(H100, 0.5, 1), (OTHER_TEMPLATE, 0.1, 1)}
    assert db.best_rows("conv") == []


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


def test_import_with_one_bad_line_writes_nothing(db, tmp_path):
    db.save("w1", H100, [ok(CFG, 0.5)])
    buf = io.StringIO()
    db.export_jsonl(buf)
    good = buf.getvalue()
    bad = good + json.dumps(dict(json.loads(good), status="EXPLODED")) + "\n"
    fresh = Database(tmp_path / "fresh.db")
    with pytest.raises(DatabaseError, match="line 2"):
        fresh.import_jsonl(io.StringIO(bad))
    assert fresh.workloads() == [] and fresh.trials("w1") == []


@pytest.mark.parametrize("content", [b"\x00\x01garbage" * 50, b"just some text\n"])
def test_not_a_database_is_refused_and_untouched(tmp_path, content):
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(DatabaseError, match="not an SQLite"):
        Database(path)
    assert path.read_bytes() == content


def test_truncated_database_is_refused(tmp_path, db):
    db.save("w1", H100, [ok(CFG, 0.5)])
    db.close()
    raw = (tmp_path / "t.db").read_bytes()
    broken = tmp_path / "broken.db"
    broken.write_bytes(raw[:100] + b"\xff" * 4000)
    with pytest.raises(DatabaseError):
        Database(broken).trials("w1")


def test_newer_schema_and_foreign_sqlite_are_refused(tmp_path, db):
    db.db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION + 1)}, pk="key")
    db.close()
    with pytest.raises(DatabaseError, match="schema version"):
        Database(tmp_path / "t.db")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("create table customers (id int)")
    before = other.read_bytes()
    with pytest.raises(DatabaseError, match="another program"):
        Database(other)
    assert other.read_bytes() == before


def test_directory_and_missing_paths(tmp_path):
    with pytest.raises(DatabaseError, match="directory"):
        Database(tmp_path)
    with pytest.raises(DatabaseError, match="no tuning database"):
        Database.open_existing(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


def test_wal_mode(db):
    assert db.db.journal_mode == "wal"
