"""The traps a new user met in their first hour (issue 34 items 2-6), each pinned by a test that fails if it
comes back. Fast: no model is trained here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from teamtr.training.progress import no_signal_warning, short_step_warning, trained_updates, update_line


def update(no_signal: bool, accepted: bool, reward: float = 0.0) -> dict[str, Any]:
    return {
        "stage": 1,
        "index": 1,
        "role": "solver",
        "reward": reward,
        "d_hat": 0.0,
        "delta": 0.01,
        "accepted": accepted,
        "no_signal": no_signal,
        "backtracks": 0,
        "certificate": {"surrogate": 0.0, "value": 0.0},
    }


# ---- item 2: runs that say what they learned ------------------------------------------------------------


def test_an_update_without_signal_is_skipped_not_rejected():
    line = update_line(update(no_signal=True, accepted=False))
    assert "skipped (no signal)" in line and "rejected" not in line
    assert "rejected" in update_line(update(no_signal=False, accepted=False))
    assert "accepted" in update_line(update(no_signal=False, accepted=True))


def test_an_update_line_says_what_evidence_it_rests_on_and_how_far_it_was_extrapolated():
    """1-4 of 8 groups with spread, steps scaled 105-512x to the region's edge: SmolLM2's updates on a
    4-role graph (benchmarks/results/word_problems_smollm2/README.md) show it on their line."""
    record = {**update(no_signal=False, accepted=True), "signal_groups": 1}
    record.update(stop="extrapolated", extrapolate_scale=512.0)
    line = update_line(record)
    assert "on 1 group with spread" in line and "(extrapolated x512)" in line
    plain = update_line({**update(no_signal=False, accepted=True), "signal_groups": 6, "stop": "epochs"})
    assert "on 6 groups with spread" in plain and "extrapolated" not in plain
    skipped = update_line({**update(no_signal=True, accepted=False), "signal_groups": 1})
    assert "with spread" not in skipped  # the group's spread did not reach this role's messages


def test_first_updates_without_reward_spread_warn_with_the_likely_causes():
    quiet = [update(True, False), update(True, False)]
    warning = no_signal_warning(quiet, temperature=1.0)
    assert warning is not None
    assert "rollout.temperature is 1" in warning and "too hard for the base" in warning
    assert "every episode scored 0" in warning
    assert no_signal_warning(quiet[:1], 1.0) is None  # not before the first batches are in
    assert no_signal_warning([update(True, False), update(False, True, 0.5)], 1.0) is None


def test_first_trained_updates_far_short_of_the_region_warn_with_what_lengthens_them():
    """item 7: SmolLM2's RAdam steps at lr 2e-3 ended at d_hat 0.011 of 0.3 and changed nothing."""

    def trained(d_hat: float) -> dict[str, Any]:
        return {**update(no_signal=False, accepted=True), "d_hat": d_hat, "delta": 0.3}

    warning = short_step_warning(
        [update(True, False), trained(0.011), trained(0.02)]
    )  # a skip is not counted
    assert warning is not None and "0.0110 of 0.3" in warning
    assert "optim.lr" in warning and "optim.minibatch_messages" in warning and "extrapolate_rounds" in warning
    assert short_step_warning([trained(0.011)]) is None  # not before two updates trained
    assert short_step_warning([trained(0.011), trained(0.2)]) is None  # one step reached the region
    assert short_step_warning([trained(0.011), update(no_signal=False, accepted=False)]) is None


def test_both_warnings_name_a_recipe_that_exists_and_the_docs_show():
    """item 7: a user warned that nothing learns is pointed at settings measured to learn on SmolLM2."""
    root = Path(__file__).parents[2]
    short = short_step_warning([{**update(False, True), "d_hat": 0.01, "delta": 0.3}] * 2)
    quiet = no_signal_warning([update(True, False)] * 2, temperature=1.0)
    for warning in (short, quiet):
        assert warning is not None and "examples/word_problems.yaml (docs/graphs.md)" in warning
    assert (root / "examples/word_problems.yaml").exists()
    assert "teamtr train examples/word_problems.yaml" in (root / "docs/graphs.md").read_text()


def test_the_summary_counts_the_updates_that_trained():
    records = [update(True, False), update(False, False), update(False, True), update(False, True)]
    assert trained_updates(records) == {
        "updates_trained": 2,
        "updates_rejected": 1,
        "updates_skipped_no_signal": 1,
    }
    from teamtr.cli.train import trained_line

    summary = {"updates": 2, **trained_updates(records[:1] + records[1:2])}
    assert "trained 0 of 2 updates" in trained_line(summary)
    assert "learned nothing" in trained_line(summary)


def test_run_summary_states_how_many_updates_trained():
    from teamtr.training.llm_team import RunState
    from teamtr.training.trainer import run_summary

    records = [{**update(True, False), "left_region": False}, {**update(False, True), "left_region": False}]
    summary = run_summary(RunState(step=2), records)
    assert summary["updates_trained"] == 1 and summary["updates_skipped_no_signal"] == 1
    assert summary["rejected_fraction"] == 0.0


