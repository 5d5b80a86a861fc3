"""The tuning database's SQL: its schema, the tables created on first use, and its longer queries."""
from __future__ import annotations

SCHEMA_VERSION = 1

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (
    key TEXT PRIMARY KEY, op TEXT NOT NULL, dtype TEXT NOT NULL, spec TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS devices (key TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload TEXT NOT NULL REFERENCES workloads(key),
    device TEXT NOT NULL REFERENCES devices(key),
    config_key TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL,
    t_min REAL, t_p20 REAL, t_median REAL, t_p80 REAL,
    compile_s REAL NOT NULL DEFAULT 0, timestamp REAL NOT NULL, message TEXT NOT NULL DEFAULT '',
    measured_on TEXT NOT NULL DEFAULT '');
CREATE UNIQUE INDEX IF NOT EXISTS trials_config ON trials (workload, device, config_key);
CREATE INDEX IF NOT EXISTS trials_status ON trials (workload, device, status);
INSERT OR IGNORE INTO meta (name, value) VALUES ('schema_version', '{SCHEMA_VERSION}');
"""
# Which tuner is measuring which config right now (rows live only while a measurement does), so
# that tuners sharing a database never measure one config twice. Created on first use: commands
# that only read never write, and older databases gain it without a migration.
CLAIMS = """
CREATE TABLE IF NOT EXISTS claims (
    workload TEXT NOT NULL, device TEXT NOT NULL, config_key TEXT NOT NULL,
    owner TEXT NOT NULL, since REAL NOT NULL, PRIMARY KEY (workload, device, config_key))
"""

# The verdict of a tuned workload's final head-to-head (its best against the library calls, timed in
# turns with long runs): which stored config replay runs. Created on first use, like claims.
VERDICTS = """
CREATE TABLE IF NOT EXISTS verdicts (
    workload TEXT NOT NULL, device TEXT NOT NULL, winner TEXT NOT NULL, detail TEXT NOT NULL,
    timestamp REAL NOT NULL, PRIMARY KEY (workload, device))
"""
# Whether a whole compiled graph ran faster with its tuned kernels than Inductor without them, in one
# torch.compile mode (measured by tune-model on the model; `graph` is the backend's signature).
GRAPH_VERDICTS = """
CREATE TABLE IF NOT EXISTS graph_verdicts (
    graph TEXT NOT NULL, device TEXT NOT NULL, mode TEXT NOT NULL, winner TEXT NOT NULL, detail TEXT NOT NULL,
    timestamp REAL NOT NULL, PRIMARY KEY (graph, device, mode))
"""
# Which GPU measured each trial ("host:index"): a column that databases made before it gain on their
# first write of a trial (older tritunes name their columns and leave it at its default).
MEASURED_ON = "ALTER TABLE trials ADD COLUMN measured_on TEXT NOT NULL DEFAULT ''"

# The trials that compete to be the best: correct and timed, and not damaged (a time that is text or
# below zero, a config that is not JSON): a damaged row must not hide the valid best behind it
_NUMBER = "(typeof({0}) IN ('real', 'integer') AND {0} >= 0)"
TIMED = " AND ".join(["status = 'OK'", "json_valid(config)",
                      *(_NUMBER.format(c) for c in ("t_median", "compile_s", "timestamp")),
                      *(f"({c} IS NULL OR {_NUMBER.format(c)})" for c in ("t_min", "t_p20", "t_p80"))])
# How the best trial is chosen: the verdict's winner where there is one, else the lowest median.
ORDER = "t_median, t.id"
ORDER_WITH_VERDICTS = ("COALESCE(t.config_key = (SELECT winner FROM verdicts v WHERE v.workload = t.workload "
                       "AND v.device = t.device), 0) DESC, " + ORDER)

# The best OK trial of every (workload, device), with the count of all its trials.
BEST_ROWS = """
WITH ranked AS (
    SELECT t.*, ROW_NUMBER() OVER (PARTITION BY workload, device ORDER BY {order}) AS pos
    FROM trials t WHERE {timed}),
counts AS (SELECT workload, device, COUNT(*) AS n FROM trials GROUP BY workload, device)
SELECT r.*, w.op, w.dtype, w.spec AS workload_spec, d.spec AS device_spec, c.n AS n_trials
FROM ranked r
JOIN workloads w ON w.key = r.workload
JOIN devices d ON d.key = r.device
JOIN counts c ON c.workload = r.workload AND c.device = r.device
WHERE r.pos = 1 AND (:op IS NULL OR w.op = :op)
ORDER BY w.op, w.dtype, w.created, w.key, r.device
"""

EXPORT = """
SELECT t.*, w.op, w.dtype, w.spec AS workload_spec, d.spec AS device_spec
FROM trials t JOIN workloads w ON w.key = t.workload JOIN devices d ON d.key = t.device
ORDER BY t.id
"""
