"""Path options checked as click parses them (option callbacks), so a path that cannot be used is
one line before any work starts: a file a command will write, a folder it will fill, the folder of
a `--db` named on the command line (never created: a typo must not make directories); and the
database a command opens (`open_db`: a failure is one line too)."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from tritune.records.database import Database, DatabaseError
from tritune.settings import SETTINGS
from tritune.tuner.cli.inputs import UsageError


def output_file(ctx: Any, param: Any, value: str | None) -> str | None:
    """A file the command writes at its end ('-': stdout): it can be created or appended to now."""
    if value is None or value == "-":
        return value
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a directory")
    _folder(path.parent)
    existed = path.exists()
    try:
        with path.open("a"):  # opened, not written: an existing file keeps its bytes
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write {value}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)
    return value


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


def open_db(path: str | None, must_exist: bool = False) -> Database:
    """Open the tuning database (read-only where it `must_exist`: for the commands that only read),
    turning any failure into one line."""
    target = Path(path) if path else SETTINGS.db_path
    try:
        return Database.open_existing(target) if must_exist else Database(target)
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None


db_option = click.option("--db", "db_path", default=None, callback=database, help=f"tuning database [default: $TRITUNE_DB or {SETTINGS.db_path}]")
