"""tune-cli: `run` (tune one workload), `tune-model` (every workload of a model, then the whole
model checked), `gpu-host` (a GPU host of a cluster), `best`, `export`, `import`, `report`, and
`recording` and `carry-over` (their own modules). Bad input gets one line on stderr and exit code
2; no GPU, exit code 3."""
from __future__ import annotations

import copy
import json
import signal
import sys
import time
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import click

from tritune.kernels.expr import DTYPES
from tritune.kernels.faults import FAULTS
from tritune.kernels.family import ops
from tritune.records.database import Database, DatabaseError
from tritune.search import REGISTRY
from tritune.settings import SETTINGS
from tritune.tuner import breakdown
from tritune.tuner.cli import inputs, paths, stops
from tritune.tuner.cli.inputs import (EXIT_NO_GPU, EXIT_USAGE, Finite, UsageError, cluster_options,
                                      compile_workers_option, make_expr)
from tritune.tuner.cli.paths import db_option, open_db
from tritune.tuner.cli.carry import carry_over
from tritune.tuner.cli.recording import recording
from tritune.tuner.cli.stops import Terminated



@contextmanager
def reading(path: str | None) -> Iterator[Database]:
    """The tuning database, read-only, for a command that only reads: a database that fails while
    it is read (damaged pages) is one line too."""
    with open_db(path, must_exist=True) as db:
        try:
            yield db
        except DatabaseError as exc:
            raise UsageError(str(exc)) from None


@contextmanager
def tuning(db_path: str | None, options: Any, meanwhile: Any = None) -> Iterator[tuple[Any, Database]]:
    """The GPU session and the database to tune into. A bad database file is reported first and a
    missing GPU next (one line each); the database is created only once the GPU worker is up (the
    worker's start is the GPU check, or where the driver told the device's facts ahead, the session's
    start). `meanwhile` runs while the worker starts. With `verbose` options, where the start-up's
    time went is shown after the run."""
    from tritune.tuner.gpus.start import gpu_session
    from tritune.tuner.worker.local import DeviceLost, WorkerDied

    if Path(db_path or SETTINGS.db_path).exists():
        open_db(db_path, must_exist=True).close()  # a bad file is reported before anything else
    paths.writable_db(db_path)  # and one it cannot write: bad input, before the GPU check
    with ExitStack() as stack:
        before, start = breakdown.process_age_s(), time.perf_counter()
        try:
            gpu = stack.enter_context(gpu_session(options, meanwhile))
        except WorkerDied as exc:
            click.echo(f"tune-cli: {exc}", err=True)
            sys.exit(EXIT_NO_GPU)
        session_s = time.perf_counter() - start
        try:
            yield gpu, open_db(db_path)
        except DeviceLost as exc:  # every device is gone mid-run; what was measured is stored
            click.echo(f"tune-cli: no GPU left to measure on: {exc}", err=True)
            sys.exit(EXIT_NO_GPU)
        if options.verbose:
            _show_startup(gpu[0], before, session_s)


def _show_startup(runner: Any, before_s: float | None, session_s: float) -> None:
    """Print where the start-up's time went (`breakdown.startup`): this process before its
    session, the session's start and its moments, as far as the first GPU worker reported them
    (after the run: a run may start before its worker has answered)."""
    from tritune.tuner.cli import display
    from tritune.tuner.gpus.start import timeline

    first = runner.each[0]  # a cluster's hosts report no start-up of their own
    session = getattr(first, "session", None)
    moments = timeline(dict(first.startup), session[0], **session[1]) if session else getattr(first, "startup", {})
    display.out.print(display.startup_table(breakdown.startup(before_s, session_s, moments)))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """tritune: autotune Triton kernels, store the best configs, replay them."""


