"""The README's benchmark commands (its results table) run: `python benchmarks/overhead.py`,
`python benchmarks/swap_shock.py` and `python benchmarks/graph_rollout_throughput.py`, in their own
processes, at the smallest sizes their options allow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_readme_benchmark_commands_run_at_tiny_sizes(tiny_model_dir, tmp_path):
    """`python benchmarks/overhead.py` and `python benchmarks/swap_shock.py ...` (the README's results
    table), on the seconds-sized model with the smallest settings their options allow."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    overhead = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "overhead.py"), "--stages", "1", "--model", str(tiny_model_dir),
         "--out", str(tmp_path / "overhead")],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert overhead.returncode == 0, overhead.stderr[-3000:]
    for schedule in ("teamtr", "teamtr_suffix"):  # full and suffix resampling, each against naive
        assert f"{schedule} / naive: rollout tokens per stage" in overhead.stdout
    ratios = json.loads(overhead.stdout[: overhead.stdout.rindex("}") + 1])["ratio_over_naive"]["teamtr_suffix"]
    # the three counts of training/token_counts.py: the updates' passes, alike in both arms, dilute the premium
    assert ratios["processed_tokens_per_stage"] < ratios["tokens_per_stage"]
    newcomer = tmp_path / "newcomer"
    shutil.copytree(tiny_model_dir, newcomer)
    shock = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "swap_shock.py"), "--seeds", "1", "--stages-before", "1",
         "--stages-after", "1", "--probes", "4", "--max-rounds", "1", "--prompts", "2", "--group", "2",
         "--eval-episodes", "4", "--incumbent", str(tiny_model_dir), "--newcomer", str(newcomer),
         "--out", str(tmp_path / "shock")],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert shock.returncode == 0, shock.stderr[-3000:]
    saved = json.loads((tmp_path / "shock" / "swap_shock.json").read_text())
    assert set(saved["runs"][0]) >= {"direct", "stage0"}


def test_readme_graph_throughput_command_runs_at_a_tiny_size():
    """`python benchmarks/graph_rollout_throughput.py --team` (the README's speed line), 2 episodes."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "graph_rollout_throughput.py"), "--episodes", "2",
         "--tokens", "4", "--repeats", "1", "--team"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ratio" in out.stdout.lower(), out.stdout[-2000:]
