"""The tuning database's file, checked and connected to. A connection that only reads creates and
changes nothing beside the file and reads a database in a folder it cannot write: SQLite's plain
read-only open of a WAL database leaves a -wal and a -shm behind, rebuilds a damaged -shm, and
fails where it cannot create them."""
from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritune.records.files import not_a_regular_file, side_files
from tritune.records.schema import SCHEMA_VERSION

BUSY_TIMEOUT_S = 60.0  # how long a write waits for other tuners' writes before it fails
_SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 20  # the magic, then the page size and the file format's write and read versions
TABLES = ("meta", "workloads", "devices", "trials")


class OpenError(Exception):
    """A path that cannot be opened as a database; its str is the reason."""


def check_file(path: Path) -> bytes:
    """The first bytes of the file (b"" where there is none yet); OpenError, without touching it,
    for a path that is a directory, not a regular file (a FIFO is never opened), unreadable or not
    SQLite."""
    reason = not_a_regular_file(path)
    if reason:
        raise OpenError(reason)
    if not path.exists():
        return b""
    try:
        with path.open("rb") as f:
            header = f.read(HEADER_BYTES)
    except OSError as exc:
        raise OpenError(exc.strerror or str(exc)) from None
    if header and header[:len(_SQLITE_MAGIC)] != _SQLITE_MAGIC:  # an empty file is a valid, empty database
        raise OpenError("file is not a database")
    return header


@dataclass(frozen=True)
class Snapshot:
    """What a file read as immutable must still be after each read for the read to hold: the same
    inode, size and times, and still no WAL beside it (no writer has started)."""

    facts: tuple

    @classmethod
    def of(cls, path: Path) -> "Snapshot":
        """The file's facts now."""
        st = os.stat(path)
        return cls((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, side_files(path)[0].exists()))


def connect(path: Path, readonly: bool, header: bytes) -> tuple[sqlite3.Connection, Snapshot | None]:
    """A connection to the database (`header`: its first bytes, from `check_file`), and for a read
    that SQLite cannot guard with its locks, the snapshot each read must be checked against."""
    if not readonly:
        return sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S), None
    uri = path.resolve().as_uri()
    if header[18:20] != b"\x02\x02":  # a rollback journal: a read-only open writes nothing at all
        return _uri(f"{uri}?mode=ro"), None
    wal, shm = side_files(path)[:2]
    if shm.exists():  # a writer at work, or one killed: its WAL is read through its index, never written here
        return _uri(f"{uri}?mode=ro&readonly_shm=1"), None
    if wal.exists():  # a killed writer's WAL without its index: SQLite rebuilds one, in a -shm it makes
        return _uri(f"{uri}?mode=ro"), None
    if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        # nobody has it open: the -wal and -shm SQLite makes for this connection are removed as
        # it closes, the last to (a read-only one could not remove them); query_only keeps it reading
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S)
        conn.execute("PRAGMA query_only = 1")
        return conn, None
    # SQLite cannot make the -wal and -shm it reads a WAL file with, and no writer of this user can
    # either: read the file as it is, and check after each read that no other user's writer has
    # started meanwhile (immutable: without SQLite's locks, a read could meet a checkpoint's writes)
    snapshot = Snapshot.of(path)
    return _uri(f"{uri}?immutable=1"), snapshot


def _uri(uri: str) -> sqlite3.Connection:
    return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)


def check_schema(db: Any, tables: set[str]) -> None:
    """OpenError unless a database (a sqlite_utils.Database with these tables) is a tritune
    database of this schema version."""
    if "meta" not in tables:
        raise OpenError("not a tritune database (it has no meta table)")
    row = db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    version = _as_int(row[0]) if row else None
    if version is None:
        raise OpenError("its meta table has no valid schema_version")
    if version > SCHEMA_VERSION:
        raise OpenError(f"schema version {version} is newer than this tritune supports ({SCHEMA_VERSION}); "
                        "upgrade tritune")
    if version < SCHEMA_VERSION:
        raise OpenError(f"schema version {version} is older than {SCHEMA_VERSION} and has no migration")
    missing = [t for t in TABLES if t not in tables]
    if missing:
        raise OpenError(f"missing tables: {', '.join(missing)}")


def check_pages(db: Any) -> None:
    """OpenError for a file with damaged pages that its header and schema do not show (SQLite's
    quick_check reads every page: about 2 ms per MB)."""
    found = db.execute("PRAGMA quick_check(1)").fetchone()[0]
    if found != "ok":
        raise OpenError(f"database disk image is malformed ({found.strip().splitlines()[-1]})")


def enable_wal(db: Any) -> None:
    """WAL mode, waiting (up to BUSY_TIMEOUT_S) for other processes opening the same file at
    once: switching the journal mode does not wait on SQLite's busy timeout, and of four
    tuners started together on a new file, about one open in twelve failed "database is locked"."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.enable_wal()  # a no-op where the file is WAL already
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
