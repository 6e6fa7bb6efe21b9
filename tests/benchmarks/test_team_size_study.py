"""benchmarks/team_size_study.py at a tiny size: one command writes one JSONL line per finished cell, the
summary, table and plots; a rerun skips the finished cells and runs only the missing one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def study(out: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [
        sys.executable, str(ROOT / "benchmarks" / "team_size_study.py"), "--out", str(out), "--model", str(model),
        "--tasks", "chain", "--sizes", "2", "--seeds", "1", "--stages", "1", "--prompts", "2", "--group", "2",
        "--eval-episodes", "4", "--exact-seeds", "0", "--bootstrap", "100", "--workers", "1", *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_study_writes_each_cell_once_and_resumes_the_missing_one(tiny_model_dir, tmp_path):
    out = tmp_path / "study"
    first = study(out, tiny_model_dir)
    lines = (out / "cells.jsonl").read_text().splitlines()
    cells = [json.loads(line) for line in lines]
    assert [c["key"] for c in cells] == [
        "chain/n2/warm", "chain/n2/seed0/teamtr", "chain/n2/seed0/naive_updates", "chain/n2/seed0/naive_tokens",
    ]  # fmt: skip
    by_arm = {c["arm"]: c for c in cells}
    assert all(len(c["rewards"]) == 4 for c in cells)  # one greedy reward per evaluation task
    # equal updates: the same number of updates; equal tokens: naive runs until it has TeamTR's tokens
    assert by_arm["naive_updates"]["updates"] == by_arm["teamtr"]["updates"] == 2
    assert by_arm["naive_tokens"]["train_tokens"] >= by_arm["teamtr"]["train_tokens"]
    assert by_arm["naive_tokens"]["updates"] > by_arm["teamtr"]["updates"]
    # the stale gap is measured for i >= 2 under TeamTR and, with diagnostic resamples, under naive
    assert len(by_arm["teamtr"]["stale_gap"]) == len(by_arm["naive_updates"]["stale_gap"]) == 1
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["rows"]
    assert row["task"] == "chain" and row["n"] == 2
    assert set(row) >= {
        "warm",
        "teamtr",
        "naive_updates",
        "naive_tokens",
        "diff equal updates",
        "diff equal tokens",
    }
    diff = row["diff equal updates"]
    assert diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1] and 0 < diff["p"] <= 1
    assert (out / "accuracy_gap_vs_n.png").stat().st_size > 1000
    assert (out / "stale_gap_vs_n.png").stat().st_size > 1000
    assert "4 of 4 cells done" in first.stdout

    # a kill while the last cell ran: its line is missing; the rerun runs it alone, the others are kept
    (out / "cells.jsonl").write_text("\n".join(lines[:3]) + "\n")
    second = study(out, tiny_model_dir)
    assert "3 already in" in second.stderr
    again = (out / "cells.jsonl").read_text().splitlines()
    assert again[:3] == lines[:3] and json.loads(again[3])["key"] == "chain/n2/seed0/naive_tokens"
    assert json.loads(again[3])["train_tokens"] == cells[3]["train_tokens"]  # the same seeded run
    study(out, tiny_model_dir, "--report-only")
    assert len((out / "cells.jsonl").read_text().splitlines()) == 4


def test_the_study_refuses_a_warm_start_outside_its_band(tmp_path):
    from teamtr.training.warmstart import build_warm_model, load_report, warm_config_for
    from teamtr.training.warmstart.report import write_report

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from team_size_study import require_in_band

    tiny = dict(hidden=64, layers=2, heads=2, batch_size=4, max_steps=1, eval_every=1, eval_tasks=3,
                final_eval_tasks=3, sampled_eval_tasks=2, samples_per_task=2)  # fmt: skip
    report = build_warm_model(warm_config_for("convention", **tiny), tmp_path, progress=False)
    assert not report.in_band  # one step from scratch: no task right
    with pytest.raises(RuntimeError, match="convention n = 4: the warm start ended outside its band"):
        require_in_band(tmp_path, "convention n = 4")
    report = load_report(tmp_path)
    report.in_band = True
    write_report(report, tmp_path)
    require_in_band(tmp_path, "convention n = 4")  # inside: no error


def test_config_json_stays_the_design_and_other_invocations_are_appended(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from team_size_study import record_config

    design = {"arms": ["teamtr", "naive"], "seeds": 5, "out": tmp_path}
    record_config(tmp_path, design)
    record_config(tmp_path, design)  # the same command again: nothing to add
    assert not (tmp_path / "invocations.jsonl").exists()
    record_config(tmp_path, {**design, "arms": ["naive"]})  # a subset run beside the main one
    assert json.loads((tmp_path / "config.json").read_text())["arms"] == ["teamtr", "naive"]
    (line,) = (tmp_path / "invocations.jsonl").read_text().splitlines()
    assert json.loads(line)["arms"] == ["naive"] and "at" in json.loads(line)