@cli.command(epilog=inputs.ops_help())
@click.option("--op", default="matmul", show_default=True, help=f"operator: {', '.join(ops())}")
@click.option("--shape", required=True, help="the workload's sizes, in the op's format (listed below)")
@click.option("--dtype", default="fp16", show_default=True, help=f"one of {', '.join(DTYPES)}")
@click.option("--layout", default=None, help="matmul/bmm operand layouts: nn (default), nt, tn, tt")
@click.option("--epilogue", default=None, help="fused elementwise steps, e.g. 'scale=0.5,bias,gelu_tanh,residual' (grammar per op below)")
@click.option("--stride", default=None, help="conv2d: S or SH,SW")
@click.option("--padding", default=None, help="conv2d: P or PH,PW")
@click.option("--dilation", default=None, help="conv2d: D or DH,DW")
@click.option("--eps", default=None, help="layernorm: the epsilon [default: 1e-5]")
@click.option("--activation", default=None, help="gated: the gate's activation, silu (SwiGLU, default), gelu or gelu_tanh (GeGLU)")
@click.option("--group", default=None, help="attention: query heads per key/value head (grouped-query attention) [default: 1]")
@click.option("--rope", default=None, help="attention: q and k rotated by rotary embeddings on their first R lanes [default: 0]")
@click.option("--trials", default=128, show_default=True, type=click.IntRange(1), help="measurements in total for this workload")
@click.option("--strategy", default="sa", show_default=True, help=f"one of {', '.join(sorted(REGISTRY))}")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--prior", default="all", show_default=True, type=click.Choice(["all", "db", "none"]),
              help="what warm-starts the cost model: the database's other workloads on this GPU and the "
                   "measurements shipped for its generation (all), only the database (db), nothing (none)")
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(1), help="candidates per round")
@click.option("--early-stop", default=None, type=click.IntRange(1), help="stop after this many trials without a new best")
@click.option("--timeout", default=30.0, show_default=True, type=Finite(1), help="seconds before a candidate counts as hung")
@compile_workers_option
@click.option("--devices", default=None, help="GPUs to measure on, e.g. 0,1 or all (one worker each) [default: the first]")
@cluster_options
@click.option("--summary-json", default=None, type=click.Path(dir_okay=False), callback=paths.output_file,
              help="also write the final numbers here")
@click.option("--verbose", is_flag=True, help="also show where the run's time went (it is in --summary-json too)")
@click.option("--inject-fault", "faults", multiple=True, type=click.Choice(FAULTS), hidden=True)
@db_option
def run(op, shape, dtype, layout, epilogue, stride, padding, dilation, eps, activation, group, rope, trials, strategy, seed,
        prior, batch_size, early_stop, timeout, workers, devices, cluster, cluster_wait, summary_json, verbose, faults,
        db_path) -> None:
    """Tune one workload on this GPU and store every trial."""
    from tritune.tuner.cli.display import Terminal
    from tritune.tuner.gpus.start import TuneOptions
    from tritune.tuner.run import tune

    expr = make_expr(op, shape, dtype, layout=layout, epilogue=epilogue, stride=stride, padding=padding,
                     dilation=dilation, eps=eps, activation=activation, group=group, rope=rope)
    inputs.known_strategy(strategy)
    options = TuneOptions(trials, strategy, seed, batch_size, early_stop, timeout, workers, tuple(faults), prior, verbose,
                          *inputs.where(devices, cluster, cluster_wait))
    if summary_json:
        paths.not_the_database([summary_json], db_path)
    with tuning(db_path, options) as (gpu, db):
        summary = tune(expr, db, options, gpu, report=Terminal())
    if summary_json:
        with paths.output(summary_json, db_path) as fp:
            fp.write(json.dumps(summary, indent=2))


@cli.command("tune-model")
@click.option("--model", "model_spec", required=True, help="pkg.module:factory or path/to/file.py:factory (returns a torch.nn.Module)")
@click.option("--input-shape", "input_shapes", multiple=True, help="shape of each model input, in order, e.g. 1,2048,4096")
@click.option("--decode", default=None, metavar="BATCH,CONTEXT[,NEW]",
              help="instead of --input-shape: the decode step transformers' generate() compiles with a static cache, "
                   "for BATCH prompts of CONTEXT tokens and NEW more tokens [default: 256] (a causal LM's factory)")
@click.option("--dtype", default="fp16", show_default=True, help=f"model and input dtype: one of {', '.join(DTYPES)}")
@click.option("--trials", default=256, show_default=True, type=click.IntRange(1), help="trials in total, shared by the model's workloads")
@click.option("--strategy", default="sa", show_default=True, help=f"one of {', '.join(sorted(REGISTRY))}")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--summary-json", default=None, type=click.Path(dir_okay=False), callback=paths.output_file,
              help="also write each task's numbers here")
@click.option("--devices", default=None, help="GPUs to measure on, e.g. 0,1 or all (one worker each) [default: the first]")
@click.option("--per-gpu", default=1, show_default=True, type=click.IntRange(1, 8),
              help="workloads tuned at once on each GPU, a worker each, taking turns at the GPU's timed work "
                   "(one workload's loop leaves its GPU idle while it proposes and compiles)")
@cluster_options
@click.option("--dry-run", is_flag=True, help="only list the workloads and their trials (no GPU needed)")
@click.option("--check/--no-check", default=True, show_default=True,
              help="then time the whole compiled model with and without the tuned kernels (default mode and CUDA "
                   "graphs); a graph that is not faster with them is left to Inductor whole")
