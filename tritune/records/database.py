"""The tuning database: SQLite through sqlite-utils, WAL mode, a schema version. No Triton here.

Tables: workloads (what is computed), devices (where and with which compiler and template),
trials (one row per measured config, unique per workload, device and config).
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

import sqlite_utils

from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config

SCHEMA_VERSION = 1
TIME_FIELDS = ("t_min", "t_p20", "t_median", "t_p80")
SQLITE_MAGIC = b"SQLite format 3\x00"


class DatabaseError(Exception):
    """A database that cannot be used; its message is one line for the user."""


@dataclass(frozen=True)
class BestRow:
    """The fastest correct trial of one workload on one device."""

    workload_key: str
    op: str
    dtype: str
    workload_spec: str
    device: DeviceKey
    result: MeasureResult
    n_trials: int


def _check_file(path: Path) -> None:
    """Refuse, before SQLite touches it, a path that is a directory or not an SQLite file."""
    if path.is_dir():
        raise DatabaseError(f"cannot open tuning database {path}: it is a directory")
    if path.exists():
        try:
            head = path.open("rb").read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise DatabaseError(f"cannot read tuning database {path}: {exc.strerror}") from None
        if head and head != SQLITE_MAGIC:
            raise DatabaseError(f"cannot open tuning database {path}: file is not an SQLite database")


class Database:
    """A tuning database file; created with its schema on first use."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        _check_file(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite_utils.Database(sqlite3.connect(str(self.path)))
            self._check_schema()
            self.db.enable_wal()
            self._create()
        except (sqlite3.DatabaseError, OSError) as exc:
            raise DatabaseError(f"cannot open tuning database {self.path}: {exc}") from None

    @classmethod
    def open_existing(cls, path: str | Path) -> "Database":
        """Open a database that must already exist (for commands that only read)."""
        if not Path(path).expanduser().exists():
            raise DatabaseError(f"no tuning database at {path} (tune something first, or pass --db)")
        return cls(path)

    def _check_schema(self) -> None:
        tables = set(self.db.table_names())
        if "meta" not in tables:
            if tables - {"workloads", "devices", "trials"}:
                raise DatabaseError(f"{self.path} is an SQLite file of another program, not a tuning database")
            return
        row = self.db.execute("select value from meta where key = 'schema_version'").fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise DatabaseError(f"tuning database {self.path} has schema version {version}; this tritune "
                                f"reads up to {SCHEMA_VERSION} (upgrade tritune)")
        if not {"workloads", "devices", "trials"} <= tables:
            raise DatabaseError(f"tuning database {self.path} is missing tables")

    def _create(self) -> None:
        with self.db.conn:
            self.db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
            self.db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")
            self.db["workloads"].create({"key": str, "op": str, "dtype": str, "spec": str, "created": float},
                                        pk="key", if_not_exists=True)
            self.db["devices"].create({"key": str, "spec": str}, pk="key", if_not_exists=True)
            self.db["trials"].create(
                {"id": int, "workload": str, "device": str, "config_key": str, "config": str, "status": str,
                 **{f: float for f in TIME_FIELDS}, "compile_s": float, "timestamp": float, "message": str},
                pk="id", foreign_keys=[("workload", "workloads", "key"), ("device", "devices", "key")],
                if_not_exists=True)
            self.db["trials"].create_index(["workload", "device", "config_key"], unique=True, if_not_exists=True)
            self.db["trials"].create_index(["workload", "device", "status"], if_not_exists=True)

    def add_workload(self, key: str, op: str, dtype: str, spec_json: str) -> None:
        """Store a workload (idempotent)."""
        import time

        with self.db.conn:
            self.db["workloads"].insert({"key": key, "op": op, "dtype": dtype, "spec": spec_json,
                                         "created": time.time()}, pk="key", ignore=True)

    def save(self, workload_key: str, device: DeviceKey, results: Sequence[MeasureResult]) -> int:
        """Store results in one transaction; configs already stored are kept. Returns rows added."""
        if not self.db["workloads"].count_where("key = ?", [workload_key]):
            raise DatabaseError(f"unknown workload {workload_key}: add it before saving trials")
        rows = [_trial_row(workload_key, device.key, r) for r in results]
        return self._insert(rows, [(device.key, device.to_json())])

    def _insert(self, rows: list[dict], devices: Iterable[tuple[str, str]]) -> int:
        before = self.db["trials"].count
        with self.db.conn:
            for key, spec in devices:
                self.db["devices"].insert({"key": key, "spec": spec}, pk="key", ignore=True)
            self.db["trials"].insert_all(rows, ignore=True)
        return self.db["trials"].count - before

    def trials(self, workload_key: str, device: DeviceKey | None = None) -> list[MeasureResult]:
        """Stored results of a workload (on one device, if given), in insertion order."""
        where, args = "workload = ?", [workload_key]
        if device is not None:
            where, args = where + " and device = ?", args + [device.key]
        return [_result(r) for r in self.db["trials"].rows_where(where, args, order_by="id")]

    def measured_keys(self, workload_key: str, device: DeviceKey) -> set[str]:
        """Config keys already stored for a workload on a device."""
        rows = self.db.execute("select config_key from trials where workload = ? and device = ?",
                               [workload_key, device.key])
        return {r[0] for r in rows}

    def best(self, workload_key: str, device: DeviceKey) -> MeasureResult | None:
        """The correct result with the lowest median time, or None."""
        rows = list(self.db["trials"].rows_where("workload = ? and device = ? and status = 'OK'",
                                                 [workload_key, device.key], order_by="t_median, id", limit=1))
        return _result(rows[0]) if rows else None

    def best_rows(self, op: str | None = None) -> list[BestRow]:
        """The best trial of every (workload, device) that has a correct one."""
        sql = """select t.*, w.op, w.dtype, w.spec as wspec, d.spec as dspec,
                   (select count(*) from trials c where c.workload = t.workload and c.device = t.device) as n
                 from trials t join workloads w on w.key = t.workload join devices d on d.key = t.device
                 where t.status = 'OK' and t.id = (select b.id from trials b where b.workload = t.workload
                   and b.device = t.device and b.status = 'OK' order by b.t_median, b.id limit 1)
                   and (? is null or w.op = ?)
                 order by w.op, w.key, d.key"""
        cursor = self.db.execute(sql, [op, op])
        names = [c[0] for c in cursor.description]
        return [_best_row(dict(zip(names, row))) for row in cursor.fetchall()]

    def workloads(self, op: str | None = None) -> list[tuple[str, str, str, str]]:
        """(key, op, dtype, spec JSON) of the stored workloads."""
        where = "op = ?" if op else None
        return [(r["key"], r["op"], r["dtype"], r["spec"])
                for r in self.db["workloads"].rows_where(where, [op] if op else [], order_by="key")]

    def export_jsonl(self, fp: TextIO) -> int:
        """Write every trial as one JSON line with its workload and device; returns lines written."""
        sql = """select t.*, w.op, w.dtype, w.spec as wspec, d.spec as dspec from trials t
                 join workloads w on w.key = t.workload join devices d on d.key = t.device order by t.id"""
        cursor = self.db.execute(sql)
        names = [c[0] for c in cursor.description]
        n = 0
        for row in cursor:
            fp.write(json.dumps(_export_line(dict(zip(names, row))), sort_keys=True) + "\n")
            n += 1
        return n

    def import_jsonl(self, fp: TextIO) -> int:
        """Add trials from JSON lines: every line is validated first, then all are written at once."""
        workloads, devices, rows = {}, {}, []
        for number, line in enumerate(fp, start=1):
            if not line.strip():
                continue
            try:
                w, device, row = _parse_line(line)
            except (ValueError, KeyError, TypeError) as exc:
                raise DatabaseError(f"cannot import line {number}: {exc!s:.200}") from None
            workloads[w["key"]] = w
            devices[device.key] = device.to_json()
            rows.append(row)
        import time

        with self.db.conn:
            for w in workloads.values():
                self.db["workloads"].insert(dict(w, created=time.time()), pk="key", ignore=True)
        return self._insert(rows, devices.items())

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _trial_row(workload_key: str, device_key: str, r: MeasureResult) -> dict:
    return {"workload": workload_key, "device": device_key, "config_key": r.config.key,
            "config": r.config.to_json(), "status": r.status.value,
            **{f: getattr(r, f) for f in TIME_FIELDS}, "compile_s": r.compile_s,
            "timestamp": r.timestamp, "message": r.message}


