"""The layers import one way only, one top-level folder each (docs/architecture.md):

    graphs < tasks < engines < training < theory, evals
                     engines, client < serving < improve < cli

graphs is the core (engine protocol, roles, capture, the team spec, the run layout); tasks the task
families, their verifiers and the dataset loaders; engines the engines (embedded, vLLM) that the chat API
and the trainer both open; client the admin API's wire types and its client; serving the chat API, which
never imports training; training TeamTR; theory the exact lab on top of the trainer; evals the evaluation
app (teams from runs, scoring, reports); improve `teamtr improve`, a client of a running server and of
the trainer. No exceptions.

Every module of every layer is parsed (not imported) and every import is checked, at any depth:
module level, inside functions (lazy imports), relative imports, and `importlib.import_module("...")`
with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["graphs", "tasks", "engines", "client", "serving", "training", "theory", "evals", "improve", "cli"]
# layer -> the layers its modules may import (its own included)
MAY_IMPORT: dict[str, set[str]] = {
    "graphs": {"graphs"},
    "tasks": {"graphs", "tasks"},
    "engines": {"graphs", "engines"},
    "client": {"graphs", "client"},
    "serving": {"graphs", "tasks", "engines", "client", "serving"},
    "training": {"graphs", "tasks", "engines", "training"},
    "theory": {"graphs", "tasks", "engines", "training", "theory"},
    "evals": {"graphs", "tasks", "engines", "training", "evals"},
    "improve": {"graphs", "tasks", "engines", "client", "serving", "training", "evals", "improve"},
    "cli": set(FOLDERS),
}


def _modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


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
    """The layer of a dotted module name (None: not one of teamtr's layers)."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] != "teamtr" or parts[1] not in FOLDERS:
        return None
    return parts[1]


def file_area(rel: str) -> str:
    return _area("teamtr." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")) or ""


def forbidden_imports() -> dict[tuple[str, str], list[str]]:
    """(file, area it may not import) -> the offending imports, as `file:line name`."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        own = file_area(rel)
        for line, name in imported_names(path):
            area = _area(name)
            if area is not None and area not in MAY_IMPORT[own]:
                out.setdefault((rel, area), []).append(f"{rel}:{line} imports {name}")
    return out


def test_no_layer_imports_one_it_may_not():
    found = forbidden_imports()
    lines = [line for _, found_lines in sorted(found.items()) for line in found_lines]
    assert not lines, "imports against the layer order (tests/project/test_layers.py MAY_IMPORT):\n" + "\n".join(lines)


def test_every_area_is_parsed():
    counts = {area: sum(1 for p in _modules() if file_area(p.relative_to(ROOT).as_posix()) == area) for area in MAY_IMPORT}
    assert all(n >= 2 for n in counts.values()), counts


@pytest.mark.parametrize(
    ("file", "name", "allowed"),
    [
        ("serving/app.py", "teamtr.training.run_dir", False),  # the chat API never imports training
        ("engines/embedded.py", "teamtr.serving.registry", False),  # engines know no API
        ("training/trainer.py", "teamtr.serving.registry", False),  # training: engines and the client only
        ("training/trainer.py", "teamtr.engines.open", True),
        ("improve/loop.py", "teamtr.client.admin_client", True),
        ("graphs/spec.py", "teamtr.evals.runners", False),
        ("cli/serve.py", "teamtr.training.run_dir", True),
    ],
)
def test_the_rules_themselves(file, name, allowed):
    assert (_area(name) in MAY_IMPORT[file_area(file)]) is allowed


@pytest.mark.parametrize(
    ("source", "file", "expected"),
    [
        ("import teamtr.engines.embedded", "graphs/x.py", "teamtr.engines.embedded"),
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
