"""Bad input, class by class, where the README promises one line and a documented exit code (2: bad
input, 3: no GPU or no cluster to measure on, 130: interrupted), no traceback, no hang, and every
database file byte for byte as it was where the command failed or only read. The Python API's
side: tensors off CUDA raise NoCudaDevice, and the torch.compile backend hands a CPU graph to its
fallback."""
import dataclasses
import functools
import http.server
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import tritune
from test_cli import cli
from test_compiler import FAST, fresh_dynamo, store  # noqa: F401 - fresh_dynamo: a fixture
from tritune.kernels import device
from tritune.kernels.backend import compiler as compiler_module
from tritune.records.database import Database
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.tuner.gpus import cluster

TESTS = Path(__file__).parents[1]
GPU = DeviceKey("GPU", "9.0", "3.6", "2.11", "t")
SPEC = '{"op":"matmul","batch":1,"m":64,"n":64,"k":64,"dtype":"fp16"}'
KEY = "8db12e4c8e283f01"  # SPEC's workload key: an import checks it


def one_line(err: str) -> str:
    """The one line a failed command printed (the test fails on anything more)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tune-cli: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> bytes:
    """The bytes of a small tuning database: one workload, three trials."""
    path = tmp_path_factory.mktemp("stored") / "t.db"
    with Database(path) as db:
        db.add_workload(KEY, "matmul", "fp16", SPEC)
        db.save(KEY, GPU, [MeasureResult(FAST.replace(BLOCK_M=m), Status.OK, 0.01, 0.01, 0.01 * m, 0.01)
                           for m in (16, 32, 64)])
    return path.read_bytes()


def damage(raw: bytes, path: Path, what: str = "trials") -> bytes:
    """`raw` with the first page of a table or index overwritten: the header and schema read as before."""
    path.write_bytes(raw)
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as conn:
        page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [what]).fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    broken = bytearray(raw)
    broken[(page - 1) * size:(page - 1) * size + 64] = b"\xff" * 64
    return bytes(broken)


@pytest.mark.parametrize("what", ["trials", "trials_config"])
def test_a_damaged_page_passes_the_header_and_schema_and_fails_quick_check(stored, tmp_path, what):
    path = tmp_path / "d.db"
    path.write_bytes(damage(stored, tmp_path / "probe.db", what))
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as conn:
        assert {"meta", "trials"} <= {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        try:
            found = conn.execute("PRAGMA quick_check").fetchone()[0]  # a damaged index: a row that says so
        except sqlite3.DatabaseError as exc:  # a damaged table: SQLite's error
            found = str(exc)
    assert "Page" in found or "malformed" in found


@pytest.mark.parametrize("what", ["trials", "trials_config"])
@pytest.mark.parametrize("args, code, words", [
    (["best"], 2, "malformed"),
    (["export"], 2, "malformed"),
    (["report", "--out", "REPORT"], 2, "malformed"),
    (["import", "DUMP"], 2, "malformed"),
    (["run", "--shape", "64"], 2, "malformed"),  # before the GPU check (exit 3 here)
])
def test_a_damaged_database_is_one_line_and_left_as_it_was(stored, tmp_path, capsys, args, code, words, what):
    dump = tmp_path / "dump.jsonl"
    (tmp_path / "good.db").write_bytes(stored)
    assert cli(capsys, "export", "--db", str(tmp_path / "good.db"), "--out", str(dump))[0] == 0
    db = tmp_path / "t.db"
    db.write_bytes(damage(stored, tmp_path / "probe.db", what))
    before = db.read_bytes()
    args = [str(dump) if a == "DUMP" else str(tmp_path / "r") if a == "REPORT" else a for a in args]
    got, _, err = cli(capsys, *args, "--db", str(db))
    assert got == code and words in one_line(err) and str(db) in err
    assert db.read_bytes() == before


@pytest.mark.parametrize("command, out", [(["best"], "no tuned workloads yet"), (["export"], "")])
def test_reading_an_empty_file_writes_nothing(tmp_path, capsys, command, out):
    db = tmp_path / "empty.db"
    db.write_bytes(b"")
    code, printed, _ = cli(capsys, *command, "--db", str(db))
    assert code == 0 and out in printed and db.read_bytes() == b""


def test_reading_commands_leave_the_database_as_it_was(stored, tmp_path, capsys):
    db = tmp_path / "t.db"
    db.write_bytes(stored)
    for command in (["best"], ["export", "--out", str(tmp_path / "d.jsonl")], ["best", "--op", "bmm"]):
        assert cli(capsys, *command, "--db", str(db))[0] == 0
    assert db.read_bytes() == stored


def test_imports_that_add_nothing_or_fail_leave_the_database_as_it_was(stored, tmp_path, capsys):
    db, dump = tmp_path / "t.db", tmp_path / "dump.jsonl"
    db.write_bytes(stored)
    assert cli(capsys, "export", "--db", str(db), "--out", str(dump))[0] == 0
    code, _, err = cli(capsys, "import", str(dump), "--db", str(db))
    assert code == 0 and err.strip() == "imported 0 new trials" and db.read_bytes() == stored
    binary = tmp_path / "trials.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    code, _, err = cli(capsys, "import", str(binary), "--db", str(db))
    assert code == 2 and f"cannot import {binary}: bad trial on line 1: not UTF-8 text" in one_line(err)
    assert db.read_bytes() == stored
    code, _, err = cli(capsys, "import", str(binary), "--db", str(tmp_path / "new.db"))
    assert code == 2 and not (tmp_path / "new.db").exists()  # the file is read before the database opens
    dump.write_text(dump.read_text().splitlines()[0] + "\n")
    code, _, err = cli(capsys, "import", str(dump), "--db", str(tmp_path / "one.db"))
    assert code == 0 and err.strip() == "imported 1 new trial"


@pytest.mark.parametrize("args, code, words", [
    (["best", "--op", "bogus"], 2, "unknown op 'bogus'; known: matmul"),
    (["report", "--op", "bogus", "--out", "TMP/r"], 2, "unknown op 'bogus'"),
    (["import", "TMP/DUMP", "--db", "TMP/no/x.db"], 2, "no directory TMP/no"),
    (["run", "--shape", "64", "--db", "TMP/no/x.db"], 2, "no directory TMP/no"),
    (["export", "--out", "TMP/no/x.jsonl"], 2, "no directory TMP/no"),
    (["export", "--out", "TMP"], 2, "is a directory"),
    (["export", "--out", "/proc/tritune.jsonl"], 2, "cannot write /proc/tritune.jsonl"),  # even as root
    (["report", "--out", "TMP/file/r"], 2, "TMP/file is not a directory"),
    (["run", "--shape", "64", "--summary-json", "TMP/no/s.json"], 2, "no directory TMP/no"),
    (["tune-model", "--model", "nowhere.py:f", "--input-shape", "8", "--summary-json", "TMP/file/s.json"], 2,
     "TMP/file is not a directory"),
    (["run", "--shape", "64", "--devices", "0,x"], 2, "bad --devices '0,x'"),
    (["run", "--shape", "64", "--devices", "99"], 3, "no CUDA GPU"),  # only a GPU worker knows the count
])
def test_paths_ops_and_devices_are_checked_before_any_work(stored, tmp_path, capsys, args, code, words):
    if "/proc/" in " ".join(args) and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    db = tmp_path / "t.db"
    db.write_bytes(stored)
    (tmp_path / "file").write_text("a file, not a folder")
    (tmp_path / "DUMP").write_text("")
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    args += [] if "--db" in args else ["--db", str(db)]
    got, _, err = cli(capsys, *args)
    assert got == code and words.replace("TMP", str(tmp_path)) in one_line(err)
    assert db.read_bytes() == stored and not (tmp_path / "no").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DUMP", "file", "t.db"]  # no -wal or -shm left either


def test_a_device_beyond_the_hosts_is_one_line(stored, monkeypatch, tmp_path, capsys):
    import fake_gpu
    from tritune.tuner.gpus import start
    from tritune.tuner.worker.local import LocalRunner

    monkeypatch.setattr(start, "LocalRunner", functools.partial(LocalRunner, handlers=fake_gpu.handlers))
    db = tmp_path / "t.db"
    db.write_bytes(stored)
    code, _, err = cli(capsys, "run", "--shape", "64", "--devices", "99", "--db", str(db))
    assert code == 3 and "there is no CUDA device 99" in one_line(err) and db.read_bytes() == stored


def test_inputs_that_do_not_fit_the_model_are_one_line(tmp_path, capfd):
    factory = tmp_path / "m.py"
    factory.write_text("import torch\ndef f():\n    return torch.nn.Linear(64, 64)\n")
    with pytest.raises(SystemExit) as info:
        cli_main(["tune-model", "--model", f"{factory}:f", "--input-shape", "8,32", "--dtype", "fp32", "--dry-run"])
    err = capfd.readouterr().err  # torch logs through handlers of its own: read the file descriptor
    assert info.value.code == 2 and "same reduction dim" in one_line(err)


def cli_main(argv):
    from tritune.tuner.cli import main

    main(argv)


class Silent:
    """A listener on 127.0.0.1 that accepts and never speaks, or sends a banner first (`banner`)."""

    def __init__(self, banner: bytes = b"") -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.banner, self.accepted = banner, []
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # stopped by the test
                return
            self.accepted.append(conn)
            conn.sendall(self.banner)

    def stop(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.sock.close()
        for conn in self.accepted:
            conn.close()


class QuietHTTP(http.server.BaseHTTPRequestHandler):
    """An HTTP server's handler that answers 501 to anything and logs nothing."""

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def listeners():
    """Start non-Dask servers on ephemeral ports: a silent one, an HTTP server, an SSH-like banner."""
    started = []

    def start(kind):
        if kind == "http":
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHTTP)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            started.append(server.shutdown)
            started.append(server.server_close)
            return f"tcp://127.0.0.1:{server.server_address[1]}"
        server = Silent(b"SSH-2.0-OpenSSH_9.6\r\n" if kind == "banner" else b"")
        started.append(server.stop)
        return server.address

    yield start
    for stop in started:
        stop()