def _result(row: dict) -> MeasureResult:
    return MeasureResult(Config.from_json(row["config"]), Status(row["status"]),
                         *(row[f] for f in TIME_FIELDS), row["compile_s"], row["timestamp"], row["message"])


def _best_row(row: dict) -> BestRow:
    return BestRow(row["workload"], row["op"], row["dtype"], row["wspec"], DeviceKey.from_json(row["dspec"]),
                   _result(row), row["n"])


def _export_line(row: dict) -> dict:
    result = _result(row)
    return {"workload": {"key": row["workload"], "op": row["op"], "dtype": row["dtype"],
                         "spec": json.loads(row["wspec"])},
            "device": json.loads(row["dspec"]), "config": dict(result.config), "status": result.status.value,
            **{f: row[f] for f in TIME_FIELDS}, "compile_s": row["compile_s"], "timestamp": row["timestamp"],
            "message": row["message"]}


def _parse_line(line: str) -> tuple[dict, DeviceKey, dict]:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    w = data["workload"]
    workload = {"key": str(w["key"]), "op": str(w["op"]), "dtype": str(w["dtype"]),
                "spec": json.dumps(w["spec"], sort_keys=True, separators=(",", ":"))}
    device = DeviceKey(**data["device"])
    result = MeasureResult(Config.of(data["config"]), Status(data["status"]),
                           *(_opt_float(data.get(f)) for f in TIME_FIELDS), float(data.get("compile_s") or 0.0),
                           float(data["timestamp"]), str(data.get("message", "")))
    return workload, device, _trial_row(workload["key"], device.key, result)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
