"""`tune-cli carry-over`: move the trials a database holds under a former template key, measured with
today's template code, to today's key (`tritune.kernels.former_keys`)."""
from __future__ import annotations

import click

from tritune.records.database import DatabaseError
from tritune.tuner.cli.inputs import UsageError
from tritune.tuner.cli.paths import db_option, open_db


@click.command("carry-over")
@db_option
def carry_over(db_path) -> None:
    """Keep trials stored before template keys ignored comments: move those measured with today's
    template code to today's keys (nothing is deleted; run it once after upgrading)."""
    from tritune.kernels.former_keys import carry_over as carry

    open_db(db_path, must_exist=True).close()  # a missing or bad file is one line, and is never created
    with open_db(db_path) as db:
        try:
            moved = carry(db)
        except DatabaseError as exc:
            raise UsageError(str(exc)) from None
    parts = [f"{op} {n}" for op, n in moved.items() if n]
    total = sum(moved.values())
    click.echo(f"carried over {total} trial{'' if total == 1 else 's'}" + (f" ({', '.join(parts)})" if parts else ""),
               err=True)
