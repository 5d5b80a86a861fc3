"""tune-cli report from recorded H100 trials: files written, JSON consistent with the table, clear errors."""
import json
from pathlib import Path

import pytest

from tritune.cost_model import report
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.schedules.config import Config
from tritune.tuner.cli import main
from tritune.tuner.recordings import Recording
from tritune.tuner.recordings.pipeline import to_database

SPACES = Path(__file__).parents[1] / "fixtures" / "spaces" / "legacy"


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "t.db"
    with Database(path) as db:
        # two plain-tiling recordings from one device (H100), so held-out transfer between them is measured
        for name in ("space_3000x5000x1000_plain_fp16.jsonl.gz", "space_4096_plain_fp16.jsonl.gz"):
            to_database(db, Recording.load(SPACES / name))
        for row in db.best_rows():  # a tuning run stores the library call beside the schedules
            db.save(row.workload_key, row.device, [MeasureResult(Config.of(library="mm"), Status.OK, *[0.1] * 4)])
    return path


@pytest.mark.system
def test_report_numbers_files_and_table_agree(db_path, tmp_path):
    with Database(db_path) as db:
        result, sets, scores = report.build(db, "matmul", folds=3, repeats=1, sizes=(16, 64))
    assert set(result["workloads"]) == {"matmul 3000x5000x1000 fp16 NN", "matmul 4096x4096x4096 fp16 NN"}
    big = result["workloads"]["matmul 4096x4096x4096 fp16 NN"]
    assert big["trials"] == 1018 and big["cross_validation"]["spearman"] > 0.9  # real H100 data
    assert set(big["learning_curve"]) == {"16", "64"}
    assert len(result["transfer"]["matrix"]) == 2 and set(result["transfer"]["held_out"]) == set(result["workloads"])
    paths = report.write(result, sets, scores, tmp_path)
    assert {p.name for p in paths} == {"report.json", "report.html", "scatter.png", "learning_curve.png",
                                       "transfer.png", "convergence.png"}
    assert all(p.stat().st_size > 1000 for p in paths)
    assert json.loads((tmp_path / "report.json").read_text()) == report.clean(result)
    assert big["cross_validation"]["failure_auc"] != big["cross_validation"]["failure_auc"]  # no failures: nan
    assert json.loads((tmp_path / "report.json").read_text())["workloads"]["matmul 4096x4096x4096 fp16 NN"][
        "cross_validation"]["failure_auc"] is None
    from rich.console import Console

    console = Console(record=True, width=250)
    console.print(report.table(result))
    text = console.export_text()
    assert f"{big['cross_validation']['spearman']:.3f}" in text
    assert f"{result['transfer']['held_out']['matmul 4096x4096x4096 fp16 NN']['spearman']:.3f}" in text
    page = (tmp_path / "report.html").read_text()
    assert all(f'src="{p.name}"' in page for p in paths if p.suffix == ".png")


def cli(capsys, *args):
    with pytest.raises(SystemExit) as info:
        main(list(args))
        raise SystemExit(0)
    return info.value.code, capsys.readouterr().err


def test_report_errors_are_one_line(db_path, tmp_path, capsys):
    code, err = cli(capsys, "report", "--db", str(db_path), "--op", "conv2d", "--out", str(tmp_path))
    assert code == 2 and "no workloads of op 'conv2d'" in err and err.count("\n") == 1
    code, err = cli(capsys, "report", "--db", str(db_path), "--min-trials", "5000", "--out", str(tmp_path))
    assert code == 2 and "5000 or more trials" in err
    Database(tmp_path / "empty.db").close()
    code, err = cli(capsys, "report", "--db", str(tmp_path / "empty.db"), "--out", str(tmp_path))
    assert code == 2 and "no workload" in err
    bad = tmp_path / "bad.db"
    bad.write_text("not a database")
    code, err = cli(capsys, "report", "--db", str(bad), "--out", str(tmp_path))
    assert code == 2 and "not" in err and err.count("\n") == 1


@pytest.mark.system
def test_transfer_never_mixes_ops_whose_features_differ():
    import numpy as np

    from tritune.cost_model.evaluate import Dataset, transfer
    from tritune.cost_model.xgb import XGBCostModel
    from tritune.kernels.contraction.expr import Matmul
    from tritune.kernels.rows.expr import Softmax

    rng = np.random.default_rng(0)

    def fake(expr, width):
        X = rng.random((40, width)).astype(np.float32)
        return Dataset(expr, "dev", X, X[:, 0], np.ones(40, bool), 1 / (X[:, 0] + 1))

    sets = [fake(Matmul(64, 64, 64), 5), fake(Matmul(32, 64, 64), 5), fake(Softmax(64, 64), 3)]
    result = transfer(sets, lambda: XGBCostModel(n_estimators=10))
    assert np.isnan(result["matrix"][0][2]) and np.isnan(result["matrix"][2][0])
    assert result["matrix"][0][1] > 0.5  # same op: the ordering transfers
    assert set(result["held_out"]) == {sets[0].name, sets[1].name}  # softmax has no other softmax to learn from
