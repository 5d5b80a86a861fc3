"""The SQLite tuning database: workloads, devices and every measured trial; JSONL in and out.

No torch or triton here: the database is read by commands that must work without a GPU.
"""
from __future__ import annotations

import functools
import json
import logging
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence, TextIO

import sqlite_utils

from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.records import carry, jsonl, schema
from tritune.records.opening import OpenError, Snapshot, check_file, check_pages, check_schema, connect, enable_wal
from tritune.records.owners import alive
from tritune.records.schema import SCHEMA_VERSION
from tritune.schedules.config import Config

# damaged rows skipped by a read: without a handler of the caller's, Python's last-resort handler
# prints the warning alone on stderr
LOG = logging.getLogger("tritune.records")
_TIMES = jsonl.TIMES
_TRIAL_COLUMNS = ("workload", "device", "config_key", "config", "status", *_TIMES, "compile_s", "timestamp", "message",
                  "measured_on")

class DatabaseError(Exception):
    """A tuning database that cannot be opened, read or written; its str is one human line."""


@dataclass(frozen=True)
class BestRow:
    """The best OK trial of one workload on one device, with how many trials were stored for it."""

    workload_key: str
    op: str
    dtype: str
    workload_spec: str
    device: DeviceKey
    result: MeasureResult
    n_trials: int


def _reads(method: Callable, again: bool = True) -> Callable:
    """A read whose failure (a page damaged since the file was opened, a disk gone) is one line. A
    file read as immutable that changed meanwhile (`opening.Snapshot`) is opened again and read
    again, or where the read cannot be repeated (`again=False`: it wrote what it read), a DatabaseError."""
    @functools.wraps(method)
    def read(self: "Database", *args: Any, **kwargs: Any) -> Any:
        try:
            value = method(self, *args, **kwargs)
            if self._changed():
                if not again:
                    raise DatabaseError(f"cannot read tuning database {self.path}: another process changed it "
                                        "while it was read; run the command again")
                self._reconnect()
                value = method(self, *args, **kwargs)
            return value
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot read tuning database {self.path}: {exc}") from None
    return read


