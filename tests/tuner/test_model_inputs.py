"""tune-model's model and its inputs as the user names them: a factory that exits, inputs too large
to allocate and a summary over the database are each one line and exit code 2."""
from click.testing import CliRunner

from tritune.tuner.cli import cli


def tune_model(*args):
    return CliRunner().invoke(cli, ["tune-model", *args, "--dry-run"])


def test_a_factory_or_module_that_exits_is_one_line(tmp_path):
    (tmp_path / "m.py").write_text("import sys\n\ndef f():\n    raise SystemExit(7)\n\n\ndef g():\n    return 1\n")
    (tmp_path / "exits.py").write_text("raise SystemExit(5)\n\ndef f():\n    return 1\n")
    for spec, said in ((f"{tmp_path}/m.py:f", "the model factory called exit(7)"),
                       (f"{tmp_path}/exits.py:f", "called exit(5)")):
        result = tune_model("--model", spec, "--input-shape", "1,1,8")
        assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output


def test_inputs_too_large_to_allocate_are_one_line():
    result = tune_model("--model", "tests/helpers/models.py:mlp", "--input-shape", "100000000000,64")
    assert result.exit_code == 2 and "cannot allocate a 100000000000x64 fp16 input" in result.output


def test_a_summary_over_the_database_is_refused_before_any_work(tmp_path):
    db = tmp_path / "t.db"
    result = tune_model("--model", "tests/helpers/models.py:mlp", "--input-shape", "4,64", "--db", str(db),
                        "--summary-json", str(db))
    assert result.exit_code == 2 and "will not write" in result.output and not db.exists()


def test_inputs_that_do_not_fit_the_model_are_one_clear_error_and_no_log(capfd):
    import pytest
    import torch

    import tritune
    from tritune.kernels.backend.extract import ExtractError

    with pytest.raises(ExtractError, match="could not capture the model: RuntimeError"):
        tritune.extract_tasks(torch.nn.Linear(8, 4), (torch.randn(3, 5),))
    assert "Traceback" not in capfd.readouterr().err
