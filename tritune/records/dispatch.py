"""Replay context: which stored config to run for a workload on a device. No Triton here."""
from __future__ import annotations

import atexit
import json
import threading
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tritune.records.database import Database
from tritune.records.result import DeviceKey
from tritune.schedules.config import Config
from tritune.settings import SETTINGS


class _Local(threading.local):
    """Per-thread stack of active replay contexts (an attribute read, not a hasattr, on every op call)."""

    def __init__(self) -> None:
        self.stack: list[HistoryBest] = []


_local = _Local()
_histories: dict[Any, HistoryBest] = {}  # one per database a `db=` argument named (None: the default one)
_opened: "weakref.WeakSet[HistoryBest]" = weakref.WeakSet()  # histories that opened their database, while they live


class HistoryBest:
    """Best stored configs of one database, looked up once per (workload, device) and cached."""

    def __init__(self, db: Database | str | Path) -> None:
        # opened now, so that a missing or broken file is reported here, not at a first lookup
        self._db: Database | None = db if isinstance(db, Database) else Database.open_existing(db)
        self._path = None if isinstance(db, Database) else Path(db)  # the file it opened itself
        if self._path is not None:
            _opened.add(self)
        self._best: dict[tuple[str, str], Config | None] = {}
        self._tuned: dict[tuple[str, str, str], list[tuple[dict, Config]]] = {}
        self._graphs: dict[tuple[str, str, str], str | None] = {}

    @property
    def db(self) -> Database:
        """The database (opened again where it was closed)."""
        if self._db is None:
            self._db = Database.open_existing(self._path)
        return self._db

    def close(self) -> None:
        """Close the database where this history opened it: a reading connection's side files (a WAL
        database's -wal and -shm, made for it) go as it closes. A later lookup opens it again."""
        if self._path is not None and self._db is not None:
            self._db.close()
            self._db = None

    def best(self, workload_key: str, device: DeviceKey) -> Config | None:
        """The fastest stored config of exactly this workload on this device, or None."""
        key = (workload_key, device.key)
        if key not in self._best:
            result = self.db.best(workload_key, device)
            self._best[key] = None if result is None else result.config
        return self._best[key]

    def graph_verdict(self, graph: str, device: DeviceKey, mode: str) -> str | None:
        """Whether a compiled graph measured faster with its tuned kernels ('tritune') or without
        them ('inductor') in a torch.compile mode, or None if it was not measured."""
        key = (graph, device.key, mode)
        if key not in self._graphs:
            self._graphs[key] = self.db.graph_verdict(graph, device, mode)
        return self._graphs[key]

    def tuned(self, op: str, dtype: str, device: DeviceKey) -> list[tuple[dict, Config]]:
        """(workload spec, best config) of every tuned workload of an op and dtype on this device."""
        key = (op, dtype, device.key)
        if key not in self._tuned:
            rows = [r for r in self.db.best_rows(op) if r.dtype == dtype and r.device == device]
            self._tuned[key] = [(json.loads(r.workload_spec), r.result.config) for r in rows]
        return self._tuned[key]


def graph_mode(fallback: str, mode: str | None) -> str:
    """What a graph verdict is stored under: the backend the rest of the graph goes to and its mode
    ('inductor/reduce-overhead')."""
    return f"{fallback}/{mode or 'default'}"


@contextmanager
def apply_history_best(db: Database | str | Path) -> Iterator[HistoryBest]:
    """Within this block, tritune ops run the best configs stored in `db`."""
    context = db if isinstance(db, HistoryBest) else HistoryBest(db)
    _local.stack.append(context)
    try:
        yield context
    finally:
        _local.stack.pop()
        if context is not db:  # made for this block
            context.close()


def current() -> HistoryBest | None:
    """The innermost active replay context of this thread, if any."""
    stack = _local.stack
    return stack[-1] if stack else None


def history_of(db: Any) -> HistoryBest | None:
    """The history of `db` (a path, a Database or a HistoryBest), else the active context, else the
    default database (None while that file does not exist)."""
    if db is None:
        return current() or _default()
    if isinstance(db, HistoryBest):
        return db
    if db not in _histories:
        _histories[db] = HistoryBest(db)
    return _histories[db]


@atexit.register
def _close() -> None:
    """Close the databases of the histories that opened theirs and still live (a compiled model's)."""
    for history in list(_opened):
        history.close()


def _default() -> HistoryBest | None:
    # opened once the file exists; until then each call checks (and runs untuned defaults anyway)
    if None not in _histories and SETTINGS.db_path.exists():
        _histories[None] = HistoryBest(SETTINGS.db_path)
    return _histories.get(None)
