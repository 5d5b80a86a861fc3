"""Every file tritune writes (an export, a report folder, a recording, a run's summary) is written
beside its target and renamed into place once complete: stopped at any moment (SIGINT, SIGTERM,
SIGKILL), a command leaves the previous file or none, never a part, and every database intact. An
output that is the database, one of its side files, or a link to one of them is refused."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from small_db import listing, store
from test_bad_input import one_line
from test_cli import cli
from tritune.cost_model import report
from tritune.records import files
from tritune.records.database import Database
from tritune.tuner.recordings import read_lines, write_lines

HELPERS = Path(__file__).parents[1] / "helpers"


@pytest.mark.parametrize("out", ["t.db", "t.db-wal", "t.db-shm", "t.db-journal", "link.db", "hard.db", "sub/../t.db"])
def test_an_export_over_the_database_or_its_files_is_refused(tmp_path, capsys, out):
    db = store(tmp_path / "t.db")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.db").symlink_to("t.db")
    os.link(db, tmp_path / "hard.db")
    before = listing(tmp_path)
    code, _, err = cli(capsys, "export", "--db", str(db), "--out", str(tmp_path / out))
    assert code == 2 and "will not write" in one_line(err) and "is the tuning database" in err
    assert listing(tmp_path) == before  # (the export over the file itself once left it 0 bytes long)


def test_a_report_or_summary_over_the_database_is_refused(tmp_path, capsys):
    db = store(tmp_path / "report.json")  # a database named as a report's file, in the report's folder
    before = listing(tmp_path)
    code, _, err = cli(capsys, "report", "--db", str(db), "--out", str(tmp_path), "--min-trials", "8")
    assert code == 2 and "will not write" in one_line(err)
    code, _, err = cli(capsys, "run", "--shape", "64", "--db", str(db), "--summary-json", str(db))
    assert code == 2 and "will not write" in one_line(err)  # before the GPU check (exit 3 here)
    assert listing(tmp_path) == before


def test_an_export_to_a_full_device_is_one_line(tmp_path, capsys):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    db = store(tmp_path / "t.db")
    code, _, err = cli(capsys, "export", "--db", str(db), "--out", "/dev/full")
    assert code == 2 and "cannot write /dev/full: No space left on device" in one_line(err)


def test_an_export_to_a_pipe_is_written_in_place(tmp_path):
    db = store(tmp_path / "t.db")
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "tritune", "export", "--db", str(db), "--out", str(fifo)],
                            stderr=subprocess.PIPE, text=True)
    with open(fifo) as reader:  # the export opens the pipe once it writes: it waits for this reader
        lines = reader.read().splitlines()
    assert proc.wait(timeout=60) == 0 and len(lines) == 3 and fifo.is_fifo()
    piped = subprocess.run([sys.executable, "-m", "tritune", "export", "--db", str(db), "--out", "/dev/stdout"],
                           capture_output=True, text=True, timeout=60)  # a link to a pipe
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 3, piped.stderr


def test_a_failed_write_leaves_the_old_file_and_no_part(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    target.chmod(0o640)
    with pytest.raises(KeyboardInterrupt):
        with files.written(target) as part, open(part, "w") as fp:
            fp.write("half of a new fi")
            raise KeyboardInterrupt
    assert listing(tmp_path) == {"out.jsonl": b"old\n"}
    with files.written(target) as part, open(part, "w") as fp:
        fp.write("new\n")
    assert listing(tmp_path) == {"out.jsonl": b"new\n"} and target.stat().st_mode & 0o777 == 0o640


def test_a_recording_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    write_lines(path, {"old": True}, [{"config": {}}])

    class Stop(Exception):
        pass

    def rows():
        yield {"config": {"a": 1}}
        raise Stop  # stopped while the new recording was being written

    with pytest.raises(Stop):
        write_lines(path, {"old": False}, rows())
    assert read_lines(path) == ({"old": True}, [{"config": {}}]) and len(list(tmp_path.iterdir())) == 1


def test_a_report_stopped_before_its_last_file_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.json").write_text("old")
    (out / "notes.txt").write_text("the user's")
    before = listing(out)

    def plots(result, sets, scores, stage):
        (stage / "scatter.png").write_bytes(b"new")
        raise KeyboardInterrupt  # Ctrl-C while the plots are drawn

    monkeypatch.setattr(report, "_plots", plots)
    with pytest.raises(KeyboardInterrupt):
        report.write({"workloads": {}, "transfer": None}, [], {}, out)
    assert listing(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    monkeypatch.setattr(report, "_plots", lambda result, sets, scores, stage: [])
    assert report.write({"workloads": {}, "transfer": None}, [], {}, out) == [out / "report.json", out / "report.html"]
    assert listing(out)["notes.txt"] == b"the user's" and listing(out)["report.json"] != b"old"


def stop_at_moments(work: Path, count: int, *command: str) -> dict:
    """`interrupt_moments.py`: the command run whole, then stopped at `count` moments."""
    proc = subprocess.run([sys.executable, str(HELPERS / "interrupt_moments.py"), str(work), str(count), "--", *command],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check_stops(runs: dict, kept: str) -> None:
    """Each stop exited as its signal says, with one line saying `kept` (SIGINT, SIGTERM), or ended
    first (exit 0); and left the database intact."""
    assert runs["whole"]["exit"] == 0, runs["whole"]["stderr"]
    codes = {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}
    stopped = [r for r in runs["stopped"] if r["exit"] != 0]
    # most stops land in the run (a child may run faster than the whole run that placed the moments)
    assert len(stopped) >= 12, [(r["signal"], r["exit"]) for r in runs["stopped"]]
    for run in runs["stopped"]:
        assert run["exit"] in (0, codes[run["signal"]]) and run["integrity"] == "ok", run
        if run["exit"] in (130, 143):
            assert last_line(run["stderr"]).endswith(kept) and run["signal"] in run["stderr"], run["stderr"]


def last_line(err: str) -> str:
    """The line a stopped command printed last: its only one, or (a stop that landed as the command
    was ending) after the command's own output, never a traceback."""
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("tune-cli: ") and "Traceback" not in err, err
    return lines[-1]


