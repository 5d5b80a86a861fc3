"""`tune-cli recording`: write, refine, merge and import recorded spaces (real GPU timings of a
workload's configs: tritune/tuner/recordings/README.md)."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator

import click

from tritune.kernels.expr import DTYPES
from tritune.kernels.faults import FAULTS
from tritune.kernels.family import ops
from tritune.tuner.cli import inputs, paths
from tritune.tuner.cli.inputs import EXIT_NO_GPU, Finite, UsageError, make_expr
from tritune.tuner.cli.paths import db_option, open_db

@click.group()
def recording() -> None:
    """Write recorded spaces: real GPU timings of a workload's configs, the format that search is
    tested against and that warm-starts tuning (tritune/tuner/recordings/README.md)."""


@contextmanager
def _recording_errors() -> Iterator[None]:
    """A bad file, knob or part is one line and exit code 2; no GPU, exit code 3."""
    from tritune.tuner.recordings import RecordingError
    from tritune.tuner.worker.local import WorkerDied

    try:
        yield
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except WorkerDied as exc:
        click.echo(f"tune-cli: {exc}", err=True)
        sys.exit(EXIT_NO_GPU)


def _timing_options(command: Any) -> Any:
    """`--warmup-ms` and `--rep-ms`: the timing of every measurement."""
    command = click.option("--rep-ms", type=Finite(0.1), help="timed repetitions per measurement, ms")(command)
    return click.option("--warmup-ms", type=Finite(0), help="warm-up per measurement, ms")(command)


@recording.command("sample", epilog=inputs.ops_help())
@click.option("--op", default="matmul", show_default=True, help=f"operator: {', '.join(ops())}")
@click.option("--shape", default="4096", show_default=True, help="the workload's sizes, in the op's format (listed below)")
@click.option("--dtype", default="fp16", show_default=True, help=f"one of {', '.join(DTYPES)}")
@click.option("--n", "count", default=256, show_default=True, type=click.IntRange(1), help="configs to measure (all, if the space has fewer)")
@click.option("--workload", default=None, help="a stored workload's JSON spec instead of --op/--shape/--dtype")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--where", default="", help="only configs with these knob values: KNOB=V,KNOB=V")
@click.option("--faults", default="", help=f"give the first configs these faults, to check isolation: of {', '.join(FAULTS)}")
@click.option("--timeout", default=20.0, show_default=True, type=Finite(1), help="seconds before a candidate counts as hung")
@_timing_options
@click.option("--refine", default=0, show_default=True, type=click.IntRange(0), help="re-time the N fastest configs ...")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1), help="... this many more times; keep the median")
@click.option("--out", default=None, type=click.Path(dir_okay=False), callback=paths.output_file, help="the recording (.jsonl or .jsonl.gz) [default: report only]")
def recording_sample(op, shape, dtype, count, workload, seed, where, faults, timeout, warmup_ms, rep_ms, refine, repeats,
                     out) -> None:
    """Build and measure a seeded sample of a workload's space on this GPU (default timing 25 ms
    warm-up, 100 ms of repetitions); report how its times spread against torch."""
    from tritune.tuner.recordings import pipeline, write_lines
    from tritune.tuner.timing import COMPARE, Timing

    expr = inputs.workload_expr(workload) if workload else make_expr(op, shape, dtype)
    injected = [f for f in faults.split(",") if f]
    if set(injected) - set(FAULTS):
        raise UsageError(f"bad --faults {faults!r}: comma-separated names of {', '.join(FAULTS)}")
    timing = Timing(warmup_ms if warmup_ms is not None else COMPARE.warmup_ms, rep_ms or COMPARE.rep_ms)
    with _recording_errors():
        pipeline.parse_where(where)  # a malformed one is reported before the GPU starts
        sampled = pipeline.sample(expr, count, seed, where, injected, timing, timeout, refine, repeats)
        if out:
            write_lines(out, sampled.meta, sampled.rows)
    click.echo("\n".join(pipeline.describe_sample(sampled)))


@recording.command("refine")
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False), callback=paths.output_file)
@click.option("--top", default=100, show_default=True, type=click.IntRange(1), help="re-time this many of the fastest configs")
@click.option("--repeats", default=4, show_default=True, type=click.IntRange(1), help="this many more times each")
@_timing_options
def recording_refine(src, dst, top, repeats, warmup_ms, rep_ms) -> None:
    """Re-time a recording's fastest configs on this GPU and keep the median of all their runs
    (with the recording's own timing unless --warmup-ms / --rep-ms say otherwise: a GPU that
    lowers its clocks under longer runs would rank configs by when they were timed)."""
    from tritune.tuner.recordings import pipeline, read_lines, write_lines

    with _recording_errors():
        meta, rows = read_lines(src)
        meta = pipeline.refine(meta, rows, top, repeats, warmup_ms, rep_ms)
        write_lines(dst, meta, rows)
    click.echo(pipeline.describe_refine(meta, rows))


@recording.command("merge")
@click.argument("out", type=click.Path(dir_okay=False), callback=paths.output_file)
@click.argument("parts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def recording_merge(out, parts) -> None:
    """Join recordings of parts of one space (one workload, one GPU; each sampled with --where)
    into OUT, under the first part's meta line."""
    from tritune.tuner.recordings import pipeline, read_lines, write_lines

    with _recording_errors():
        meta, rows = pipeline.merge([read_lines(p) for p in parts])
        write_lines(out, meta, rows)
    click.echo(f"{len(rows)} configs from {len(parts)} parts -> {out}")


@recording.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@db_option
def recording_import(files, db_path) -> None:
    """Add recordings' trials to the tuning database, under the recorded GPU and versions
    (template 'recorded'): what `tune-cli report` and the cost model's transfer tests read."""
    from tritune.tuner.recordings import Recording, pipeline

    with _recording_errors():
        recordings = [Recording.load(p) for p in files]  # every file checked before any is stored
    with open_db(db_path) as db:
        for path, rec in zip(files, recordings):
            click.echo(f"{path}: {pipeline.to_database(db, rec)} trials")
