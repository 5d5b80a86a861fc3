"""The devices benchmark's CPU side (scripts/bench/devices_bench.py): its options, the --verbose
table it reads GPU busy from (rendered here by the CLI's own code), tune-model's device-seconds,
the kill's verdict, the final table on made-up numbers, its one line on a host without a GPU, and
the tune-model command of each model step, parsed by the CLI."""
import io

import pytest
from rich.console import Console

from scripts.bench import devices_bench as bench
from tritune.records.database import Database
from tritune.records.result import MeasureResult, Status
from tritune.tuner.breakdown import startup, summary
from tritune.tuner.cli.display import startup_table, time_table
from test_tuner import EXPR, TASK


def verbose_text(times, started=None):
    """A `run --verbose` table as the CLI prints it (wide, as the bench asks with COLUMNS), after
    its start-up table where given."""
    console = Console(file=io.StringIO(), width=200)
    if started is not None:
        console.print(startup_table(started))
    console.print("some progress line")
    console.print(time_table(times))
    return console.file.getvalue()


def test_options_default_to_every_step_and_refuse_an_unknown_one():
    args = bench.parse_args(["--out", "x.json", "--trials", "64", "--steps", "kill,run1"])
    assert args.trials == 64 and args.run_trials == 128 and args.steps == ["run1", "kill"]  # in bench order
    assert bench.parse_args(["--out", "x.json"]).steps == list(bench.STEPS)
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x.json", "--steps", "run1,run9"])


def test_gpu_busy_per_device_is_read_off_the_verbose_table():
    two = summary(10.0, {"propose": 1.0, "wait": 5.0, "check": 2.0, "timing": 8.0, "check on h:0": 1.5,
                         "timing on h:0": 6.0, "check on h:1": 0.5, "timing on h:1": 2.0}, {}, {"compile": 16.0}, 4,
                  devices=2)
    tables = bench.parse_verbose(verbose_text(two))
    assert tables == [{"wall": 10.0, "GPU busy": {"all": 0.5, "h:0": 0.75, "h:1": 0.25}, "compile pool busy": 0.4}]
    assert bench.busy_of_run(tables) == {"h:0": 0.75, "h:1": 0.25}
    one = summary(8.0, {"check": 1.0, "timing": 3.0}, {}, {"compile": 8.0}, 4)
    assert bench.busy_of_run(bench.parse_verbose(verbose_text(one))) == {"all": 0.5}
    assert bench.parse_verbose("tune-cli: no CUDA GPU found") == [] and bench.busy_of_run([]) == {}


def test_the_start_up_table_is_read_apart_from_the_runs_own():
    started = startup(1.9, 9.6, {"imported_s": 4.2, "up_s": 8.8, "answered_s": 9.5})
    text = verbose_text(summary(8.0, {"check": 1.0, "timing": 3.0}, {}, {"compile": 8.0}, 4), started)
    assert bench.parse_startup(text) == started
    assert bench.parse_verbose(text)[0]["wall"] == 8.0  # the start-up rows are not the run's
    assert bench.parse_startup("tune-cli: no CUDA GPU found") == {}


def test_tune_models_gpu_busy_is_each_devices_seconds_over_the_whole_command():
    tasks = [{"time": {"wall": 10.0, "GPU busy fraction": 0.5, "GPU busy fraction, h:0": 0.6,
                       "GPU busy fraction, h:1": 0.4}},
             {"time": {"wall": 20.0, "GPU busy fraction": 0.5}}]  # one device measured it: name unknown
    assert bench.busy_of_model({"tasks": tasks}, 40.0) == {"?": 0.25, "h:0": 0.15, "h:1": 0.1}
    assert bench.busy_of_model({}, 40.0) == {} and bench.busy_of_model({"tasks": tasks}, 0.0) == {}


@pytest.mark.system
def test_the_kill_verdict_counts_trials_lost_and_checks_the_file(tmp_path):
    db = tmp_path / "t.db"
    configs = TASK.space.sample(__import__("numpy").random.default_rng(0), 3)
    with Database(db) as d:
        d.add_workload(EXPR.key, EXPR.op, EXPR.dtype, EXPR.to_json())
        d.save(EXPR.key, TASK.device, [MeasureResult(c, Status.OK, 1.0, 1.0, 1.0, 1.0, 0.5) for c in configs])
    keys = set(bench.stored_keys(db))
    assert len(keys) == 3 and bench.stored_keys(tmp_path / "none.db") == []
    ok = bench.kill_verdict(db, keys, {"rc": 0, "stderr": ""})
    assert ok == {"host": "gpu1", "stored_before": 3, "lost": 0, "duplicates": 0, "integrity": "ok",
                  "outcome": "completed"}
    gone = bench.kill_verdict(db, keys | {"k"}, {"rc": 3, "stderr": "tune-cli: no GPU left to measure on: x\n"})
    assert gone["lost"] == 1 and gone["outcome"] == "stopped with one line"
    assert bench.kill_verdict(db, keys, {"rc": 1, "stderr": "Traceback (most recent call last):\n"})["outcome"] == \
        "FAILED badly"


