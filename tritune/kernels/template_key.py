"""The template part of the device key: what a family's kernels are compiled from, not how it is written.

A stored trial is keyed on the sources that shape a family's binaries (`Family.sources` and the
shared codegen) and on the family's `template_version`. Each source enters the key as its
*compiled text*: the file with its comments, docstrings, blank lines and trailing spaces left
out. Everything else stays, character for character, so any change Python would compile
differently (code, names, string contents such as generated kernel source, indentation, line
breaks) retires the stored trials, while rewording a comment or a docstring, or adding a blank
line, keeps them. The text comes from the file itself (tokenize's comments, ast's docstring
positions), not from `ast.unparse`, whose output may change with the Python version. A developer
who wants stored trials retired without a code change (a change elsewhere that alters what the
kernels do) bumps the family's `template_version`.

Keys of tritune before this scheme hashed the files' bytes (`codegen.files_hash`);
`tritune.kernels.former_keys` carries trials stored under such a key over to today's key where
the code is the same.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import tokenize
from pathlib import Path
from typing import Iterable, Iterator

Span = tuple[int, int, int, int]  # (first row, its column, last row, its column): rows from 1, columns in characters


def template_key(version: int, texts: Iterable[str]) -> str:
    """A short hash of a template version and the compiled text of its sources, in order."""
    form = {"sources": [compiled_text(text) for text in texts], "version": version}
    canonical = json.dumps(form, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def files_key(version: int, paths: Iterable[Path]) -> str:
    """`template_key` of source files, computed once per state of the files (a replay asks for the
    device key on every lookup; parsing the sources takes tens of ms)."""
    paths = tuple(paths)
    stamps = tuple((stat.st_mtime_ns, stat.st_size) for stat in (path.stat() for path in paths))
    return _files_key(version, paths, stamps)


@functools.lru_cache(maxsize=64)
def _files_key(version: int, paths: tuple[Path, ...], stamps: tuple) -> str:
    # `stamps` (each file's mtime and size) is in the cache key: an edited file is read again
    return template_key(version, (path.read_text(encoding="utf-8") for path in paths))


def compiled_text(source: str) -> str:
    """Python source without its comments, docstrings, blank lines and trailing spaces; lines
    inside string literals are kept as they are."""
    source = source.replace("\r\n", "\n").replace("\r", "\n")  # as Python reads a source file
    lines = source.split("\n")
    tree = ast.parse(source)
    docstrings = list(_docstrings(tree))
    verbatim = _rows_ending_in_strings(tree, {id(node.value) for node in docstrings})
    cut = sorted([*(_char_span(lines, node) for node in docstrings), *_comments(source)])
    kept = _blank_out(lines, cut)
    out = [line if row in verbatim else line.rstrip() for row, line in enumerate(kept, 1)]
    return "\n".join(line for row, line in enumerate(out, 1) if row in verbatim or line)


def _docstrings(tree: ast.Module) -> Iterator[ast.Expr]:
    """The docstring statements of the module, its classes and functions."""
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        if isinstance(node, scopes) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and _is_text(first.value, str):
                yield first


def _rows_ending_in_strings(tree: ast.Module, skipped: set[int]) -> set[int]:
    """Rows whose line break lies inside a string literal (but a docstring): their text is data."""
    rows: set[int] = set()
    # an f-string's parts are covered by the f-string; their own positions differ between Pythons
    skipped = skipped | {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                         for part in ast.walk(node) if part is not node}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        literal = isinstance(node, ast.JoinedStr) or _is_text(node, (str, bytes))
        if literal and node.end_lineno > node.lineno:  # an implicit join over lines counts too: never looser
            rows.update(range(node.lineno, node.end_lineno))
    return rows


def _is_text(node: ast.AST, kinds: type | tuple[type, ...]) -> bool:
    """Whether a node is a string (or bytes) literal."""
    return isinstance(node, ast.Constant) and isinstance(node.value, kinds)


def _char_span(lines: list[str], node: ast.AST) -> Span:
    """A node's span in characters (ast counts columns in UTF-8 bytes)."""
    def column(row: int, offset: int) -> int:
        return len(lines[row - 1].encode()[:offset].decode())
    first, last = node.lineno, node.end_lineno
    return first, column(first, node.col_offset), last, column(last, node.end_col_offset)


def _comments(source: str) -> Iterator[Span]:
    """The spans of the source's comments."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield (*token.start, *token.end)


def _blank_out(lines: list[str], spans: list[Span]) -> list[str]:
    """The lines with each span's characters removed (a span over several rows leaves them empty)."""
    out = list(lines)
    for first, start, last, end in reversed(spans):  # later spans first: earlier columns stay valid
        if first == last:
            out[first - 1] = out[first - 1][:start] + out[first - 1][end:]
        else:
            out[first - 1] = out[first - 1][:start]
            out[first:last - 1] = [""] * (last - first - 1)
            out[last - 1] = out[last - 1][end:]
    return out
