"""Files written whole or not at all, and paths that must not be written or read as files.

Every file tritune writes (an export, a report folder, a recording, a summary) is written beside its
target under a hidden `.NAME.*.part` name and renamed into place once complete, as git and pip
write theirs: a command stopped at any moment leaves the previous file or none, never a part of one
(a `kill -9` may leave the hidden part beside it). A target that is not a regular file (a device
such as /dev/stdout, a pipe) is written in place: it cannot be renamed over.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

SIDE_SUFFIXES = ("-wal", "-shm", "-journal")  # SQLite's files beside a database


def side_files(db: str | Path) -> tuple[Path, ...]:
    """The files SQLite keeps beside a database (its WAL, the WAL's index, a rollback journal)."""
    return tuple(Path(f"{db}{suffix}") for suffix in SIDE_SUFFIXES)


def not_a_regular_file(path: str | Path) -> str | None:
    """Why an existing path cannot be read as a file without blocking or reading a device (a
    folder, a FIFO, a socket, a device), or None for a regular file or a missing path; found by
    `stat`, so that a FIFO is never opened (opening one waits for a writer)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISDIR(mode):
        return "it is a directory"
    if stat.S_ISFIFO(mode):
        return "it is a FIFO, not a regular file"
    if not stat.S_ISREG(mode):
        return "it is a device or socket, not a regular file"
    return None


def overwrites(out: str | Path, db: str | Path) -> bool:
    """Whether writing `out` would overwrite the database `db` or one of its side files, by name,
    through a symbolic link, or as a hard link to one of them."""
    targets = [Path(db), *side_files(db)]
    real = os.path.realpath(db)
    targets += [Path(real), *side_files(real)]
    mine = os.path.realpath(out)
    for target in targets:
        if mine == os.path.realpath(target):
            return True
        try:
            if os.path.samefile(out, target):
                return True
        except OSError:  # one of them does not exist
            continue
    return False


def _beside(target: Path) -> Path:
    """A fresh hidden name beside `target`, on its file system (a rename across file systems copies)."""
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")


@contextmanager
def written(path: str | Path) -> Iterator[Path]:
    """The path to write a file's content to: a hidden part beside `path`, renamed onto it when the
    block ends without an error (flushed to disk first), removed when it ends with one (Ctrl-C,
    SIGTERM, a full disk). A path that exists and is not a regular file is yielded itself."""
    if os.path.exists(path) and not_a_regular_file(path):  # (/dev/stdout links to a pipe's name, not a path)
        yield Path(path)
        return
    target = Path(os.path.realpath(path))  # a link's target is replaced, not the link
    part = _beside(target)
    try:
        yield part
        _flush(part)
        if target.exists():  # the replaced file's permissions carry over
            os.chmod(part, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def _flush(path: Path) -> None:
    """Flush a written file to disk, so that a rename never puts an empty file in place after a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def filled(folder: str | Path) -> Iterator[Path]:
    """A hidden folder beside `folder` to write files into; when the block ends without an error its
    files go into `folder`: the whole folder renamed into place where there was none, else each
    file renamed over its namesake (other files of `folder` are kept), with SIGINT and SIGTERM held
    until the last rename. It is removed when the block ends with an error."""
    target = Path(os.path.realpath(folder))
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = _beside(target)
    stage.mkdir()
    try:
        yield stage
        for name in os.listdir(stage):
            _flush(stage / name)
        with _signals_held():
            if not target.exists():
                os.rename(stage, target)
                return
            for name in sorted(os.listdir(stage)):
                os.replace(stage / name, target / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then arrive as usual: a few renames are not
    split. (Caught by Python's handlers, which run in the main thread whichever thread the kernel
    picked: blocking the signals in this thread alone would not hold them.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread handles signals: a stop arrives there, not here
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(arrived):
            os.kill(os.getpid(), sig)  # delivered again, to the handlers of before