def outputs(run: dict, prefix: str) -> dict:
    """The files a run left under `prefix`, but hidden parts (a SIGKILL's)."""
    return {name: sha for name, sha in run["files"].items() if name.startswith(prefix)}


def parts(run: dict) -> list[str]:
    return [name for name in run["files"] if name.endswith(".part") or ".part/" in name]


@pytest.mark.system
def test_an_export_stopped_at_20_moments_leaves_the_old_file_or_the_whole_new_one(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    store(work / "t.db", shapes=("64", "96"), trials=3000)  # about 0.2 s of CPU to export
    (work / "out.jsonl").write_text("an earlier export\n")
    runs = stop_at_moments(work, 20, "export", "--db", "t.db", "--out", "out.jsonl")
    check_stops(runs, "no file was written: the output is as it was")
    old, new = runs["stopped"][0]["files"]["out.jsonl"], runs["whole"]["files"]["out.jsonl"]
    database = runs["whole"]["files"]["t.db"]
    for run in runs["stopped"]:
        assert run["files"]["out.jsonl"] in (old, new) and run["files"]["t.db"] == database, run
        assert run["exit"] == -9 or not parts(run), run
        assert (run["files"]["out.jsonl"] == new) == (run["exit"] == 0)


@pytest.mark.system
def test_a_report_stopped_at_20_moments_leaves_each_file_old_or_the_whole_new_report(tmp_path):
    work = tmp_path / "work"
    (work / "r").mkdir(parents=True)
    store(work / "t.db", shapes=("64", "96"), trials=12)
    for name in ("report.json", "scatter.png", "notes.txt"):
        (work / "r" / name).write_text(f"an earlier {name}")
    runs = stop_at_moments(work, 20, "report", "--db", "t.db", "--out", "r", "--min-trials", "8", "--folds", "2")
    check_stops(runs, "no report file was written: the folder is as it was")
    new = outputs(runs["whole"], "r/")
    old = {name: sha for name, sha in runs["stopped"][0]["files"].items() if name.startswith("r/")}
    assert set(new) == {f"r/{name}" for name in report.FILES} | {"r/notes.txt"}
    for run in runs["stopped"]:
        left = outputs(run, "r/")
        assert run["files"]["t.db"] == runs["whole"]["files"]["t.db"], run
        assert all(sha in (old.get(name), new[name]) for name, sha in left.items()), run  # each file whole
        if run["exit"] != -9:  # a SIGKILL between two renames may leave some old and some new
            assert left in (old, new) and not parts(run), run


@pytest.mark.system
def test_an_import_stopped_at_20_moments_stores_all_of_its_trials_or_none(tmp_path):
    source, work = tmp_path / "source", tmp_path / "work"
    source.mkdir(), work.mkdir()
    with Database(store(source / "s.db", shapes=("64", "96"), trials=600)) as db, \
            open(work / "new.jsonl", "w") as fp:
        db.export_jsonl(fp)  # about 0.3 s of CPU to check and import
    store(work / "t.db", shapes=("64",), trials=5)  # 5 of the file's 1,200 trials are stored already
    runs = stop_at_moments(work, 20, "import", "new.jsonl", "--db", "t.db")
    check_stops(runs, "the database holds all of the file's new trials or none of them")
    assert runs["whole"]["trials"] == 1200
    for run in runs["stopped"]:
        assert run["trials"] in (5, 1200), run