# ---- item 4: a reference for every config key ------------------------------------------------------------


def test_configuration_md_is_what_the_config_classes_generate():
    from teamtr.training.config_doc import DOC_PATH, REGENERATE, config_reference

    assert DOC_PATH.read_text() == config_reference(), (
        f"docs/configuration.md is out of date with the config classes: run `{REGENERATE}`"
    )
    text = DOC_PATH.read_text()
    assert REGENERATE in text.split("\n## ")[0]  # the command is at the top of the file
    for key in (
        "stages",
        "rollout.prompts_per_update",
        "rollout.group_size",
        "optim.epochs",
        "eval.stage_episodes",
        "eval.temperature",
        "trust_region.heldout_episodes",
    ):
        assert f"| `{key}` |" in text, key


def test_every_fallback_note_names_a_config_key():
    from teamtr.training.config_doc import NOTES, all_keys

    assert set(NOTES) <= set(all_keys())


def test_train_help_points_to_the_configuration_reference():
    from typer.testing import CliRunner

    from teamtr.cli.main import app

    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "docs/configuration.md" in result.output


# ---- item 3: held-out evaluation of a user's data --------------------------------------------------------


def test_teamtr_eval_is_greedy_by_default():
    from teamtr.cli.eval import default_temperature

    assert default_temperature(None, 1) == 0.0  # as training's held-out evaluation and serving answer
    assert default_temperature(None, 4) == 1.0  # k greedy episodes would all be the same
    assert default_temperature(0.7, 1) == 0.7


