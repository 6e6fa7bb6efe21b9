"""`teamtr --help`, a command's help and a config error answer without importing the heavy libraries
(torch, transformers, peft, langgraph, matplotlib, fastapi, scipy.stats): cli/ imports them in the commands
that run. Checked on the modules a fresh interpreter holds after the command, not on time (a noisy machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "peft", "langgraph", "matplotlib", "fastapi", "scipy.stats")

PROBE = f"""
import json, sys
from teamtr.cli.main import app
try:
    app(sys.argv[1:], prog_name="teamtr")
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def run_cli(*args: str) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300, check=False
    )
    last = done.stdout.strip().splitlines()[-1]
    return json.loads(last), done.stdout + done.stderr


@pytest.mark.parametrize(
    "args",
    [["--help"], ["eval", "--help"], ["serve", "--help"], ["traces", "list", "--help"], ["train", "--help"], ["warmstart", "--help"]],
)
def test_help_imports_no_heavy_library(args):
    result, output = run_cli(*args)
    assert result["code"] == 0, output
    assert "Usage" in output
    assert result["heavy"] == [], f"teamtr {' '.join(args)} imported {result['heavy']}"


def test_a_config_error_is_reported_without_torch(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stagse: 2\n")
    result, output = run_cli("train", str(bad))
    assert result["code"] == 1, output
    assert "stagse" in output and str(bad) in output
    assert "torch" not in result["heavy"] and "langgraph" not in result["heavy"], result


def test_a_missing_team_directory_is_reported_without_torch(tmp_path):
    result, output = run_cli("eval", str(tmp_path / "nothing"), "--task", "chain")
    assert result["code"] != 0 and "is not a directory" in output, output
    assert result["heavy"] == [], result
