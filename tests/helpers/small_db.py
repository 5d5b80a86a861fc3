"""Small tuning databases for the tests of careful reading, writing and importing: real workload
keys and configs inside their op's space, so that what one exports imports again; and a process
that, even as root, cannot write where permissions say it cannot."""
from __future__ import annotations

import ctypes
import itertools
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tritune.kernels.family import parse_expr
from tritune.records.database import Database
from tritune.records.result import DeviceKey, MeasureResult, Status
from tritune.schedules.config import Config

GPU = DeviceKey("GPU", "9.0", "3.6", "2.11", "t")
HELPERS = Path(__file__).parent
# the Linux capabilities that let root past permissions: CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
ROOT_OVERRIDES = (1, 2, 3)
PR_CAPBSET_DROP = 24


def configs(n: int) -> list[Config]:
    """n distinct matmul configs (up to 30,375), each inside the space of any matmul."""
    grid = itertools.product((1, 2, 4), (2, 3, 4), (2, 4, 8), (16, 32, 64, 128, 256), (16, 32, 64, 128, 256),
                             (16, 32, 64, 128, 256), (1, 2, 4, 8, 16))
    return [Config.of(BLOCK_M=m, BLOCK_N=bn, BLOCK_K=k, GROUP_M=g, num_warps=w, num_stages=s, UNROLL=u)
            for (u, s, w, k, bn, m, g), _ in zip(grid, range(n))]


def store(path: Path, shapes: tuple[str, ...] = ("64",), trials: int = 3) -> Path:
    """A database of fp16 matmuls of these shapes with `trials` OK trials each (medians 0.01 ms and up)."""
    with Database(path) as db:
        for shape in shapes:
            expr = parse_expr("matmul", shape, "fp16")
            db.add_workload(expr.key, expr.op, expr.dtype, expr.to_json())
            db.save(expr.key, GPU, [MeasureResult(c, Status.OK, t, t, t, t, 1.0, 1000.0 + i)
                                    for i, c in enumerate(configs(trials)) for t in [0.01 * (1 + (i * 7) % 11)]])
    return path


def damage_row(path: Path, row: int, **columns: object) -> None:
    """Overwrite columns of one stored trial, as a damaged or hand-edited file may hold them."""
    with sqlite3.connect(path) as conn:
        for name, value in columns.items():
            conn.execute(f"UPDATE trials SET {name} = ? WHERE id = ?", [value, row])
    conn.close()


def listing(folder: Path) -> dict[str, bytes]:
    """Every file of a folder and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _drop_root_overrides() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in ROOT_OVERRIDES:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(99)


def unprivileged(code: str, *args: str) -> subprocess.CompletedProcess:
    """Python `code` (given `args`) in a process bound by file permissions (as root: without the
    capabilities that override them; exit 99 where they cannot be dropped), with tests/helpers on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120,
                          preexec_fn=_drop_root_overrides if os.geteuid() == 0 else None)
