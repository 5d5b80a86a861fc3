"""Commands and replay that only read a tuning database (best, export, report, apply_history_best)
create and change nothing beside it: no -wal or -shm left, a killed writer's damaged -shm not
rewritten; they read a live writer's trials, and a database in a folder they cannot write."""
import subprocess
import sys

import pytest

from small_db import GPU, listing, store, unprivileged
from test_cli import cli
from tritune.kernels.family import parse_expr
from tritune.records import opening
from tritune.records.database import Database
from tritune.records.dispatch import apply_history_best
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config

KEY = parse_expr("matmul", "64", "fp16").key
WRITER = ("import sqlite3, sys, os\n"
          "c = sqlite3.connect(sys.argv[1])\n"
          "c.execute(\"INSERT INTO trials (workload, device, config_key, config, status, t_median, timestamp) \"\n"
          "          \"SELECT workload, device, 'new', '{}', 'OK', 0.001, 1 FROM trials LIMIT 1\")\n"
          "c.commit()\n"
          "print('stored', flush=True)\n"
          "os._exit(0) if sys.argv[2] == 'killed' else sys.stdin.readline()\n")


def readers(capsys, db, out):
    """best, export and replay of `db` (writing only into `out`); what best printed."""
    code, printed, _ = cli(capsys, "best", "--db", str(db))
    assert code == 0
    assert cli(capsys, "export", "--db", str(db), "--out", str(out / "dump.jsonl"))[0] == 0
    with apply_history_best(db) as history:
        assert history.best(KEY, GPU) is not None
    return printed


@pytest.mark.system
def test_reading_leaves_a_wal_database_and_its_folder_as_they_were(tmp_path, capsys):
    folder, out = tmp_path / "db", tmp_path / "out"
    folder.mkdir(), out.mkdir()
    db = store(folder / "t.db", shapes=("64", "96"), trials=8)
    before = listing(folder)
    assert set(before) == {"t.db"}
    readers(capsys, db, out)
    code, _, err = cli(capsys, "report", "--db", str(db), "--out", str(out / "r"), "--min-trials", "8", "--folds", "2")
    assert code == 0, err
    assert listing(folder) == before  # not a -wal or -shm made, the file byte for byte


def killed_writer(db):
    """A writer that stored one more trial and was killed: its -wal and -shm stay beside the file."""
    subprocess.run([sys.executable, "-c", WRITER, str(db), "killed"], check=True, capture_output=True)
    assert {p.name for p in db.parent.iterdir()} == {"t.db", "t.db-wal", "t.db-shm"}


def test_a_killed_writers_wal_is_read_and_its_damaged_index_left_as_it_was(tmp_path, capsys):
    db = store(tmp_path / "t.db")
    killed_writer(db)
    (tmp_path / "t.db-shm").write_bytes(b"\xa5" * 32768)  # an index that does not hold
    before = listing(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    printed = readers(capsys, db, out)
    assert "0.0010" in printed and len((out / "dump.jsonl").read_text().splitlines()) == 4  # the WAL's trial read
    assert listing(tmp_path) == before


def test_a_live_writers_trials_are_read_and_its_files_left_alone(tmp_path, capsys):
    db = store(tmp_path / "t.db")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db), "live"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "stored\n"  # committed, connection held open
        names = {p.name for p in tmp_path.iterdir()}
        out = tmp_path / "out"
        out.mkdir()
        assert "0.0010" in readers(capsys, db, out)
        assert {p.name for p in tmp_path.iterdir()} == names | {"out"}
    finally:
        writer.communicate("\n", timeout=30)


def test_a_database_read_as_immutable_is_opened_again_once_a_writer_starts(tmp_path, monkeypatch):
    db = store(tmp_path / "t.db")
    monkeypatch.setattr(opening.os, "access", lambda path, mode: False)  # a folder it cannot write
    reader = Database.open_existing(db)
    assert reader._snapshot is not None and reader.count(KEY, GPU) == 3
    monkeypatch.undo()
    with Database(db) as writer:  # its trial waits in the WAL: the file read as immutable has not changed
        writer.save(KEY, GPU, [MeasureResult(Config.of(BLOCK_M=256, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=2,
                                                        num_stages=2, UNROLL=1), Status.OK, 1, 1, 1, 1)])
        assert reader.count(KEY, GPU) == 4 and reader._snapshot is None  # read through SQLite's locks now
    reader.close()


FOLDER_READ = """
import sys, json
from pathlib import Path
from tritune.tuner.cli import main
from tritune.records.dispatch import apply_history_best
from small_db import GPU
db, out, key = Path(sys.argv[-3]), Path(sys.argv[-2]), sys.argv[-1]
codes = []
for args in (["best"], ["export", "--out", str(out / "dump.jsonl")]):
    try:
        main([*args, "--db", str(db)])
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code)
with apply_history_best(db) as history:
    codes.append(history.best(key, GPU) is not None)
print(json.dumps(codes))
"""


@pytest.mark.parametrize("writer", [None, "killed"])
def test_a_database_in_a_read_only_folder_is_read_and_left_as_it_was(tmp_path, writer):
    folder, out = tmp_path / "ro", tmp_path / "out"
    folder.mkdir(), out.mkdir()
    db = store(folder / "t.db")
    if writer:
        killed_writer(db)
    before = listing(folder)
    folder.chmod(0o555)
    try:
        proc = unprivileged(FOLDER_READ, str(db), str(out), KEY)
    finally:
        folder.chmod(0o755)
    if proc.returncode == 99:
        pytest.skip("cannot drop root's permission overrides here")
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "[0, 0, true]", proc.stderr
    assert "Traceback" not in proc.stderr
    assert len((out / "dump.jsonl").read_text().splitlines()) == (4 if writer else 3)
    assert listing(folder) == before