@click.option("--verbose", is_flag=True, help="also show where each task's time went, and the start-up's")
@db_option
def tune_model(model_spec, input_shapes, decode, dtype, trials, strategy, seed, summary_json, devices, per_gpu,
               cluster, cluster_wait, dry_run, check, verbose, db_path) -> None:
    """Extract a model's contractions (with their fusable epilogues) and tune each on this GPU."""
    from tritune.tuner.cli import display
    from tritune.tuner.gpus.start import TuneOptions
    from tritune.tuner.model.plan import tune_planned

    inputs.known_strategy(strategy)
    decode = inputs.decode_shape(input_shapes, decode)
    if summary_json:
        paths.not_the_database([summary_json], db_path)
    if dry_run:
        display.out.print(display.plan_table(inputs.planned(model_spec, input_shapes, dtype, trials, decode)))
        return
    where = inputs.where(devices, cluster, cluster_wait)
    if cluster and per_gpu > 1:
        raise UsageError("--per-gpu sets this host's workers; a cluster's hosts measure as they are started")
    options = TuneOptions(strategy=strategy, seed=seed, devices=where[0], cluster=where[1], cluster_wait_s=where[2],
                          verbose=verbose, per_gpu=per_gpu)
    planned: list = []
    capture = lambda: planned.extend(inputs.planned(model_spec, input_shapes, dtype, trials, decode))  # noqa: E731
    if check and cluster:  # the check compiles and runs the whole model on a GPU of this host
        click.echo("tune-cli: the model check runs on this host's GPU; skipped with --cluster", err=True)
    with ExitStack() as stack:
        early = stack.enter_context(_early_check(model_spec, input_shapes, decode, dtype, db_path)) \
            if check and not cluster and not SETTINGS.fake_gpu else None
        with tuning(db_path, options, capture) as (gpu, db):  # the model is captured while the GPU worker starts
            display.out.print(display.plan_table(planned))
            summaries = tune_planned(planned, db, options, gpu, display.Terminal(), _announce)
            if early is not None:  # every verdict is stored: its compiles need not wait for the session's end
                early.compile_now()
        display.out.print(display.result_table(summaries))
        checks = _check_model(early) if early is not None else _no_check(check and not cluster)
    if summary_json:
        with paths.output(summary_json, db_path) as fp:
            fp.write(json.dumps({"tasks": summaries, "model_check": checks}, indent=2))


def _early_check(spec: str, input_shapes: tuple[str, ...], decode: str | None, dtype: str, db_path: Any) -> Any:
    """The whole-model check's process, started before the tuning (`model.check.EarlyCheck`)."""
    from tritune.tuner.model.check import EarlyCheck

    return EarlyCheck(spec, input_shapes, dtype, db_path or SETTINGS.db_path, decode=decode)


def _announce(i: int, n: int, planned: Any, trials: int) -> None:
    """A task of the model starts."""
    from tritune.tuner.cli.display import console

    console.print(f"[bold]task {i}/{n}[/bold]: {planned.task.describe()}, {trials} trials")


def _check_model(early: Any) -> list[dict]:
    """The whole model compiled with and without its tuned kernels, timed in each mode (the early
    check's process goes on now); graph verdicts stored; the table printed; the per-mode results."""
    from tritune.tuner.cli.display import check_table, console, out

    console.print("[bold]checking the whole model[/bold]: compiled by Inductor, with and without the tuned kernels")
    results = early.finish()
    out.print(check_table(results))
    return results


def _no_check(asked: bool) -> list[dict]:
    """Where the check was asked for on a stand-in GPU, say it is skipped."""
    if asked:
        from tritune.tuner.cli.display import console

        console.print("the whole-model check needs a real GPU: skipped")
    return []


@cli.command("gpu-host")
@click.option("--scheduler", required=True, metavar="ADDRESS", help="the Dask scheduler to serve (tcp://HOST:8786)")
@click.option("--devices", default="all", show_default=True, help="this host's GPUs to measure on, e.g. 0,1 or all")
@click.option("--name", default=None, help="this host's name in the cluster and in the records [default: hostname]")
@click.option("--timeout", default=30.0, show_default=True, type=Finite(1), help="seconds before a candidate counts as hung")
@compile_workers_option
def gpu_host(scheduler, devices, name, timeout, workers) -> None:
    """Measure for tune-cli runs on a cluster: this host's GPUs and compile pool, until stopped."""
    from functools import partial

    from tritune.tuner.gpus.cluster_host import serve
    from tritune.tuner.gpus.start import start_gpu
    from tritune.tuner.worker.local import WorkerDied

    start = partial(start_gpu, timeout_s=timeout, workers=workers, devices=inputs.devices(devices))
    try:
        serve(inputs.address(scheduler), start, name, lambda line: click.echo(line, err=True))
    except WorkerDied as exc:  # no GPU here, or no scheduler there
        click.echo(f"tune-cli: {exc}", err=True)
        sys.exit(EXIT_NO_GPU)


@cli.command()
@click.option("--op", default=None, help="only this operator")
@db_option
def best(op, db_path) -> None:
    """List the best stored config of every workload and device."""
    from tritune.tuner.cli.display import best_table, out

    op = inputs.known_op(op)
    with reading(db_path) as db:
        out.print(best_table(db.best_rows(op)))


