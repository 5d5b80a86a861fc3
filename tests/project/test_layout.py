"""The package's layering, read from the source: subpackages import each other in one direction
only (records and schedules at the bottom, tuner at the top), so no import runs back up; and no
two modules import each other, directly or round a longer circle (imports inside functions too)."""
import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import tritune

ROOT = Path(tritune.__file__).parent
SUBPACKAGES = ("schedules", "records", "kernels", "cost_model", "search", "tuner")
# what each subpackage may import besides itself (kernels' backend reads records for replay)
ALLOWED = {
    "schedules": set(),
    "records": {"schedules"},
    "kernels": {"schedules", "records"},
    "cost_model": {"schedules", "records", "kernels"},
    "search": {"schedules", "records", "cost_model"},
    "tuner": {"schedules", "records", "kernels", "cost_model", "search"},
}


def imported_subpackages(path: Path) -> set[str]:
    """The tritune subpackages a module imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "tritune" and len(parts) > 1 and parts[1] in SUBPACKAGES:
                found.add(parts[1])
    return found


def test_subpackages_import_only_downwards():
    assert {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} == set(SUBPACKAGES)
    wrong = []
    for sub in SUBPACKAGES:
        for path in sorted((ROOT / sub).rglob("*.py")):
            for other in imported_subpackages(path) - ALLOWED[sub] - {sub}:
                wrong.append(f"{path.relative_to(ROOT)} imports tritune.{other}")
    assert not wrong, wrong


def test_the_allowed_graph_has_no_cycle():
    order = list(SUBPACKAGES)  # each may import only those before it
    assert all(ALLOWED[s] <= set(order[:i]) for i, s in enumerate(order))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The tritune modules a module imports (`from pkg import sub` is the submodule, not pkg)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs if len(subs) == len(node.names) else subs | {node.module}
    return found & modules


def test_no_import_circle_between_modules():
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None


def test_imports_inside_functions_count(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tritune.tuner.model import plan\n    from tritune.tuner.model.load import build\n")
    modules = {"tritune.tuner.model", "tritune.tuner.model.plan", "tritune.tuner.model.load"}
    assert imported_modules(module, modules) == {"tritune.tuner.model.plan", "tritune.tuner.model.load"}
