"""Carrying stored trials from one template key to another: the SQL of `Database.carry_over`.

A device key names the template its trials were measured with (`DeviceKey.template`). Where the
way that key is computed changes but the template's code does not, the trials stored under the
former key still describe today's kernels; carrying them over moves them to the device key with
today's template. Nothing is deleted: a trial whose config is stored under the new key already
stays where it was (the new key keeps its own measurement, as an import does), and the former
device rows stay.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from typing import Mapping

from tritune.records.result import DeviceKey

_OF_OP = "workload IN (SELECT key FROM workloads WHERE op = ?)"


def carry_over(conn: sqlite3.Connection, op: str, templates: Mapping[str, str], graphs: bool) -> int:
    """Move the trials and verdicts of an op's workloads from every device whose template is a key of
    `templates` to the same device under the mapped template (and its graph verdicts where `graphs`);
    returns how many trials moved. The caller holds the write transaction."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    moved = 0
    for old, new in _moves(conn, templates):
        conn.execute("INSERT OR IGNORE INTO devices (key, spec) VALUES (?, ?)", [new.key, new.to_json()])
        before = conn.total_changes
        conn.execute(f"UPDATE OR IGNORE trials SET device = ? WHERE device = ? AND {_OF_OP}", [new.key, old, op])
        moved += conn.total_changes - before
        if "verdicts" in tables:
            conn.execute(f"UPDATE OR IGNORE verdicts SET device = ? WHERE device = ? AND {_OF_OP}", [new.key, old, op])
        if graphs and "graph_verdicts" in tables:
            conn.execute("UPDATE OR IGNORE graph_verdicts SET device = ? WHERE device = ?", [new.key, old])
    return moved


def _moves(conn: sqlite3.Connection, templates: Mapping[str, str]) -> list[tuple[str, DeviceKey]]:
    """(stored device key, the device under its new template) of every device row to carry over; a
    row whose spec does not parse is left alone."""
    moves = []
    for key, spec in conn.execute("SELECT key, spec FROM devices ORDER BY key").fetchall():
        try:
            device = DeviceKey.from_json(spec)
        except (ValueError, TypeError):
            continue
        if device.template in templates and templates[device.template] != device.template:
            moves.append((key, replace(device, template=templates[device.template])))
    return moves
