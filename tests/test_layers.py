"""The top-level areas import one way only: graphs < evals < serving < training < cli.

Every module of every area is parsed (not imported) and every import is checked, at any depth:
module level, inside functions (lazy imports), relative imports, and `importlib.import_module("...")`
with a literal name. A module may import its own area and any lower one, never a higher one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["graphs", "evals", "serving", "training", "cli"]  # lowest first
RANK = {area: i for i, area in enumerate(LAYERS)}

# Known violations: (module file, higher area it imports); none today. An entry that no longer matches an
# import fails the test, so the list can only shrink.
ALLOWED: set[tuple[str, str]] = set()


def _modules() -> list[Path]:
    return sorted(p for area in LAYERS for p in (ROOT / area).rglob("*.py"))


def _module_name(path: Path) -> list[str]:
    """`training/warmstart/build.py` -> ["teamtr", "training", "warmstart", "build"] (packages: no
    `__init__`)."""
    parts = ["teamtr", *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in the file, wherever it sits."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "teamtr":  # `from teamtr import serving`: the names are the modules
                found += [(node.lineno, f"teamtr.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, name))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _area(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "teamtr" and parts[1] in RANK else None


def upward_imports() -> dict[tuple[str, str], list[str]]:
    """(file, higher area) -> the offending imports, as `file:line name`."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        own = rel.split("/")[0]
        for line, name in imported_names(path):
            area = _area(name)
            if area is not None and RANK[area] > RANK[own]:
                out.setdefault((rel, area), []).append(f"{rel}:{line} imports {name}")
    return out


def test_no_lower_layer_imports_a_higher_one():
    found = upward_imports()
    new = [line for key, lines in sorted(found.items()) if key not in ALLOWED for line in lines]
    assert not new, (
        "imports against the layer order graphs < evals < serving < training < cli:\n" + "\n".join(new)
    )
    stale = sorted(ALLOWED - set(found))
    assert not stale, f"fixed, so remove from ALLOWED in tests/test_layers.py: {stale}"


def test_every_area_is_parsed():
    counts = {area: sum(1 for p in _modules() if p.relative_to(ROOT).parts[0] == area) for area in LAYERS}
    assert all(n >= 2 for n in counts.values()), counts


@pytest.mark.parametrize(
    ("source", "file", "expected"),
    [
        ("import teamtr.serving.embedded", "graphs/x.py", "teamtr.serving.embedded"),
        ("def f():\n    from teamtr.cli.train import X", "evals/x.py", "teamtr.cli.train"),
        ("from ..serving import app", "graphs/x.py", "teamtr.serving"),
        ("from . import build", "training/warmstart/__init__.py", "teamtr.training.warmstart"),
        ("from teamtr import training", "evals/x.py", "teamtr.training"),
        ("importlib.import_module('teamtr.cli.main')", "serving/x.py", "teamtr.cli.main"),
    ],
)
def test_imports_are_found_wherever_they_are(tmp_path, monkeypatch, source, file, expected):
    """The checker itself: lazy, relative, `from teamtr import` and import_module imports are seen."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    path = tmp_path / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source + "\n")
    assert [name for _, name in imported_names(path)] == [expected]
