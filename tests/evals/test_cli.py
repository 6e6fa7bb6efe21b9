"""`teamtr eval` end to end: the real root CLI, a real tiny model through the LangGraph team."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from teamtr.cli.main import app
from teamtr.tasks import get_task

runner = CliRunner()


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_list_tasks_names_every_family_and_benchmark():
    result = runner.invoke(app, ["eval", "--list-tasks"])
    assert result.exit_code == 0, result.output
    for name in [
        "countdown",
        "zebra",
        "autologi",
        "blocksworld",
        "arbench",
        "split",
        "chain",
        "math500",
        "planbench",
    ]:
        assert name in result.output


def test_json_output_scores_a_responses_file(tmp_path):
    family = get_task("split")
    instances = family.generate(3, 5, hops=2)
    path = tmp_path / "responses.jsonl"
    lines = [
        {"id": x.id, "response": x.answer if i == 0 else "z1"}
        for i, x in enumerate(instances)
        for _ in range(2)
    ]
    path.write_text("\n".join(map(json.dumps, lines)))
    args = ["eval", "--task", "split", "-d", "hops=2", "--seed", "5", "--limit", "3", "-k", "2"]
    out = _json(runner.invoke(app, [*args, "--responses", str(path), "--json", "--out", str(tmp_path / "r")]))
    assert out["task"] == "split" and out["k"] == 2 and out["episodes"] == 6
    assert out["pass_at_k"]["value"] == pytest.approx(1 / 3) and out["avg_at_k"]["value"] == pytest.approx(
        1 / 3
    )
    assert (tmp_path / "r" / "pass_at_k.png").stat().st_size > 0
    assert len((tmp_path / "r" / "episodes.jsonl").read_text().splitlines()) == 3


def test_tiny_team_run_with_best_of_n_baseline(tiny_model_dir, tmp_path):
    args = [
        "eval",
        str(tiny_model_dir),
        "--task",
        "chain",
        "-k",
        "2",
        "--limit",
        "2",
        "--max-new-tokens",
        "6",
    ]
    out = _json(runner.invoke(app, [*args, "--baseline", "best-of-n", "--json", "--out", str(tmp_path)]))
    assert out["episodes"] == 4 and out["instances"] == 2
    assert 0.0 <= out["avg_at_k"]["value"] <= out["pass_at_k"]["value"] <= 1.0
    assert out["tokens_per_episode"] > 0  # three roles spoke
    baseline = out["baseline"]
    assert baseline["n"] >= 1 and baseline["team_budget"] == pytest.approx(2 * out["tokens_per_episode"])
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["pass_at_k"] == out["pass_at_k"]


def test_split_roles_each_see_only_their_own_table(tiny_model_dir):
    from teamtr.evals.runners import EngineRunners
    from teamtr.evals.teams import load_eval_team

    family = get_task("split")
    inst = family.generate(1, 0, hops=2)[0]
    team = load_eval_team(str(tiny_model_dir), "split", n_roles=2)
    runners = EngineRunners(team.engine, team.roles, family, max_new_tokens=4)
    roles = runners._roles_for(inst)
    assert family.role_view(inst, 0) in roles[0].system_prompt
    assert family.role_view(inst, 1) not in roles[0].system_prompt
    assert family.role_view(inst, 1) in roles[1].system_prompt
    episodes = runners.team()([inst], 2)
    assert len(episodes[0]) == 2 and all(e.turns == 2 for e in episodes[0])
    # the single-model baseline: one policy, as many turns as the team has roles, or one long message
    assert [e.turns for e in runners.single()([inst], 2)[0]] == [2, 2]
    one = runners.single(turns=1)([inst], 1)[0][0]
    assert one.turns == 1 and one.completion_tokens <= 2 * 4
    runners.close()


def _error(args: list[str]) -> str:
    """The error text of a failed command, with rich's box drawing and line wrapping undone."""
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_bad_input_gets_clear_errors(tmp_path):
    assert "unknown task 'nope'" in _error(["eval", str(tmp_path), "--task", "nope"])
    assert "neither a run directory" in _error(["eval", str(tmp_path), "--task", "zebra"])
    assert "KNOB=VALUE" in _error(["eval", str(tmp_path), "--task", "zebra", "-d", "houses"])
    knob_typo = ["eval", "--task", "zebra", "-d", "rooms=2", "--responses", str(tmp_path / "r.jsonl")]
    assert "unknown difficulty knob" in _error(knob_typo)


def test_a_run_directory_loads_the_newest_adapter_of_each_role(tiny_model_dir, tmp_path):
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.evals.teams import load_eval_team
    from teamtr.graphs.run_layout import adapter_dir
    from teamtr.training.config import TrainConfig

    run = tmp_path / "run"
    roles = ["adder1", "adder2", "adder3"]
    engine = EmbeddedEngine(str(tiny_model_dir), adapters={r: None for r in roles}, threads=1)
    for role in roles:
        for version in (0, 2, 10):  # v10 is the newest: numeric order, not string order
            engine.save_adapter(role, adapter_dir(run, role, version))
    cfg = TrainConfig.from_dict({"run_dir": str(run), "team": {"model": str(tiny_model_dir)}})
    cfg.to_yaml(run / "config.yaml")

    team = load_eval_team(str(run), "chain")
    assert team.bases == {"base": str(tiny_model_dir)} and [r.name for r in team.roles] == roles
    assert team.adapters == {r: adapter_dir(run, r, 10) for r in roles}
    args = ["eval", str(run), "--task", "chain", "--limit", "2", "--max-new-tokens", "4", "--json"]
    out = _json(runner.invoke(app, [*args, "--out", str(tmp_path / "out")]))
    assert out["episodes"] == 2 and out["k"] == 1
