"""What the user typed, checked before any work starts: each thing to fix is a UsageError, one line
and exit code 2 (the paths are checked as click parses them: `cli.paths`)."""
from __future__ import annotations

import json
import math
from typing import Any

import click

from tritune.kernels.expr import ExprError
from tritune.kernels.family import expr_from_dict, family, ops, parse_expr
from tritune.search import REGISTRY

EXIT_USAGE = 2
EXIT_NO_GPU = 3


class UsageError(click.ClickException):
    """Bad input: reported as one line, exit code 2."""

    exit_code = EXIT_USAGE


class Finite(click.FloatRange):
    """A number in a range that is finite: click's FloatRange takes 'nan', which no bound refuses."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def make_expr(op: str, shape: str, dtype: str, **options: str | None) -> Any:
    """`parse_expr`, with what the user must fix as one line and exit code 2."""
    try:
        return parse_expr(op, shape, dtype, **options)
    except (ExprError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    except RecursionError:  # a JSON epilogue nested deeper than Python's stack
        raise UsageError("bad --epilogue: nested too deeply") from None


def workload_expr(text: str) -> Any:
    """The expression of a stored workload's spec (JSON, as the database keeps it, e.g. one with a
    row-norm prologue that no --shape option expresses), with what the user must fix as one line
    and exit code 2."""
    try:
        spec = json.loads(text)
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
        return expr_from_dict(spec)
    except (ExprError, ValueError) as exc:  # json's decode error is a ValueError
        raise UsageError(f"bad --workload {text!r}: {exc}") from None
    except RecursionError:
        raise UsageError("bad --workload: nested too deeply") from None


def ops_help() -> str:
    """Each op's --shape format and options, as its family states them."""
    return "\b\nPer op (--shape and the options it takes):\n" + "\n".join(
        f"  {op}: {family(op).cli_help}" for op in ops())


def known_op(op: str | None) -> str | None:
    """An `--op` filter, checked (an unknown op is one line, exit code 2, as `run` has it)."""
    if op is not None and op not in ops():
        raise UsageError(f"unknown op {op!r}; known: {', '.join(ops())}")
    return op


def known_strategy(strategy: str) -> str:
    """A `--strategy`, checked."""
    if strategy not in REGISTRY:
        raise UsageError(f"unknown strategy {strategy!r}; known: {', '.join(sorted(REGISTRY))}")
    return strategy


# the compile pool's size, for the commands that compile candidates (`--workers`: its former name)
compile_workers_option = click.option("--compile-workers", "--workers", "workers", default=None, type=click.IntRange(1),
                                      help="compile processes [default: one per core]")


def cluster_options(command: Any) -> Any:
    """`--cluster ADDRESS` and `--cluster-wait S`, for the commands that tune."""
    command = click.option("--cluster-wait", default=30.0, show_default=True, type=Finite(0),
                           help="with --cluster: seconds to wait for a first GPU host to join")(command)
    return click.option("--cluster", default=None, metavar="ADDRESS",
                        help="measure on the GPU hosts of this Dask scheduler (tcp://HOST:8786), each started "
                             "there with `tune-cli gpu-host --scheduler ADDRESS`, instead of this host's GPUs")(command)


def devices(text: str | None) -> Any:
    """`--devices` parsed (a bad value is one line, exit code 2)."""
    from tritune.tuner.gpus.start import parse_devices

    try:
        return parse_devices(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def where(devices_text: str | None, cluster: str | None, wait_s: float) -> tuple[Any, str | None, float]:
    """Where to measure: this host's `--devices`, or the `--cluster`'s hosts (a bad address, or both
    asked for, is one line, exit code 2)."""
    if cluster is None:
        return devices(devices_text), None, wait_s
    if devices_text is not None:
        raise UsageError("--devices picks this host's GPUs; a cluster's hosts pick theirs (tune-cli gpu-host --devices)")
    return None, address(cluster), wait_s


def address(text: str) -> str:
    """A Dask scheduler's address, checked (a bad one is one line, exit code 2)."""
    from tritune.tuner.gpus.cluster import check_address

    try:
        check_address(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return text


def decode_shape(input_shapes: tuple[str, ...], decode: str | None) -> str | None:
    """tune-model's `--decode`, checked ('BATCH,CONTEXT,NEW'), or None with `--input-shape`: exactly
    one of the two is given (else one line, exit code 2)."""
    if bool(input_shapes) == (decode is not None):
        raise UsageError("give --input-shape (the model's inputs) or --decode (its generate() decode step), one of them")
    if decode is None:
        return None
    from tritune.tuner.model.decode import DecodeShape
    from tritune.tuner.model.load import ModelError

    try:
        return str(DecodeShape.parse(decode))
    except ModelError as exc:
        raise UsageError(str(exc)) from None


def planned(model_spec: str, input_shapes: tuple[str, ...], dtype: str, trials: int, decode: str | None = None) -> list:
    """A model's tasks (on inputs of `input_shapes`, or as its `decode` step) and their trials;
    anything the user must fix is one line, exit code 2."""
    from tritune.tuner.model.load import ModelError
    from tritune.tuner.model.plan import plan
    from tritune.tuner.model.subject import subject_tasks

    try:
        return plan(subject_tasks(model_spec, input_shapes, dtype, decode=decode), trials)
    except ModelError as exc:
        raise UsageError(str(exc)) from None