def test_eval_data_is_drawn_whole_and_apart_from_the_training_list(tmp_path):
    from teamtr.graphs.user_graph import data_family

    held = tmp_path / "held.jsonl"
    held.write_text(
        "".join(
            json.dumps({"id": f"h{i}", "prompt": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(3)
        )
    )
    family = data_family(str(held), "mine", key="task.eval_data", whole=True)
    assert sorted(t.id for t in family.generate(128, seed=5)) == ["h0", "h1", "h2"]  # each once, no repeats
    assert len(data_family(str(held), "mine").generate(8, seed=5)) == 8  # training draws with repeats


def test_a_missing_eval_data_file_is_refused_by_its_key(tiny_model_dir, tmp_path):
    from teamtr.training.run_dir import RunDirError, check_config

    cfg = small_config(tiny_model_dir, tmp_path / "run", **{"task.eval_data": str(tmp_path / "nope.jsonl")})
    with pytest.raises(RunDirError, match=r"task.eval_data .*nope.jsonl.*no such file"):
        check_config(cfg, "my.yaml")


# ---- item 5: run directories that forgive -----------------------------------------------------------------


def small_config(model, run_dir, **overrides):
    from teamtr.training.config import TrainConfig

    return TrainConfig.from_dict(
        {"run_dir": str(run_dir), "stages": 1, "team": {"model": str(model), "lora_rank": 4}}
    ).with_overrides(overrides)


def _records(run_dir, *records):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_run_that_trained_nothing_starts_over_with_the_fixed_config(tiny_model_dir, tmp_path):
    from teamtr.training.config_file import read_config
    from teamtr.training.run_dir import RunDir, RunRestartedWarning

    cfg = small_config(tiny_model_dir, tmp_path / "run")
    RunDir.create(cfg)
    _records(tmp_path / "run", {"kind": "update", "accepted": False, "no_signal": True}, {"kind": "failed"})
    fixed = cfg.with_overrides({"rollout.temperature": 0.5})
    with pytest.warns(RunRestartedWarning, match=r"rollout.temperature: 1.0 -> 0.5.*trained 0 update"):
        run = RunDir.create(fixed)
    assert run.config.rollout.temperature == 0.5
    assert read_config(run.path / "previous" / "1" / "config.yaml").rollout.temperature == 1.0
    assert (run.path / "previous" / "1" / "metrics.jsonl").is_file()
    assert not (run.path / "metrics.jsonl").exists()  # the new run starts from nothing


def test_a_run_that_trained_names_the_keys_that_differ_and_the_flag_that_restarts(tiny_model_dir, tmp_path):
    from teamtr.training.run_dir import RunDir, RunDirError, RunRestartedWarning

    cfg = small_config(tiny_model_dir, tmp_path / "run")
    RunDir.create(cfg)
    _records(tmp_path / "run", {"kind": "update", "accepted": True})
    fixed = cfg.with_overrides({"optim.lr": 1e-3})
    with pytest.raises(RunDirError, match=r"optim.lr: 0.0002 -> 0.001.*trained 1 update.*--restart"):
        RunDir.create(fixed)
    with pytest.warns(RunRestartedWarning):
        assert RunDir.create(fixed, restart=True).config.optim.lr == 1e-3
    assert (tmp_path / "run" / "previous" / "1" / "metrics.jsonl").is_file()
    from typer.testing import CliRunner

    from teamtr.cli.main import app

    assert "--restart" in CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output


def test_a_failed_run_records_why_once(tmp_path):
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.training.run_dir import record_failure

    _records(tmp_path, {"kind": "eval", "step": 3})
    record_failure(tmp_path, KeyError("revisor"))
    record_failure(tmp_path, KeyError("revisor"))  # the last record is already the failure
    (failed,) = read_metrics(tmp_path, kind="failed")
    assert failed == {"kind": "failed", "step": 3, "where": "run", "error": "KeyError: 'revisor'"}


def test_serving_a_run_whose_graph_module_changed_warns(tmp_path, monkeypatch):
    from teamtr.cli.serve import warn_changed_code
    from teamtr.graphs.code_digest import CODE_DIGEST_FILE, changed_code, record_code_digest
    from teamtr.graphs.spec import TeamConfig

    module = tmp_path / "first_hour_graph.py"
    module.write_text("def build(models):\n    return None\n\ndef roles():\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    team = TeamConfig(graph="first_hour_graph:build", roles="first_hour_graph:roles")
    run = tmp_path / "run"
    run.mkdir()
    record_code_digest(run, team)
    assert "first_hour_graph" in json.loads((run / CODE_DIGEST_FILE).read_text())
    assert changed_code(run, team) == []
    module.write_text(module.read_text().replace("return None", "return 'new prompts'"))
    (line,) = changed_code(run, team)
    assert "first_hour_graph" in line and "changed since the run trained" in line
    assert warn_changed_code(run, team) == [line]


# ---- item 6: the docs and the demo's output ---------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_give_traces_commands_their_database():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        bare = re.findall(r"`teamtr traces (?:list|show)`", page.read_text())
        assert not bare, f"{page.name}: {bare} (the command needs the run directory or traces.db)"


def test_the_readme_quotes_the_certificate_correlation_make_demo_writes():
    training = (ROOT / "docs" / "training.md").read_text()
    (measured,) = re.findall(r"make demo certificate rank correlation: (-?\d\.\d+)", training)
    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines() if "rank correlation |" in line]
    assert f"**{measured}** in `make demo`" in row


def test_the_threads_caveat_for_the_demo_team_is_stated():
    readme = (ROOT / "README.md").read_text()
    assert "never saw a threaded context" in readme
    assert "The demo team is not a chat team" in (ROOT / "docs" / "serving.md").read_text()


def test_the_demo_table_names_the_kept_stage():
    from rich.console import Console

    from teamtr.training.demo import result_table

    def shown(selected, stages, vetoed):
        console = Console(record=True, width=120)
        before, after, last = {"accuracy": 0.45}, {"accuracy": 0.59}, {"accuracy": 0.55}
        console.print(result_table(before, after, last, selected, stages, vetoed))
        return console.export_text()

    assert "after TeamTR: stage 8 of 8 (kept)" in shown(8, 8, False)
    text = shown(5, 8, False)
    assert "stage 5 of 8 (kept)" in text and "after the last stage (8 of 8)" in text
    text = shown(5, 8, True)
    assert "warm start (kept: no stage beat it)" in text and "stage 5 of 8 (chosen, not kept)" in text


def test_a_data_run_without_held_out_tasks_is_told_so():
    from teamtr.cli.train import held_out_note
    from teamtr.training.config import TrainConfig

    cfg = TrainConfig.from_dict({"task": {"name": "mine", "data": "mine.jsonl"}})
    assert "not held out" in held_out_note(cfg) and "task.eval_data" in held_out_note(cfg)
    assert held_out_note(cfg.with_overrides({"task.eval_data": "held.jsonl"})) is None
    assert held_out_note(TrainConfig()) is None  # a task family: held-out prompts from task.eval_seed
    generator = {"task": {"name": "sum_of_two", "data": "examples.smollm2_team:task_family"}}
    assert held_out_note(TrainConfig.from_dict(generator)) is None  # the user's own generator: the same


def test_the_smollm2_example_reports_the_team_it_ends_with_and_whether_the_gain_is_beyond_noise(tmp_path):
    from examples.smollm2_team import gain

    def run(stages, reverted_to=None):
        rows = [{"kind": "eval", "episodes": 100, "accuracy": 0.35}]
        rows += [{"kind": "stage", "stage": s, "eval_after": a, "reverted_to": None} for s, a in stages]
        rows[-1]["reverted_to"] = reverted_to
        path = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        path.mkdir()
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return gain(path)

    kept = run([(1, 0.45), (2, 0.57)])
    assert kept["final_stage"] == 2 and kept["gain"] == 0.22 and kept["above_beyond_noise"]
    assert kept["ci95"][0] > 0.08  # Newcombe's interval: +8.5 points at 35% -> 57% of 100 (docs/models.md)
    reverted = run([(1, 0.57), (2, 0.30)], reverted_to=1)  # keep_best undid stage 2: the team is stage 1's
    assert reverted["final_stage"] == 1 and reverted["final"] == 0.57
    assert not run([(1, 0.45)])["above_beyond_noise"]  # +10 points on 100 prompts: within the noise
