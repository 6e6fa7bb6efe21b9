"""Every file the README and docs/*.md name exists in the repository, so a page never sends a reader to
a file that moved (modules move between areas; this test names the page and the path).

Checked: repository paths (`training/stage.py`, `tests/theory/test_*.py`: a pattern must match a file),
bare module names (`embedded_decode.py`, after its area was named: some file of that name exists),
relative Markdown links, and that no page cites a file outside the repository (`../x/y.md`, or a
document such as `DESIGN.md` that the repository does not hold). Placeholders (`RUN_DIR/config.yaml`)
and files a command writes (`runs/demo/summary.json`) are not repository paths and are not checked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
AREAS = (
    "graphs", "tasks", "engines", "client", "serving", "training", "theory", "evals", "improve", "cli",
    "tests", "benchmarks", "examples", "docs", "scripts",
)
EXTENSIONS = "py|md|yaml|yml|sh|json|jsonl|toml|txt"

# a path inside the repository: starts with an area, ends with a file name (a `*` makes it a pattern)
REPO_PATH = re.compile(rf"(?<![\w./~$*-])((?:{'|'.join(AREAS)})/[\w./*-]*[\w*]\.(?:{EXTENSIONS}))\b")
BARE_MODULE = re.compile(r"(?<![\w./*-])(\w+\.py)\b")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = re.compile(rf"(?<![\w.])(\.\./[\w./-]*\.(?:{EXTENSIONS}))\b")
DOCUMENT = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_]+\.md)\b")
SKIPPED = {"build", "runs", "__pycache__", "node_modules"}


def _repo_files() -> set[str]:
    """Every file of the working tree, as a relative path, outside hidden folders and build outputs."""
    out = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED and not d.endswith(".egg-info")]
        out.update((Path(folder) / f).relative_to(ROOT).as_posix() for f in files)
    return out


@pytest.fixture(scope="module")
def repo_files() -> set[str]:
    return _repo_files()


def _missing(text: str, folder: Path, repo_files: set[str]) -> list[str]:
    """What `text`, a page in `folder`, names that does not exist."""
    basenames = {f.rsplit("/", 1)[-1] for f in repo_files}
    missing = []
    for path in sorted(set(REPO_PATH.findall(text))):
        found = any(ROOT.glob(path)) if "*" in path else path in repo_files
        if not found:
            missing.append(f"{path} (no such file)")
    for name in sorted(set(BARE_MODULE.findall(text))):
        if name not in basenames:
            missing.append(f"{name} (no file of that name)")
    for target in sorted(set(MARKDOWN_LINK.findall(text))):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        resolved = (folder / target.split("#", 1)[0]).resolve()
        if not resolved.is_relative_to(ROOT):
            missing.append(f"{target} (a link outside the repository)")
        elif not resolved.exists():
            missing.append(f"{target} (a link to nothing)")
    for path in sorted(set(OUTSIDE.findall(text))):
        missing.append(f"{path} (a file outside the repository)")
    for name in sorted(set(DOCUMENT.findall(text))):
        if name not in basenames:
            missing.append(f"{name} (a document the repository does not hold)")
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page: Path, repo_files: set[str]):
    missing = _missing(page.read_text(), page.parent, repo_files)
    assert not missing, f"{page.relative_to(ROOT)} names: " + "; ".join(missing)


def test_the_check_catches_a_moved_file_a_missing_module_and_an_outside_document(repo_files):
    text = (
        "See serving/embedded.py, `embedded_decode.py`, nothing_here.py, tests/test_nothing_*.py,\n"
        "[a](missing.md), [b](training.md), `../shared/TEAMTR.md` and DESIGN.md; fine: training/stage.py,\n"
        "README.md, tests/theory/test_*.py, RUN_DIR/config.yaml, runs/demo/summary.json.\n"
    )
    missing = _missing(text, ROOT / "docs", repo_files)
    assert missing == [
        "serving/embedded.py (no such file)",
        "tests/test_nothing_*.py (no such file)",
        "nothing_here.py (no file of that name)",
        "missing.md (a link to nothing)",
        "../shared/TEAMTR.md (a file outside the repository)",
        "DESIGN.md (a document the repository does not hold)",
    ]


# a section of a page cited from code or docs: docs/training.md, "Trust region" (a heading or a bold label)
SECTION_CITE = re.compile(r'docs/(\w+\.md),? "([^"]+)"')  # the quoted name may wrap a line
CITING = ("graphs", "tasks", "engines", "client", "serving", "training", "theory", "evals", "improve", "cli",
          "examples", "tests", "docs")  # fmt: skip


def _sections(page: Path) -> tuple[list[str], str]:
    text = page.read_text()
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")], " ".join(text.split())


def _uncited(text: str, where: str) -> list[str]:
    missing = []
    for page, cited in SECTION_CITE.findall(text):
        section = " ".join(cited.split())  # a citation may wrap across a comment's lines
        path = ROOT / "docs" / page
        if not path.is_file():
            missing.append(f"{where}: docs/{page} (no such page)")
            continue
        headings, body = _sections(path)
        if not any(section in h for h in headings) and f"**{section}" not in body:
            missing.append(f'{where}: docs/{page}, "{section}" (no such section)')
    return missing


def test_every_section_cited_exists():
    """A docs rewrite that renames a heading leaves no comment pointing at nothing."""
    missing = []
    for folder in CITING:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md", ".yaml") and path.is_file() and path != Path(__file__):
                missing += _uncited(path.read_text(), path.relative_to(ROOT).as_posix())
    assert not missing, "\n".join(missing)


def test_the_section_check_sees_a_renamed_heading():
    assert _uncited('see docs/training.md, "Trust region"', "x") == []
    assert _uncited('see docs/training.md, "No such heading here"', "x") == [
        'x: docs/training.md, "No such heading here" (no such section)'
    ]
