"""docs/ is a reference, not a lab notebook (docs/architecture.md): each page says what a part does, how
to use it, its options and one line of measured figures linked to the result file; how a figure was
reached lives beside the result (benchmarks/results/<study>/README.md) or in git history.

Checked: the pages together stay within their budget, and no page carries a dated measurement (a
calendar date, a UTC time of day, the machine's load average at the time)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
MOST_LINES = 2573  # half of docs/ when the reference rewrite was asked for (5,146 lines)
DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b\d\d:\d\d(:\d\d)? ?UTC\b|load average", re.IGNORECASE)


def test_the_pages_together_stay_within_their_budget():
    lines = {page.name: len(page.read_text().splitlines()) for page in PAGES}
    assert sum(lines.values()) <= MOST_LINES, f"docs/ has {sum(lines.values())} lines: {lines}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_carries_a_dated_measurement(page: Path):
    found = [
        f"{page.name}:{i}: {line.strip()}"
        for i, line in enumerate(page.read_text().splitlines(), 1)
        if DATED.search(line)
    ]
    assert not found, "a dated measurement belongs beside its result file:\n" + "\n".join(found)


def test_the_checks_see_what_they_look_for():
    assert DATED.search("Measured (2026-12-02, this 2-core machine at a load average of ~10-13)")
    assert DATED.search("ran 14:03 UTC") and not DATED.search("delta 0.15, 2 stages, 5 seeds")
