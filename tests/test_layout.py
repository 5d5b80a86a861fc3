"""The package's layering, read from the source: subpackages import each other in one direction
only (records and schedules at the bottom, tuner at the top), so no import runs back up."""
import ast
from pathlib import Path

import tritune

ROOT = Path(tritune.__file__).parent
SUBPACKAGES = ("schedules", "records", "kernels", "cost_model", "search", "tuner")
# what each subpackage may import besides itself (kernels' frontend reads records for replay)
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
