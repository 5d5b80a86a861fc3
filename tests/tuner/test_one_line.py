"""More bad input, each class one line and its documented exit code, no traceback and no hang: a
scheduler address of another scheme or an impossible port, files that are not regular (a FIFO
must not block), a time that is not a number, a run on a database it cannot write, and a stop at
any moment, whose line says what is true of the command stopped; child processes stay quiet."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import kill_harness
from small_db import store, unprivileged
from test_bad_input import one_line
from test_cli import cli
from tritune.records.database import Database

HELPERS = Path(__file__).parents[1] / "helpers"


@pytest.mark.parametrize("address, words", [
    ("tls://127.0.0.1:PORT", "tls:// is not supported, tritune takes no TLS certificates"),
    ("ucx://127.0.0.1:PORT", "ucx:// is not supported; expected tcp://HOST:PORT"),
    ("ws://127.0.0.1:PORT", "ws:// is not supported"),
    ("tcp://127.0.0.1:70000", "port 70000 is out of range (1 to 65535)"),
    ("127.0.0.1:0", "port 0 is out of range"),
])
@pytest.mark.parametrize("command", [["run", "--shape", "64", "--cluster"], ["gpu-host", "--scheduler"]])
def test_an_address_tritune_cannot_serve_is_refused_before_connecting(tmp_path, capsys, address, words, command):
    listener = socket.create_server(("127.0.0.1", 0))  # a listener that never answers: TLS hung on one
    address = address.replace("PORT", str(listener.getsockname()[1]))
    try:
        code, _, err = cli(capsys, *command, address, "--db", str(tmp_path / "t.db")) if command[0] == "run" \
            else cli(capsys, *command, address)
    finally:
        listener.close()
    assert code == 2 and f"bad scheduler address '{address}': {words}" in one_line(err)
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("args", [
    ["run", "--shape", "64", "--timeout", "nan"], ["run", "--shape", "64", "--timeout", "inf"],
    ["run", "--shape", "64", "--cluster", "tcp://h:1", "--cluster-wait", "nan"],
    ["gpu-host", "--scheduler", "tcp://h:1", "--timeout", "nan"],
    ["worker", "--scheduler", "tcp://h:1", "--timeout", "nan"],  # the former name of gpu-host
    ["recording", "sample", "--timeout", "nan"], ["recording", "sample", "--rep-ms", "nan"],
])
def test_a_time_that_is_not_a_finite_number_is_refused(tmp_path, capsys, args):
    code, _, err = cli(capsys, *args)
    assert code == 2 and "is not a finite number" in one_line(err)


NOT_REGULAR = """
import json, sys
from tritune.tuner.cli import main
codes = []
for args in json.loads(sys.argv[1]):
    try:
        main(args)
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps(codes))
"""


def test_files_that_are_not_regular_are_refused_without_blocking(tmp_path):
    fifo, db = tmp_path / "fifo", store(tmp_path / "t.db")
    os.mkfifo(fifo)
    cases = [["best", "--db", str(fifo)], ["export", "--db", str(fifo)], ["import", str(fifo), "--db", str(db)],
             ["run", "--shape", "64", "--db", str(fifo)], ["best", "--db", "/dev/null"],
             ["recording", "import", str(fifo), "--db", str(db)]]
    # a process of its own: a FIFO opened for reading would block it until something writes
    proc = subprocess.run([sys.executable, "-c", NOT_REGULAR, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120)
    assert json.loads(proc.stdout.splitlines()[-1]) == [2] * len(cases), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(cases) and "Traceback" not in proc.stderr, proc.stderr
    assert all("FIFO, not a regular file" in line for line in lines[:4] + lines[5:]), lines
    assert "device or socket, not a regular file" in lines[4]


UNWRITABLE = """
import json, sys
from tritune.tuner.cli import main
codes = []
for db in sys.argv[1:]:
    try:
        main(["run", "--shape", "64", "--db", db])
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps(codes))
"""


def test_a_run_on_a_database_it_cannot_write_is_bad_input_not_a_missing_gpu(tmp_path):
    ro_file, ro_folder = store(tmp_path / "ro.db"), tmp_path / "ro"
    ro_folder.mkdir()
    inside = store(ro_folder / "t.db")
    ro_file.chmod(0o444), ro_folder.chmod(0o555)
    try:
        proc = unprivileged(UNWRITABLE, str(ro_file), str(inside), str(ro_folder / "new.db"))
    finally:
        ro_folder.chmod(0o755)
    if proc.returncode == 99:
        pytest.skip("cannot drop root's permission overrides here")
    assert json.loads(proc.stdout.splitlines()[-1]) == [2, 2, 2], proc.stderr  # (no GPU here: 3 before the check)
    assert proc.stderr.count("cannot write tuning database") == 3 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command, patch, stop, line", [
    (["best"], "best_rows", KeyboardInterrupt, "interrupted (SIGINT); nothing was written"),
    (["export", "--out", "OUT"], "export_jsonl", "Terminated",
     "terminated (SIGTERM); no file was written: the output is as it was"),
    (["import", "DUMP"], "import_trials", KeyboardInterrupt,
     "interrupted (SIGINT); the database holds all of the file's new trials or none of them"),
    (["report", "--out", "OUT", "--min-trials", "8"], "best_rows", "Terminated",
     "terminated (SIGTERM); no report file was written: the folder is as it was"),
])
def test_a_stop_says_what_is_true_of_the_command_stopped(tmp_path, capsys, monkeypatch, command, patch, stop, line):
    from tritune.tuner import cli as cli_module

    db = store(tmp_path / "t.db")
    with Database(db) as source:
        with open(tmp_path / "dump.jsonl", "w") as fp:
            source.export_jsonl(fp)
    stop = cli_module.Terminated if stop == "Terminated" else stop

    def stopped(*args, **kwargs):
        raise stop()

    monkeypatch.setattr(Database, patch, stopped)
    args = [str(tmp_path / "out") if a == "OUT" else str(tmp_path / "dump.jsonl") if a == "DUMP" else a for a in command]
    code, _, err = cli(capsys, *args, "--db", str(tmp_path / "new.db" if command[0] == "import" else db))
    assert code == (130 if stop is KeyboardInterrupt else 143)
    assert one_line(err) == f"tune-cli: {line}" and "rerun" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_turned_into_another_error_on_its_way_up_is_still_a_stop(tmp_path, capsys, monkeypatch, how, code):
    # a C extension running Python code (matplotlib drawing a report's plots) reports the stop's
    # exception raised inside it as an error of its own
    def stopped_inside_c(*args, **kwargs):
        try:
            signal.raise_signal(how)
        except BaseException:
            raise ValueError("Invalid bounding box") from None

    monkeypatch.setattr(Database, "best_rows", stopped_inside_c)
    got, _, err = cli(capsys, "best", "--db", str(store(tmp_path / "t.db")))
    name = "terminated (SIGTERM)" if how == signal.SIGTERM else "interrupted (SIGINT)"
    assert got == code and one_line(err) == f"tune-cli: {name}; nothing was written"


def test_an_error_without_a_stop_is_not_called_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Database, "best_rows", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli(capsys, "best", "--db", str(store(tmp_path / "t.db")))


def sigint_state(pid: int) -> tuple[bool, bool] | None:
    """Whether a process catches SIGINT and whether it ignores it (None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    if fields.get("State", "").startswith("Z"):
        return None
    return tuple(bool(int(fields[f], 16) >> (signal.SIGINT - 1) & 1) for f in ("SigCgt", "SigIgn"))


def starting_child(mark: str, parent: int) -> int | None:
    """A child of the marked run that has started Python's Ctrl-C handling but not yet ignored
    SIGINT (its first step): where a Ctrl-C printed a KeyboardInterrupt traceback."""
    for pid in kill_harness.processes_marked(mark):
        if pid != parent and sigint_state(pid) == (True, False):
            return pid
    return None


def until(found, proc: subprocess.Popen, limit_s: float = 120.0):
    """found()'s first true answer, asked every millisecond while the run lives (not a timing:
    the limit only ends a test that would hang)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        answer = found()
        if answer:
            return answer
        time.sleep(0.001)
    raise AssertionError(f"the run ended ({proc.poll()}) or {limit_s} s passed first")


def test_ctrl_c_while_the_children_start_is_one_line(tmp_path):
    mark = uuid.uuid4().hex
    env = {**os.environ, kill_harness.MARK: mark, "TRITUNE_FAKE_GPU": "fake_gpu", "FAKE_GPU_MS": "15",
           "PYTHONPATH": os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tritune", "run", "--op", "conv2d", "--shape", "8,28,28,64,64,3,3",
                             "--padding", "1", "--trials", "5000", "--db", str(tmp_path / "t.db")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = until(lambda: starting_child(mark, proc.pid), proc)  # synchronised on the child's own state
        # a terminal's Ctrl-C reaches every process of the group: first this child alone, while its
        # parent lives on (a parent that ends first has the kernel kill its children, quietly)
        os.kill(child, signal.SIGINT)
        # until the child has died of it, or ignores SIGINT (its first step: a signal held is dropped)
        until(lambda: sigint_state(child) is None or sigint_state(child)[1], proc)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)  # until every child has closed stderr too
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert one_line(err) == "tune-cli: interrupted (SIGINT); every measured trial is stored, a rerun resumes"


@pytest.mark.parametrize("how, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_caught_from_a_string_run_by_exec_exits_with_its_code(tmp_path, how, code):
    # CPython (under `python -m`) ends by SIGINT instead, once a KeyboardInterrupt has left an
    # exec() of a string, even a caught one; a Ctrl-C while dataclasses are built lands there
    (tmp_path / "stopped_in_exec.py").write_text(
        "from tritune.tuner.cli import stops\n"
        "try:\n    exec('raise KeyboardInterrupt')\nexcept KeyboardInterrupt:\n"
        f"    stops.end({how!r})\n")
    proc = subprocess.run([sys.executable, "-m", "stopped_in_exec"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