@cli.command("export")
@click.option("--out", "out_path", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              callback=paths.output_file, help="JSONL file ('-' = stdout)")
@db_option
def export_(out_path, db_path) -> None:
    """Write every stored trial as JSON lines (the file is put in place once complete)."""
    with reading(db_path) as db, paths.output(out_path, db_path) as fp:
        n = db.export_jsonl(fp)
    click.echo(f"exported {_trials(n)}", err=True)


@cli.command("import")
@click.argument("src", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@db_option
def import_(src, db_path) -> None:
    """Add trials from a JSONL file (all or nothing; stored configs are kept), each checked first."""
    from tritune.records.files import not_a_regular_file
    from tritune.records.jsonl import parse_lines
    from tritune.tuner.cli.imports import check_trial

    name, unreadable = ("stdin", None) if src == "-" else (src, not_a_regular_file(src))
    if unreadable:  # a FIFO would wait for a writer
        raise UsageError(f"cannot import {src}: {unreadable}")
    try:
        with click.open_file(src, "rb") as fp:  # bytes: a line that is not UTF-8 is named
            parsed = parse_lines(fp, check_trial)  # the whole file is checked before the database is opened
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot import {name}: {getattr(exc, 'strerror', None) or exc}") from None
    with open_db(db_path) as db:
        try:
            n = db.import_trials(parsed)
        except DatabaseError as exc:
            raise UsageError(str(exc)) from None
    click.echo(f"imported {_trials(n, 'new ')}", err=True)


def _trials(n: int, kind: str = "") -> str:
    """'1 trial', '2 trials'."""
    return f"{n} {kind}trial{'' if n == 1 else 's'}"


@cli.command()
@click.option("--op", default=None, help="only this operator")
@click.option("--out", "out_dir", default="tritune-report", show_default=True, type=click.Path(file_okay=False),
              callback=paths.output_dir)
@click.option("--min-trials", default=32, show_default=True, type=click.IntRange(8), help="skip workloads with fewer")
@click.option("--folds", default=5, show_default=True, type=click.IntRange(2))
@db_option
def report(op, out_dir, min_trials, folds, db_path) -> None:
    """How well the cost model ranks the stored trials: table, report.json, report.html."""
    from rich.console import Console

    from tritune.cost_model import report as rep
    from tritune.tuner.cli.display import out

    op = inputs.known_op(op)
    paths.not_the_database([Path(out_dir) / name for name in rep.FILES], db_path)
    with reading(db_path) as db:
        try:
            result, sets, scores = rep.build(db, op, min_trials, folds)
        except rep.ReportError as exc:
            raise UsageError(str(exc)) from None
        Console(width=max(out.width, 130)).print(rep.table(result))  # ten columns: never squeeze them
        try:
            written = rep.write(result, sets, scores, Path(out_dir))
        except OSError as exc:
            raise UsageError(f"cannot write the report in {out_dir}: {exc.strerror or exc}") from None
    click.echo(f"wrote {', '.join(str(p) for p in written)}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning usage errors into one line and exit code 2. SIGINT and
    SIGTERM stop a command at once (a run's measured trials are already stored; the children are
    stopped on the way out) with exit codes 130 and 143 and a line that says what was kept."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    argv = sys.argv[1:] if argv is None else argv
    stops.received.clear()
    try:
        signal.signal(signal.SIGTERM, stops.terminate)
        if previous[signal.SIGINT] is signal.default_int_handler:  # not where the caller ignores it
            signal.signal(signal.SIGINT, stops.interrupt)
        stops.quiet_children(argv)
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
        cli.main(args=argv, prog_name="tune-cli", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _stopped(argv, "SIGINT")
    except Terminated:
        _stopped(argv, "SIGTERM")
    except DatabaseError as exc:  # a write refused mid-run: a full disk, a read-only file
        click.echo(f"tune-cli: {exc}; the run stopped, the trials stored before are kept", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        click.echo(f"tune-cli: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception:
        if not stops.received:
            raise
        _stopped(argv, stops.received[0])  # the stop came back as another error (see `stops.received`)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stopped(argv: list[str], how: str) -> None:
    """A command stopped by SIGINT or SIGTERM: one line saying what was kept, and the exit code."""
    said = "interrupted" if how == "SIGINT" else "terminated"
    click.echo(f"tune-cli: {said} ({how}){stops.kept(argv)}", err=True)
    stops.end(how)


cli.add_command(recording)
# `tune-cli worker`, the GPU host's former name, still starts one (unlisted: "worker" also meant
# the GPU worker processes and the compile pool's)
cli.add_command(copy.copy(gpu_host), "worker")
cli.commands["worker"].hidden = True
cli.add_command(carry_over)
