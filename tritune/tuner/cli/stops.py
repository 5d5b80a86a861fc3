"""How tune-cli stops: SIGTERM as Ctrl-C, a last line that says what holds of the command's work,
and child processes that stay quiet when a terminal's Ctrl-C reaches them too."""
from __future__ import annotations

import signal
import sys
from typing import Any, NoReturn

EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # 128 + the signal, as shells report them
STORED = "every measured trial is stored, a rerun resumes"
# what holds of each command's work when it is stopped (SIGINT, SIGTERM) at any moment
STOPPED = {"run": STORED, "tune-model": STORED, "best": "nothing was written",
           "export": "no file was written: the output is as it was",
           "report": "no report file was written: the folder is as it was",
           "import": "the database holds all of the file's new trials or none of them",
           "recording import": "each recording's trials are stored all or none",
           "recording": "no file was written: the output is as it was"}
WITH_CHILDREN = ("run", "tune-model", "gpu-host", "worker", "recording")  # the commands that start child processes


class Terminated(BaseException):
    """SIGTERM (timeout, systemd, Kubernetes, Slurm): stop as Ctrl-C stops."""


# the stops signalled to this command, in order. A stop's exception can be turned into another on
# its way up: a C extension that runs Python code (matplotlib drawing) reports the exception raised
# inside it as its own error ("ValueError: Invalid bounding box"); the command was still stopped.
received: list[str] = []


def terminate(signum: int, frame: Any) -> None:
    """The SIGTERM handler."""
    received.append("SIGTERM")
    raise Terminated()


def interrupt(signum: int, frame: Any) -> None:
    """The SIGINT handler: Python's own, remembered."""
    received.append("SIGINT")
    signal.default_int_handler(signum, frame)


def end(how: str) -> NoReturn:
    """Exit with the status of the stop `how` ("SIGINT": 130, "SIGTERM": 143). CPython marks the
    interpreter to end by SIGINT itself, whatever status it is asked for (under `python -m`), once a
    KeyboardInterrupt has left code run by exec() or eval() of a string, caught or not: dataclasses
    and namedtuples build their methods so, and a Ctrl-C while the CLI is imported lands there.
    Running a string clears the mark."""
    exec("None")  # noqa: S102 - clears the mark (see above)
    sys.exit(EXIT_SIGINT if how == "SIGINT" else EXIT_SIGTERM)


def _command(argv: list[str]) -> list[str]:
    """The command and subcommand in `argv` (or what stands in their place)."""
    return [word for word in argv if not word.startswith("-")][:2]


def kept(argv: list[str]) -> str:
    """'; ' and what holds of the work of the command in `argv` once it is stopped ('' if unknown)."""
    words = _command(argv)
    said = next((STOPPED[c] for c in (" ".join(words), words[0] if words else "") if c in STOPPED), None)
    return f"; {said}" if said else ""


def quiet_children(argv: list[str]) -> None:
    """For a command that starts child processes: Ctrl-C in a terminal signals the whole process
    group, and every child (compile pool, GPU workers, the model check) is started from the
    process's lasting thread (`lifeline.start_lasting`). With SIGINT blocked in that thread, each
    child starts with it blocked, held until the child's first step ignores it, instead of a
    KeyboardInterrupt traceback from a child still importing. The multiprocessing resource tracker
    is started first: the thread that starts it unblocks SIGINT."""
    words = _command(argv)
    if words and words[0] in WITH_CHILDREN:
        from multiprocessing import resource_tracker

        from tritune.tuner.worker.lifeline import start_lasting

        resource_tracker.ensure_running()
        start_lasting(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}))