def test_the_table_gives_each_step_its_speed_up_over_its_one_gpu_twin():
    results = {"run1": {"rc": 0, "seconds": 20.0, "trials": 129, "gpu_busy": {"all": 0.55}},
               "run2": {"rc": 0, "seconds": 12.5, "trials": 129, "gpu_busy": {"h:0": 0.4, "h:1": 0.38}},
               "dask1": {"rc": 0, "seconds": 30.0, "trials": 129, "gpu_busy": {}},
               "dask2": {"skipped": "this host has 1 GPU"}}
    lines = bench.table(results).splitlines()
    assert lines[0].split() == ["step", "whole", "s", "speed-up", "GPU", "busy", "per", "device", "trials", "rc"]
    assert lines[1].split() == ["run1", "20.0", "all", "55%", "129", "0"]
    assert lines[2].split() == ["run2", "12.5", "1.60x", "h:0", "40%,", "h:1", "38%", "129", "0"]
    assert lines[3].split() == ["dask1", "30.0", "n/a", "129", "0"]
    assert "skipped: this host has 1 GPU" in lines[4]
    kill = {"rc": 0, "seconds": 31.0, "trials": 129, "gpu_busy": {}, "last_line": "",
            "kill": {"host": "gpu1", "stored_before": 40, "lost": 0, "integrity": "ok", "outcome": "completed"}}
    assert bench.step_line("kill", kill) == ("kill: 31.0 s, rc 0, 129 trials stored, GPU busy n/a; killed gpu1 at "
                                             "40 stored: 0 lost, integrity ok, completed")


def test_a_host_without_a_gpu_is_one_line_and_exit_code_3(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert bench.main(["--out", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("devices_bench: no CUDA GPU on this host") and not out.exists()


def test_steps_that_need_two_gpus_or_dask_or_time_say_why_they_are_skipped():
    assert bench.why_skipped("run1", 1, 0.0, 500.0) == ""
    assert bench.why_skipped("run2", 1, 0.0, 500.0) == "this host has 1 GPU"
    assert bench.why_skipped("model1", 2, 501.0, 500.0) == "the time budget of 500 s is spent"


@pytest.mark.parametrize("name, want, unwanted", [
    ("model1", ["--no-check", "--trials 1024"], ["--devices", "--per-gpu"]),
    ("model2", ["--no-check", "--devices all"], ["--per-gpu"]),
    ("model1x2", ["--no-check", "--per-gpu 2"], ["--devices"]),
    ("check1", ["--trials 256"], ["--no-check", "--per-gpu"]),
    ("check1x2", ["--per-gpu 2", "--trials 256"], ["--no-check"]),
])
def test_each_model_step_is_a_command_tune_cli_takes(tmp_path, name, want, unwanted):
    from tritune.tuner.cli import cli

    args = bench.parse_args(["--out", "x.json", "--trials", "1024", "--model", "scripts/bench/decoders.py:llama",
                             "--decode", "16,1024,33"])
    command = bench.model_args(args, name, tmp_path / "t.db")
    assert command[:3] == ["tune-model", "--model", "scripts/bench/decoders.py:llama"]
    assert "--decode" in command and "--input-shape" not in command
    assert all(f" {words} " in f" {' '.join(command)} " for words in want)
    assert not set(unwanted) & set(command)
    cli.commands["tune-model"].make_context("tune-model", command[1:])  # the CLI parses it (SystemExit if not)
    prefill = bench.model_args(bench.parse_args(["--out", "x.json"]), name, tmp_path / "t.db")
    assert prefill[prefill.index("--input-shape") + 1] == "1,2048,2048" and "--decode" not in prefill


def test_the_one_gpu_model_steps_run_on_one_gpu_and_their_twins_on_two():
    for name in ("check1", "check1x2", "daskmodel1"):  # daskmodel1 needs dask distributed, installed here
        assert bench.why_skipped(name, 1, 0.0, 500.0) == ""
    assert bench.why_skipped("daskmodel2", 1, 0.0, 500.0) == "this host has 1 GPU"
    assert bench.TWINS["check1x2"] == "check1" and bench.TWINS["daskmodel2"] == "daskmodel1"
