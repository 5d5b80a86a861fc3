"""The README, docs/ and BENCHMARKS.md's current results say only what exists: every `tune-cli` /
`python -m tritune` command and option they name is one of the CLI's, every `python -m scripts...`
module exists and takes the options written after it, every repo path and `tritune.*` name they
name is there, every relative link and its anchor resolves. The README stays short.

The dated log (docs/benchmarks-log.md) is left out: its commands are as they were run, and its
header says which scripts have moved or gone since."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import click
import pytest

from tritune.tuner.cli import cli

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "docs" / "benchmarks-log.md"
README_MAX_LINES = 150
CELL_MAX_CHARS = 400
OTHER_FLAGS = {"--index-url"}  # flags of other programs written in prose (pip's)


def documents() -> dict[Path, str]:
    """Each checked document and its text: the README, docs/ without the dated log, and
    BENCHMARKS.md up to its dated log."""
    docs = {ROOT / "README.md": (ROOT / "README.md").read_text()}
    docs |= {p: p.read_text() for p in sorted((ROOT / "docs").glob("*.md")) if p != LOG}
    bench = (ROOT / "BENCHMARKS.md").read_text()
    docs[ROOT / "BENCHMARKS.md"] = bench.split("\n## The dated log")[0]
    return docs


# ---- reading commands out of markdown


def code_of(text: str) -> tuple[list[str], list[str]]:
    """The code blocks' commands (a command's continuation lines joined to it) and the inline code
    spans of a markdown text."""
    blocks, prose, fenced = [], [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            cont = blocks and (blocks[-1].endswith("\\") or re.match(r"\s{5,}[\[(-]", line))
            if cont:
                blocks[-1] = blocks[-1].rstrip("\\") + " " + line.strip()
            else:
                blocks.append(line.strip())
        else:
            prose.append(line)
    spans = [s.replace("\\|", "|") for s in re.findall(r"`([^`]+)`", "\n".join(prose))]
    return blocks, spans


SUBCOMMANDS = "run|tune-model|worker|best|report|export|import|recording"


def tritune_commands(code: list[str]) -> list[str]:
    """The tune-cli command lines in code: what follows `tune-cli` or `python -m tritune`, or a
    span that starts with a subcommand and an option (`tune-model --check`)."""
    found = []
    for text in code:
        for part in re.split(r"(?:tune-cli|python3? -m tritune)(?=\s)", text)[1:]:
            found.append(part.split("#")[0].strip())
        if re.match(rf"(?:{SUBCOMMANDS})\s+--", text):
            found.append(text)
    return found


def options_of(command: click.Command) -> set[str]:
    """Every option name a click command takes."""
    names = {"--help", "-h"}
    for param in command.params:
        names |= set(param.opts) | set(getattr(param, "secondary_opts", ()))
    return names


def check_tritune_command(line: str) -> list[str]:
    """What is wrong with one tune-cli command line: an unknown subcommand or option."""
    words = line.split()
    if not words or not re.fullmatch(r"[a-z][a-z-]*(\|[a-z-]+)*", words[0]):
        return []  # `tune-cli COMMAND --help`, or tune-cli named in passing
    errors, commands = [], []
    for name in words[0].split("|"):
        if name not in cli.commands:
            errors.append(f"tune-cli {name}: no such command")
            continue
        command = cli.commands[name]
        if isinstance(command, click.Group) and len(words) > 1 and re.fullmatch(r"[a-z|]+", words[1]):
            subs = [command.commands.get(s) for s in words[1].split("|")]
            errors += [f"tune-cli {name} {s}: no such command" for s, c in zip(words[1].split("|"), subs) if c is None]
            commands += [c for c in subs if c is not None]
        else:
            commands.append(command)
    flags = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", " ".join(words[1:])))
    if commands:
        known = set().union(*(options_of(c) for c in commands))
        errors += [f"tune-cli {words[0]}: no option {f}" for f in sorted(flags - known)]
    return errors


def every_tritune_option() -> set[str]:
    """The options of every tune-cli command and subcommand."""
    found, todo = set(), [cli]
    while todo:
        command = todo.pop()
        found |= options_of(command)
        todo += list(getattr(command, "commands", {}).values())
    return found


def check_text_options(spans: list[str]) -> list[str]:
    """Options named alone in a span (`--prior`, `--devices 0,1`): each is some command's."""
    known = every_tritune_option() | OTHER_FLAGS
    flags = {f for s in spans if s.startswith("--") for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", s)}
    return [f"no tune-cli command takes {f}" for f in sorted(flags - known)]


# ---- scripts, paths, names, links


@lru_cache(maxsize=None)
def script_options(module: str) -> frozenset[str]:
    """The options a script takes, read from its --help."""
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"python -m {module} --help failed: {out.stderr[-500:]}"
    return frozenset(re.findall(r"(?<![\w-])--[a-z][\w-]*", out.stdout)) | {"--help"}


def check_scripts(code: list[str]) -> list[str]:
    """Each `python -m scripts.x.y` module exists, and takes the options written after it; each
    dotted `scripts.x.y` named alone exists."""
    errors = []
    for text in code:
        for module, rest in re.findall(r"python3? -m (scripts(?:\.\w+)+)([^`\n]*)", text):
            path = ROOT / (module.replace(".", "/") + ".py")
            if not path.exists():
                errors.append(f"python -m {module}: no {path.relative_to(ROOT)}")
                continue
            flags = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", rest.split(" python")[0].split("#")[0]))
            if flags:
                errors += [f"python -m {module}: no option {f}" for f in sorted(flags - script_options(module))]
        for module in re.findall(r"(?<![\w./])(?<!-m )(scripts\.\w+\.\w+)", text):
            if not (ROOT / (module.replace(".", "/") + ".py")).exists():
                errors.append(f"{module}: no such module")
    return errors


PATH = re.compile(r"(?<![\w./~-])((?:scripts|tritune|tests|docs|\.ci)/[\w./*-]*)")


def check_paths(text: str) -> list[str]:
    """Each repo path the text names exists (a module may be named without its .py)."""
    errors = []
    for path in PATH.findall(text):
        path = path.rstrip(".,")
        if not ((ROOT / path).exists() or (ROOT / f"{path}.py").exists()):
            errors.append(f"{path}: no such file or folder")
    return errors


def resolves(name: str) -> bool:
    """Whether a dotted `tritune.*` name is a module or an attribute of one."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def check_names(code: list[str]) -> list[str]:
    """Each dotted `tritune.*` name in code is a module or an attribute of one."""
    names = {n for text in code for n in re.findall(r"(?<![\w./])tritune(?:\.[A-Za-z_]\w*)+", text)}
    return [f"{n}: no such module or attribute" for n in sorted(names) if not resolves(n)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def check_links(path: Path, text: str) -> list[str]:
    """Each relative markdown link resolves from the document's folder, to a heading if it names one."""
    errors = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            errors.append(f"link {target}: no such file")
        elif anchor and dest.suffix == ".md":
            heads = {slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
            if anchor not in heads:
                errors.append(f"link {target}: no such heading")
    return errors


# ---- the tests


@pytest.mark.parametrize("path", list(documents()), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_option_path_and_link_exists(path: Path) -> None:
    text = documents()[path]
    blocks, spans = code_of(text)
    code = blocks + spans
    errors = [e for line in tritune_commands(code) for e in check_tritune_command(line)]
    errors += check_text_options(spans) + check_scripts(code) + check_paths(text) + check_names(code)
    errors += check_links(path, text)
    assert not errors, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(errors)


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("path", list(documents()), ids=lambda p: str(p.relative_to(ROOT)))
def test_short_table_cells_and_no_issue_numbers(path: Path) -> None:
    text = documents()[path]
    cells = [c.strip() for line in text.split("\n") if line.startswith("|") for c in re.split(r"(?<!\\)\|", line)]
    long = [c[:60] + "..." for c in cells if len(c) > CELL_MAX_CHARS]
    assert not long, f"table cells over {CELL_MAX_CHARS} characters: {long}"
    assert not re.findall(r"\bissue \d+|(?<![\w&])#\d+\b", text), "product text names issue numbers"


def test_the_checks_catch_what_is_not_there(tmp_path: Path) -> None:
    bogus = "Run `tune-cli run --op matmul --shape 4096 --bogus-flag` or\n\n    tune-cli tune-modle --model m:f\n"
    blocks, spans = code_of(bogus)
    errors = [e for line in tritune_commands(blocks + spans) for e in check_tritune_command(line)]
    assert sorted(errors) == ["tune-cli run: no option --bogus-flag", "tune-cli tune-modle: no such command"]
    assert check_tritune_command("tune-model --model m:f --decode 16,1024 --no-check") == []
    assert check_tritune_command("recording sample|refne --n 3") == ["tune-cli recording refne: no such command"]
    assert check_text_options(["--prior", "--devices 0,1", "--no-such"]) == ["no tune-cli command takes --no-such"]
    assert check_scripts(["python -m scripts.bench.no_such --out D"]) == \
        ["python -m scripts.bench.no_such: no scripts/bench/no_such.py"]
    assert check_scripts(["python -m scripts.bench.devices_bench --out D --bogus"]) == \
        ["python -m scripts.bench.devices_bench: no option --bogus"]
    assert check_paths("see scripts/bench_tune.sh and tritune/errors") == ["scripts/bench_tune.sh: no such file or folder"]
    assert check_names(["tritune.ops.matmul", "tritune.tuner.run.tune", "tritune.no_such"]) == \
        ["tritune.no_such: no such module or attribute"]
    doc = tmp_path / "d.md"
    doc.write_text("# A heading\n[ok](#a-heading) [bad](#nope) [gone](missing.md)\n")
    assert check_links(doc, doc.read_text()) == ["link #nope: no such heading", "link missing.md: no such file"]
