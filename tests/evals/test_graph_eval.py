"""`teamtr eval RUN_DIR` on a run of a user's own graph (examples/review_loop.yaml, trained tiny): v0 vs
newest on the same instances and seeds, scored by the run's reward or a verifier named on the command
line, pass@k and majority@k, the paired change, and the best-of-N single-model baseline where it applies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from teamtr.cli.main import app
from tests.support.example_graphs import (  # the example trained tiny, as those tests train it
    example_config,
    train,
)

cli = CliRunner()


@pytest.fixture(scope="module")
def review_run(tmp_path_factory) -> Path:
    from teamtr.training.warmstart import tiny_random_model

    root = tmp_path_factory.mktemp("graph-eval")
    # eval.stage_episodes above the held-out file's 12 tasks: training's held-out return scores each once
    cfg = example_config(
        "review_loop", str(tiny_random_model(root / "model")), root / "run", **{"eval.stage_episodes": 16}
    )
    train(cfg)
    return Path(cfg.run_dir)


HELDOUT = Path(__file__).resolve().parents[2] / "examples" / "review_loop_heldout.jsonl"


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_training_and_eval_score_the_held_out_file_not_the_training_list(review_run, tmp_path):
    """issue 34 item 3: task.eval_data is what training's held-out return and `teamtr eval` score."""
    from teamtr.graphs.run_layout import read_metrics

    # the run pins its graph code (issue 34 item 5): serving warns when the module has changed since
    assert "examples.review_loop" in json.loads((review_run / "code_digest.json").read_text())
    evals = read_metrics(review_run, kind="eval")
    assert evals and all(e["episodes"] == len(_ids(HELDOUT)) == 12 for e in evals)  # each held-out task once
    out = _eval(review_run, tmp_path)  # default: the run's task.eval_data
    assert out["tasks_from"] == f"task.eval_data {HELDOUT}"
    assert set(_ids(tmp_path / "episodes.jsonl")) <= set(_ids(HELDOUT))
    own = tmp_path / "mine.jsonl"
    own.write_text("".join(line + "\n" for line in HELDOUT.read_text().splitlines()[:3]))
    out = _eval(review_run, tmp_path / "data", "--data", str(own))  # --limit 4 > 3 rows: the whole file
    assert out["tasks_from"] == f"--data {own}" and out["instances"] == 3
    assert sorted(_ids(tmp_path / "data" / "episodes.jsonl")) == sorted(_ids(own))


def test_eval_is_greedy_by_default_and_names_the_versions_it_compares(review_run, tmp_path):
    """issue 34 item 3: one episode per instance is greedy, as training's evaluation and serving; the
    result names each role's adapter version on both sides."""
    result = cli.invoke(
        app, ["eval", str(review_run), "--limit", "2", "--out", str(tmp_path)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert (
        "greedy; compared: v0 (solver v0, reviewer v0, planner v0, finalizer v0) vs newest (" in result.output
    )
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["temperature"] == 0.0 and saved["k"] == 1
    assert saved["versions"]["before"] == {"solver": 0, "reviewer": 0, "planner": 0, "finalizer": 0}
    assert set(saved["versions"]["after"]) == set(saved["versions"]["before"])
    assert _eval(review_run, tmp_path / "k2")["temperature"] == 1.0  # -k 2: sampled


def _eval(run: Path, out: Path, *args: str) -> dict:
    result = cli.invoke(
        app, ["eval", str(run), "--limit", "4", "-k", "2", "--json", "--out", str(out), *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_graph_run_is_scored_by_its_reward_before_and_after(review_run, tmp_path):
    out = _eval(review_run, tmp_path)
    assert out["scored_by"] == "team.reward examples.review_loop:reward"
    assert out["instances"] == 4 and out["k"] == 2 and out["episodes"] == 8
    assert out["before"]["instances"] == 4 and out["after"] == "newest"
    assert out["tasks_from"].startswith(
        "task.eval_data"
    )  # the run's held-out file (examples/review_loop.yaml)
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    # the run's reward: 1 right value, 0.5 a number, 0 none
    assert all(r in (0.0, 0.5, 1.0) for rec in records for r in rec["rewards"])
    assert [rec["id"] for rec in records] == [
        json.loads(line)["id"] for line in (tmp_path / "before" / "episodes.jsonl").read_text().splitlines()
    ]
    for block in (out, out["before"]):
        assert 0.0 <= block["pass_at_k"]["low"] <= block["pass_at_k"]["value"] <= block["pass_at_k"]["high"]
        assert block["majority_at_k"] is not None and block["tokens_per_episode"] > 0
    change = out["change"]["avg_at_k"]
    assert change["value"] == pytest.approx(out["avg_at_k"]["value"] - out["before"]["avg_at_k"]["value"])
    assert change["low"] <= change["value"] <= change["high"]
    assert json.loads((tmp_path / "result.json").read_text())["change"] == out["change"]


def test_stage_zero_against_v0_is_the_same_team_on_the_same_seeds(review_run, tmp_path):
    out = _eval(review_run, tmp_path, "--stage", "0")
    assert out["after"] == "stage 0"
    assert out["change"]["avg_at_k"] == {"value": 0.0, "low": 0.0, "high": 0.0}  # paired: identical episodes
    assert out["change"]["instances_better"] == out["change"]["instances_worse"] == 0


def test_a_verifier_on_the_answer_gives_the_best_of_n_baseline(review_run, tmp_path):
    out = _eval(review_run, tmp_path, "--verifier", "examples.review_loop:verify", "--baseline", "best-of-n")
    assert out["scored_by"] == "--verifier examples.review_loop:verify"
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert all(r in (0.0, 1.0) for rec in records for r in rec["rewards"])  # the verifier is 0/1
    baseline = out["baseline"]
    assert baseline["kind"] == "best-of-n" and baseline["n"] >= 1
    assert baseline["team_budget"] == pytest.approx(2 * out["tokens_per_episode"])  # k = 2 team episodes


def test_best_of_n_on_a_state_reward_and_a_bad_verifier_are_clear_errors(review_run, tmp_path):
    args = ["eval", str(review_run), "--limit", "2", "--out", str(tmp_path)]
    refused = cli.invoke(app, [*args, "-k", "2", "--baseline", "best-of-n"])
    assert refused.exit_code != 0 and "--verifier" in refused.output and "final state" in refused.output
    bad = cli.invoke(app, [*args, "--verifier", "examples.review_loop:nothing"])
    assert bad.exit_code != 0 and "examples.review_loop:nothing" in bad.output
    not_graph = cli.invoke(
        app, ["eval", "warm", "--task", "chain", "--verifier", "examples.review_loop:verify"]
    )
    assert not_graph.exit_code != 0 and "--verifier applies to a run of a user's graph" in not_graph.output


def test_a_task_family_named_on_the_command_line_gives_instances_and_verifier(review_run, tmp_path):
    from teamtr.tasks import get_task

    out = _eval(review_run, tmp_path, "--task", "chain", "--seed", "5")
    assert out["task"] == "chain" and out["scored_by"] == "the chain verifier"
    ids = [json.loads(line)["id"] for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert ids == [x.id for x in get_task("chain").generate(4, 5)]
