"""The areas import one way only (docs/architecture.md):

    graphs  <  evals  <  serving.engines  <  serving (the chat API)  <  cli
                                          <  training                <  cli

graphs is the core (engine protocol, roles, capture, the team spec, the run layout); evals the tasks;
serving.engines the engines (embedded, vLLM) that the chat API and the trainer both open; serving the
chat API, which never imports training; training imports of serving only its engines and the admin API's
client side (serving.protocol, serving.admin_client: `teamtr improve` is a client of a running server).

Every module of every area is parsed (not imported) and every import is checked, at any depth:
module level, inside functions (lazy imports), relative imports, and `importlib.import_module("...")`
with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["graphs", "evals", "serving", "training", "cli"]
# area -> the areas its modules may import (its own included)
MAY_IMPORT: dict[str, set[str]] = {
    "graphs": {"graphs"},
    "evals": {"graphs", "evals"},
    "engines": {"graphs", "engines"},
    "client": {"graphs", "client"},
    "serving": {"graphs", "evals", "engines", "client", "serving"},
    "training": {"graphs", "evals", "engines", "client", "training"},
    "cli": {"graphs", "evals", "engines", "client", "serving", "training", "cli"},
}
CLIENT_MODULES = {"teamtr.serving.protocol", "teamtr.serving.admin_client"}

# Known violations: (module file, area it may not import); an entry that no longer matches an import
# fails the test, so the list can only shrink. `teamtr improve`'s local mode reads the server's span store,
# and its decision log and timeline use the promotion log's append-only JSONL records, both serving's.
ALLOWED: set[tuple[str, str]] = {("training/improve/loop.py", "serving")}  # local mode reads the span store


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
    """The area of a dotted module name (None: not one of teamtr's areas)."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] != "teamtr" or parts[1] not in FOLDERS:
        return None
    if parts[1] == "serving":
        if len(parts) > 2 and parts[2] == "engines":
            return "engines"
        if ".".join(parts[:3]) in CLIENT_MODULES:
            return "client"
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


def test_no_area_imports_one_it_may_not():
    found = forbidden_imports()
    new = [line for key, lines in sorted(found.items()) if key not in ALLOWED for line in lines]
    assert not new, "imports against the area order (tests/test_layers.py MAY_IMPORT):\n" + "\n".join(new)
    stale = sorted(ALLOWED - set(found))
    assert not stale, f"fixed, so remove from ALLOWED in tests/test_layers.py: {stale}"


def test_every_area_is_parsed():
    counts = {area: sum(1 for p in _modules() if file_area(p.relative_to(ROOT).as_posix()) == area) for area in MAY_IMPORT}
    assert all(n >= 2 for n in counts.values()), counts


@pytest.mark.parametrize(
    ("file", "name", "allowed"),
    [
        ("serving/app.py", "teamtr.training.run_dir", False),  # the chat API never imports training
        ("serving/engines/embedded.py", "teamtr.serving.registry", False),  # engines know no API
        ("training/trainer.py", "teamtr.serving.registry", False),  # training: engines and the client only
        ("training/trainer.py", "teamtr.serving.engines.open", True),
        ("training/improve/loop.py", "teamtr.serving.admin_client", True),
        ("graphs/spec.py", "teamtr.evals.runners", False),
        ("cli/serve.py", "teamtr.training.run_dir", True),
    ],
)
def test_the_rules_themselves(file, name, allowed):
    assert (_area(name) in MAY_IMPORT[file_area(file)]) is allowed


@pytest.mark.parametrize(
    ("source", "file", "expected"),
    [
        ("import teamtr.serving.engines.embedded", "graphs/x.py", "teamtr.serving.engines.embedded"),
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