class Database:
    """The tuning database at one path: created on first use, checked before anything is written."""

    def __init__(self, path: str | Path, checked: bool = False, readonly: bool = False) -> None:
        """`checked`: a second connection (for another thread) to a file this process already has
        open. It must not be read with anything but SQLite then: closing any descriptor of the file
        drops every POSIX lock the process holds on it, and another process may then take itself
        for the last user and reset the WAL under the open connections (their commits were lost:
        SQLite's "How To Corrupt", section 2.2). `readonly`: nothing is ever written to the file,
        nor created or changed beside it (`opening.connect`)."""
        self.path, self.readonly = Path(path), readonly
        try:
            header = b"" if checked else check_file(self.path)
            if not readonly:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._connect(header, verify=not checked)
        except (OSError, OpenError) as exc:
            raise self._error(getattr(exc, "strerror", None) or str(exc)) from None

    def _connect(self, header: bytes, verify: bool) -> None:
        try:
            conn, self._snapshot = connect(self.path, self.readonly, header)
            self._db = sqlite_utils.Database(conn)
        except sqlite3.Error as exc:
            raise self._error(str(exc)) from None
        try:
            self._open(verify)
        except (sqlite3.Error, sqlite_utils.db.TransactionError, OpenError) as exc:
            self._db.close()
            raise self._error(str(exc)) from None
        except DatabaseError:
            self._db.close()
            raise

    def _changed(self) -> bool:
        """Whether a file read as immutable has changed since it was opened (another user's writer)."""
        return self._snapshot is not None and self._snapshot != Snapshot.of(self.path)

    def _reconnect(self) -> None:
        """Open the file again, as it is now."""
        self._db.close()
        self._connect(check_file(self.path), verify=False)

    @classmethod
    def open_existing(cls, path: str | Path) -> "Database":
        """Open, read-only, a database that must already exist (for commands that only read)."""
        if not Path(path).exists():
            raise DatabaseError(f"no tuning database at {path} (run `tune-cli run` first, or pass --db)")
        return Database(path, readonly=True)  # not cls: a subclass may take the path alone

    def _error(self, reason: str) -> DatabaseError:
        return DatabaseError(f"cannot open tuning database {self.path}: {reason}")

    def _open(self, verify: bool) -> None:
        # Every check only reads; the first write (WAL, tables) comes once the file is known to be ours.
        tables = set(self._db.table_names())
        if tables:
            check_schema(self._db, tables)
            if verify:
                check_pages(self._db)
        elif self.readonly:  # an empty file reads as an empty database, which this one stands in for
            self._db.close()
            self._db = sqlite_utils.Database(sqlite3.connect(":memory:"))
        if not self.readonly:
            enable_wal(self._db)
        # WAL with NORMAL sync: a killed process loses no committed trial; only an OS crash or power
        # cut may lose the last few (never corrupting the file), and a commit costs no fsync
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA foreign_keys = ON")
        if not tables:
            with self._write():
                for statement in filter(str.strip, schema.SCHEMA.split(";")):
                    self._db.conn.execute(statement)
        self._claims_ready = False
        self._measured_on_ready = False

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def journal_mode(self) -> str:
        """SQLite's journal mode for this file ('wal' once opened)."""
        return self._db.journal_mode

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction, taken at once (waiting up to BUSY_TIMEOUT_S for other writers) and
        committed or rolled back whole. A write SQLite refuses (a full disk, a read-only file) is one
        DatabaseError line, and everything stored before stays as it was."""
        conn = self._db.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            raise DatabaseError(f"cannot write to tuning database {self.path}: {exc}") from None

    def add_workload(self, key: str, op: str, dtype: str, spec_json: str) -> None:
        """Store a workload once; later calls with the same key change nothing."""
        with self._write():
            self._add_workload(key, op, dtype, spec_json)

    def save(self, workload_key: str, device: DeviceKey, results: Sequence[MeasureResult]) -> int:
        """Store new trials of a workload on a device in one transaction (and end their claims);
        returns how many were new."""
        with self._write():
            if not self._db.execute("SELECT 1 FROM workloads WHERE key = ?", [workload_key]).fetchone():
                raise DatabaseError(f"unknown workload {workload_key!r} in {self.path}; add_workload() it first")
            if self._claims_ready:
                self._db.conn.executemany("DELETE FROM claims WHERE workload = ? AND device = ? AND config_key = ?",
                                          [(workload_key, device.key, r.config.key) for r in results])
            return self._insert(workload_key, device, results)

    def claim(self, workload_key: str, device: DeviceKey, config: Config, owner: str, stale_s: float = 600.0) -> bool:
        """Take a config to measure: False when it is stored already, or when another live tuner holds
        it (a claim of a dead process on this host, or older than `stale_s`, is taken over)."""
        key = (workload_key, device.key, config.key)
        where = "WHERE workload = ? AND device = ? AND config_key = ?"
        with self._write():
            if not self._claims_ready:
                self._db.conn.execute(schema.CLAIMS)
                self._claims_ready = True
            if self._db.execute(f"SELECT 1 FROM trials {where}", key).fetchone():
                return False
            held = self._db.execute(f"SELECT owner, since FROM claims {where}", key).fetchone()
            if held and held[0] != owner and held[1] > time.time() - stale_s and alive(held[0]):
                return False
            self._db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)", [*key, owner, time.time()])
        return True

    def release(self, owner: str) -> None:
        """End every claim of a tuner (when it stops)."""
        if self._claims_ready:
            with self._write():
                self._db.execute("DELETE FROM claims WHERE owner = ?", [owner])

    def carry_over(self, op: str, templates: dict[str, str], graphs: bool = False) -> int:
        """Move an op's trials stored under a former template key (a key of `templates`) to the same
        device under the mapped key, in one transaction (`records.carry`); returns how many moved."""
        with self._write():
            return carry.carry_over(self._db.conn, op, templates, graphs)

    @_reads
    def count(self, workload_key: str, device: DeviceKey) -> int:
        """How many trials of a workload are stored for a device."""
        sql = "SELECT COUNT(*) FROM trials WHERE workload = ? AND device = ?"
        return self._db.execute(sql, [workload_key, device.key]).fetchone()[0]

    def _add_workload(self, key: str, op: str, dtype: str, spec_json: str) -> None:
        self._db.execute("INSERT OR IGNORE INTO workloads (key, op, dtype, spec, created) VALUES (?, ?, ?, ?, ?)",
                         [key, op, dtype, spec_json, time.time()])

    def _insert(self, workload_key: str, device: DeviceKey, results: Iterable[MeasureResult]) -> int:
        # Callers hold the transaction. The device row is a pure function of its key, so insert-or-ignore
        # is an upsert; a config already stored keeps its first measurement (resume, re-import).
        if not self._measured_on_ready:
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(trials)")}
            if "measured_on" not in columns:
                self._db.execute(schema.MEASURED_ON)
            self._measured_on_ready = True
        self._db.execute("INSERT OR IGNORE INTO devices (key, spec) VALUES (?, ?)", [device.key, device.to_json()])
        rows = [_trial_row(workload_key, device.key, r) for r in results]
        before = self._db.conn.total_changes
        self._db.conn.executemany(
            f"INSERT OR IGNORE INTO trials ({', '.join(_TRIAL_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(_TRIAL_COLUMNS))})", rows)
        return self._db.conn.total_changes - before

    @_reads
    def trials(self, workload_key: str, device: DeviceKey | None = None) -> list[MeasureResult]:
        """Every stored trial of a workload (on one device, or all), in insertion order."""
        sql, params = "SELECT * FROM trials WHERE workload = ?", [workload_key]
        if device is not None:
            sql, params = sql + " AND device = ?", params + [device.key]
        return list(self._parsed(self._db.query(sql + " ORDER BY id", params), _result))

    @_reads
    def best(self, workload_key: str, device: DeviceKey) -> MeasureResult | None:
        """The OK trial a workload runs on a device: the winner of its head-to-head where one was
        stored (`save_verdict`), else the one with the lowest median time; None if none ran."""
        rows = self._db.query(
            f"SELECT * FROM trials t WHERE workload = ? AND device = ? AND {schema.TIMED} "
            f"ORDER BY {self._order()} LIMIT 1", [workload_key, device.key])
        found = list(self._parsed(rows, _result))
        return found[0] if found else None

    def save_verdict(self, workload_key: str, device: DeviceKey, winner: Config, detail: dict) -> None:
        """Store which stored config won a workload's final head-to-head (and its timings)."""
        with self._write():
            self._db.conn.execute(schema.VERDICTS)
            self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?)",
                             [workload_key, device.key, winner.key, json.dumps(detail, sort_keys=True), time.time()])

    def save_graph_verdict(self, graph: str, device: DeviceKey, mode: str, winner: str, detail: dict) -> None:
        """Store whether a compiled graph ran faster with its tuned kernels ('tritune') or without ('inductor')."""
        with self._write():
            self._db.conn.execute(schema.GRAPH_VERDICTS)
            self._db.execute("INSERT OR REPLACE INTO graph_verdicts VALUES (?, ?, ?, ?, ?, ?)",
                             [graph, device.key, mode, winner, json.dumps(detail, sort_keys=True), time.time()])

    @_reads
    def graph_verdict(self, graph: str, device: DeviceKey, mode: str) -> str | None:
        """The stored winner of a graph in a mode on a device ('tritune' or 'inductor'), or None."""
        if "graph_verdicts" not in self._db.table_names():
            return None
        row = self._db.execute("SELECT winner FROM graph_verdicts WHERE graph = ? AND device = ? AND mode = ?",
                               [graph, device.key, mode]).fetchone()
        return row[0] if row else None

    def _parsed(self, rows: Iterable[dict], make: Callable[[dict], Any]) -> Iterator[Any]:
        """make(row) of each row but a damaged one (JSON that does not parse, an unknown status, a
        time below zero or not finite), which is skipped, with one warning once all are read."""
        damaged = []
        for row in rows:
            try:
                made = make(row)
            except (ValueError, TypeError, KeyError, RecursionError) as exc:  # json's errors are ValueErrors
                damaged.append(f"row {row.get('id')}: {str(exc)[:200] or type(exc).__name__}")
                continue
            yield made
        if damaged:
            LOG.warning(f"tritune: skipped {len(damaged)} damaged trial{'s' * (len(damaged) > 1)} "
                        f"of {self.path} ({damaged[0]})")

    def _order(self) -> str:
        return schema.ORDER_WITH_VERDICTS if "verdicts" in self._db.table_names() else schema.ORDER

    @_reads
    def best_rows(self, op: str | None = None) -> list[BestRow]:
        """The best OK trial of every (workload, device) pair, optionally of one op."""
        sql = schema.BEST_ROWS.format(order=self._order(), timed=schema.TIMED)
        return list(self._parsed(self._db.query(sql, {"op": op}), _best_row))

    @_reads
    def workloads(self, op: str | None = None) -> list[tuple[str, str, str, str]]:
        """(key, op, dtype, spec JSON) of every stored workload, optionally of one op."""
        rows = self._db.execute("SELECT key, op, dtype, spec FROM workloads WHERE (:op IS NULL OR op = :op) "
                                "ORDER BY created, key", {"op": op})
        return [tuple(row) for row in rows]

    @functools.partial(_reads, again=False)
    def export_jsonl(self, fp: TextIO) -> int:
        """Write every trial as one self-contained JSON line (the winner of its workload's
        head-to-head marked `"verdict": true`); returns lines written."""
        n = 0
        winners = set()
        if "verdicts" in self._db.table_names():
            winners = {tuple(r) for r in self._db.execute("SELECT workload, device, winner FROM verdicts")}

        def line(row: dict) -> str:
            return jsonl.trial_line(row, (row["workload"], row["device"], row["config_key"]) in winners)

        for text in self._parsed(self._db.query(schema.EXPORT), line):
            fp.write(text + "\n")
            n += 1
        return n

    def import_jsonl(self, fp: TextIO | BinaryIO) -> int:
        """Add the trials of a JSONL export, all or nothing; returns how many were new."""
        try:
            parsed = jsonl.parse_lines(fp)
        except ValueError as exc:
            raise DatabaseError(str(exc)) from None
        return self.import_trials(parsed)

    def import_trials(self, parsed: Sequence[jsonl.Trial]) -> int:
        """Add parsed JSONL trials (`jsonl.parse_lines`), all or nothing; returns how many were new.
        Where nothing is new the file is not written at all."""
        fresh = [trial for trial in parsed if self._is_new(trial)]
        n = 0
        if fresh:
            with self._write():
                for workload, device, result, won in fresh:
                    self._add_workload(*workload)
                    n += self._insert(workload[0], device, [result])
                    if won:  # the head-to-head's winner, as the exporting database had it
                        self._db.conn.execute(schema.VERDICTS)
                        self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?)",
                                         [workload[0], device.key, result.config.key, "{}", result.timestamp])
        return n

    @_reads
    def _is_new(self, trial: jsonl.Trial) -> bool:
        """Whether storing a parsed trial changes anything: a config not stored, or a verdict not held."""
        (workload, *_), device, result, won = trial
        key = [workload, device.key, result.config.key]
        if not self._db.execute("SELECT 1 FROM trials WHERE workload = ? AND device = ? AND config_key = ?",
                                key).fetchone():
            return True
        return won and ("verdicts" not in self._db.table_names() or not self._db.execute(
            "SELECT 1 FROM verdicts WHERE workload = ? AND device = ? AND winner = ?", key).fetchone())


def _trial_row(workload_key: str, device_key: str, r: MeasureResult) -> tuple:
    return (workload_key, device_key, r.config.key, r.config.to_json(), r.status.value,
            r.t_min, r.t_p20, r.t_median, r.t_p80, r.compile_s, r.timestamp, r.message, r.measured_on)


def _result(row: dict) -> MeasureResult:
    return jsonl.checked(MeasureResult(
        Config.from_json(row["config"]), Status(row["status"]), row["t_min"], row["t_p20"], row["t_median"],
        row["t_p80"], row["compile_s"], row["timestamp"], row["message"], row.get("measured_on") or ""))


def _best_row(row: dict) -> BestRow:
    return BestRow(row["workload"], row["op"], row["dtype"], row["workload_spec"],
                   DeviceKey.from_json(row["device_spec"]), _result(row), row["n_trials"])
