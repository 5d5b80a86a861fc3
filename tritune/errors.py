"""The project's one error formatter: user code, torch and Triton raise anything, often with pages
of text; what a table, a stored result or a one-line CLI message shows is its first line."""
from __future__ import annotations

LIMIT = 300  # torch's messages can list hundreds of names on their first line


def first_line(exc: BaseException, typed: bool = True) -> str:
    """'TypeName: first line of the message' (or the first line alone, `typed=False`), at most LIMIT characters."""
    text = next(iter(str(exc).strip().splitlines()), "")
    if not typed:
        return (text or type(exc).__name__)[:LIMIT]
    return f"{type(exc).__name__}: {text}"[:LIMIT]
