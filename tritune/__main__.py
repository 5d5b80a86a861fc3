"""`python -m tritune` and `tune-cli` both start here, where Ctrl-C while the CLI is imported (its
first few tenths of a second) is one line and exit code 130, as it is later."""
import sys


def main() -> None:
    """Import the CLI and run it."""
    try:
        from tritune.tuner.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("tune-cli: interrupted (SIGINT)\n")
        exec("None")  # noqa: S102 - else CPython may end by SIGINT, not 130 (see cli.stops.end)
        raise SystemExit(130) from None
    cli()


if __name__ == "__main__":
    main()
