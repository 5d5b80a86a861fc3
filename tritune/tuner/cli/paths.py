"""Path options checked as click parses them (option callbacks), so a path that cannot be used is
one line before any work starts: a file a command will write, a folder it will fill, the folder of
a `--db` named on the command line (never created: a typo must not make directories); the
database a command opens (`open_db`: a failure is one line too), and the files it writes
(`output`: whole or not at all, never over the database)."""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

import click

from tritune.records import files
from tritune.records.database import Database, DatabaseError
from tritune.settings import SETTINGS
from tritune.tuner.cli.inputs import UsageError


def output_file(ctx: Any, param: Any, value: str | None) -> str | None:
    """A file the command writes at its end ('-': stdout): a regular one can be written beside and
    renamed into place (`records.files.written`), a device or pipe opened for writing (it is not
    opened now: a FIFO would wait for a reader)."""
    if value is None or value == "-":
        return value
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a directory")
    _folder(path.parent)
    if path.exists() and files.not_a_regular_file(path):
        if not os.access(path, os.W_OK):
            raise click.BadParameter(f"cannot write {value}: permission denied")
        return value
    try:
        if path.exists():
            with path.open("a"):  # opened, not written: an existing file keeps its bytes
                pass
        tempfile.TemporaryFile(dir=path.parent).close()  # where its part is written
    except OSError as exc:
        raise click.BadParameter(f"cannot write {value}: {exc.strerror or exc}") from None
    return value


@contextmanager
def output(value: str, db_path: str | None = None) -> Iterator[TextIO]:
    """A text file to write ('-': stdout), put in place whole when the block ends (`files.written`);
    one that would overwrite the tuning database, and a write that fails (a full disk), are one line."""
    if value == "-":
        yield sys.stdout
        return
    not_the_database([value], db_path)
    try:
        with files.written(value) as part, open(part, "w") as fp:
            yield fp
    except OSError as exc:
        raise UsageError(f"cannot write {value}: {exc.strerror or exc}") from None


def not_the_database(outputs: Iterable[str | Path], db_path: str | None) -> None:
    """One line where a file a command writes is the tuning database, one of its side files
    (-wal, -shm, -journal), or a link to one of them."""
    db = Path(db_path) if db_path else SETTINGS.db_path
    for out in outputs:
        if files.overwrites(out, db):
            raise UsageError(f"will not write {out}: it is the tuning database {db} or one of its files")


def output_dir(ctx: Any, param: Any, value: str | None) -> str | None:
    """A folder the command fills (made if missing): a file can be created in it, or in the
    nearest folder above it that exists."""
    if value is None:
        return value
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{value} is not a directory")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise click.BadParameter(f"{existing} is not a directory")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise click.BadParameter(f"cannot write in {existing}: {exc.strerror or exc}") from None
    return value


def database(ctx: Any, param: Any, value: str | None) -> str | None:
    """A `--db` named on the command line: its folder exists (the default's is made when it is first used)."""
    if value is not None:
        _folder(Path(value).parent)
    return value


def _folder(path: Path) -> None:
    if not path.exists():
        raise click.BadParameter(f"no directory {path}")
    if not path.is_dir():
        raise click.BadParameter(f"{path} is not a directory")


def writable_db(path: str | None) -> None:
    """One line (before any work) where the tuning database cannot be written: the file, or the
    folder its -wal and -shm go in (or, where it is to be made, the nearest folder that exists)."""
    target = Path(path) if path else SETTINGS.db_path
    folder = next(p for p in target.absolute().parents if p.exists())
    for where in ([target] if target.exists() else []) + [folder]:
        if not os.access(where, os.W_OK):
            raise UsageError(f"cannot write tuning database {target}: {where} is read-only to this user")


def open_db(path: str | None, must_exist: bool = False) -> Database:
    """Open the tuning database (read-only where it `must_exist`: for the commands that only read),
    turning any failure into one line."""
    target = Path(path) if path else SETTINGS.db_path
    try:
        return Database.open_existing(target) if must_exist else Database(target)
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None


db_option = click.option("--db", "db_path", default=None, callback=database, help=f"tuning database [default: $TRITUNE_DB or {SETTINGS.db_path}]")
