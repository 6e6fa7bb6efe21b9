"""examples/three_role_team.py (the README's "A team in graph code") runs as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds (or reuses) the cached demo warm start


def test_three_role_team_example_runs_and_reports_its_episodes():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "three_role_team.py")],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "graph TD" in out.stdout or "flowchart" in out.stdout  # the team's graph as mermaid
    accuracy = re.search(r"accuracy (\d\.\d\d) over 32 episodes", out.stdout)
    assert accuracy is not None, out.stdout[-2000:]
    turns = re.findall(r"adder\d \(adapter adder\d v\d+\): .*  (\d+) tokens, log p = (-?\d+\.\d+)", out.stdout)
    assert turns and all(int(n) > 0 and float(lp) <= 0.0 for n, lp in turns)
