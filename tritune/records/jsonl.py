"""The JSONL form of stored trials (`tune-cli export` / `import`): one self-contained line per trial."""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable, Tuple

from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config

TIMES = ("t_min", "t_p20", "t_median", "t_p80")
_NUMBERS = (*TIMES, "compile_s", "timestamp")
# one parsed line: (workload row: key, op, dtype, spec JSON), device, result, whether it won its head-to-head
Trial = Tuple[Tuple[str, str, str, str], DeviceKey, MeasureResult, bool]


def trial_line(row: Any, won: bool) -> str:
    """One stored trial (a row of trials joined with its workload and device) as a JSON line; the
    winner of its workload's head-to-head is marked `"verdict": true`. ValueError for a damaged row
    (JSON that does not parse, an unknown status, a time that is not one)."""
    _require(row["status"] in Status._value2member_map_, f"unknown status {row['status']!r}")
    _check_times({name: row[name] for name in _NUMBERS})
    line = {"workload": {"key": row["workload"], "op": row["op"], "dtype": row["dtype"],
                         "spec": json.loads(row["workload_spec"])},
            "device": json.loads(row["device_spec"]), "config": json.loads(row["config"]),
            "status": row["status"], **{t: row[t] for t in TIMES},
            "compile_s": row["compile_s"], "timestamp": row["timestamp"], "message": row["message"]}
    if row.get("measured_on"):  # absent from databases (and exports) made before it
        line["measured_on"] = row["measured_on"]
    if won:
        line["verdict"] = True
    return json.dumps(line)


def parse_lines(lines: Iterable[str | bytes], check: Callable[[Trial], None] | None = None) -> list[Trial]:
    """Every trial of a JSONL export (text or bytes lines; blank lines skipped); ValueError names
    the first bad line. `check` may refuse a parsed trial too (a ValueError saying why)."""
    parsed = []
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"bad trial on line {number}: not UTF-8 text") from None
        if line.strip():
            parsed.append(parse_line(line, number, check))
    return parsed


def parse_line(text: str, number: int, check: Callable[[Trial], None] | None = None) -> Trial:
    """One JSONL line as (workload row, device, result, whether it won its head-to-head); any flaw
    (or one `check` finds) names the line."""
    try:
        trial = _parse(text)
        if check is not None:
            check(trial)
        return trial
    except RecursionError:  # JSON nested deeper than Python's stack
        raise ValueError(f"bad trial on line {number}: nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        raise ValueError(f"bad trial on line {number}: {exc}") from None


def checked(result: MeasureResult) -> MeasureResult:
    """The result, if its times are numbers that are finite and not negative; else ValueError naming
    the first that is not."""
    _check_times({name: getattr(result, name) for name in _NUMBERS})
    return result


def _check_times(values: dict) -> None:
    for name, value in values.items():
        _require(value is None or _time(value), f"{name} is {value!r}: a time is a finite number, not below zero")


def _time(value: Any) -> bool:
    """Whether a value is a time: a finite number, not below zero."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    except OverflowError:  # an integer too large for a float
        return False


def _parse(text: str) -> Trial:
    """One JSONL line as a trial; ValueError for any flaw."""
    data = json.loads(text)
    _require(isinstance(data, dict), "not a JSON object")
    workload, device, config = (_field(data, name, dict) for name in ("workload", "device", "config"))
    spec = json.dumps(_field(workload, "spec", dict), separators=(",", ":"))  # key order kept as exported
    row = (*(_field(workload, name, str) for name in ("key", "op", "dtype")), spec)
    _require(all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in config.values()),
             "config values must be integers or strings")
    status = _field(data, "status", str)
    _require(status in Status._value2member_map_, f"unknown status {status!r}")
    times = [_field(data, t, (int, float, type(None))) for t in TIMES]
    result = MeasureResult(Config.of(config), Status(status), *times, _field(data, "compile_s", (int, float)),
                           _field(data, "timestamp", (int, float)), _field(data, "message", str),
                           _field(data, "measured_on", str) if "measured_on" in data else "")
    device_key = DeviceKey(**{k: _field(device, k, str) for k in DeviceKey.__dataclass_fields__})
    return row, device_key, checked(result), data.get("verdict") is True


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _field(data: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    _require(name in data, f"missing field {name!r}")
    value = data[name]
    _require(isinstance(value, kind) and not isinstance(value, bool), f"field {name!r} has the wrong type")
    return value