@pytest.mark.parametrize("kind, words", [
    ("silent", "no Dask scheduler answered at ADDRESS within 0.5 s"),
    ("http", "no Dask scheduler"),  # it waits for a request line: it may take some of ours for one, and answer
    ("banner", "no Dask scheduler at ADDRESS: its first bytes announce a message of"),
])
def test_a_listener_that_is_no_dask_scheduler_is_one_line_within_the_wait(listeners, monkeypatch, tmp_path, capsys,
                                                                           kind, words):
    monkeypatch.setattr(cluster, "HANDSHAKE_S", 0.5)
    monkeypatch.setattr("tritune.tuner.gpus.cluster_client.HANDSHAKE_S", 0.5)
    address = listeners(kind)
    start = time.monotonic()
    code, _, err = cli(capsys, "run", "--shape", "64", "--cluster", address, "--cluster-wait", "0",
                       "--db", str(tmp_path / "t.db"))
    assert code == 3 and words.replace("ADDRESS", address) in one_line(err) and address in err
    assert time.monotonic() - start < 10  # a bound on a hang, not a timing: it took about 0.5 s
    assert not (tmp_path / "t.db").exists()


def test_a_banner_server_ends_the_process_with_one_line(listeners, tmp_path):
    address = listeners("banner")
    proc = subprocess.run([sys.executable, "-m", "tritune", "run", "--shape", "64", "--cluster", address,
                           "--cluster-wait", "3", "--db", str(tmp_path / "t.db")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "its first bytes announce" in one_line(proc.stderr)


@pytest.mark.parametrize("start", [
    "runpy.run_module('tritune', run_name='__main__')",  # python -m tritune
    "from tritune.__main__ import main; sys.exit(main())",  # the tune-cli script (pyproject's entry point)
])
def test_ctrl_c_while_the_cli_imports_is_one_line(tmp_path, start):
    # the interruption lands deterministically: importing click raises KeyboardInterrupt
    code = ("import sys, runpy\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'click':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n" + start + "\n")
    proc = subprocess.run([sys.executable, "-c", code, "best"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TRITUNE_DB": str(tmp_path / "t.db")})
    assert proc.returncode == 130 and "interrupted (SIGINT)" in one_line(proc.stderr)


def interpreter_off(monkeypatch):
    """Kernels as on a real machine, not Triton's interpreter: only CUDA tensors run them."""
    monkeypatch.setattr(device, "SETTINGS", dataclasses.replace(device.SETTINGS, interpret=False))


def test_the_api_on_cpu_tensors_raises_no_cuda_device(monkeypatch):
    interpreter_off(monkeypatch)
    a, b = torch.randn(7, 5), torch.randn(5, 3)  # a shape no other test caches a kernel for
    for call in (tritune.ops.matmul, tritune.ops.explain):
        with pytest.raises(tritune.NoCudaDevice, match=r"tritune\.ops\.\w+ runs tuned kernels on CUDA tensors, not on cpu"):
            call(a, b)


def test_the_backend_hands_a_cpu_graph_to_its_fallback(monkeypatch, tmp_path):
    model, x = torch.nn.Sequential(torch.nn.Linear(23, 21), torch.nn.ReLU()), torch.randn(17, 23)
    db = store(tmp_path / "t.db", [t.expr for t in tritune.extract_tasks(model, (x,))])  # tuned: not why it falls back
    interpreter_off(monkeypatch)
    graphs = []

    def fallback(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    backend = tritune.compiler(db, fallback=fallback)
    monkeypatch.setattr(compiler_module, "inductor", lambda mode=None, **_: fallback)  # what backend="tritune" runs
    with torch.no_grad():
        assert torch.allclose(torch.compile(model, backend=backend)(x), model(x))
        torch._dynamo.reset()
        assert torch.allclose(torch.compile(model, backend="tritune")(x), model(x))
    assert backend.sites == [] and len(graphs) == 2
