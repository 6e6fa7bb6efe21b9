"""The traps a new user met in their first hour (issue 34 items 2-6), each pinned by a test that fails if it
comes back. Fast: no model is trained here."""

from __future__ import annotations

from typing import Any

from teamtr.training.progress import no_signal_warning, trained_updates, update_line


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


def test_first_updates_without_reward_spread_warn_with_the_likely_causes():
    quiet = [update(True, False), update(True, False)]
    warning = no_signal_warning(quiet, temperature=1.0)
    assert warning is not None
    assert "rollout.temperature is 1" in warning and "too hard for the base" in warning
    assert "every episode scored 0" in warning
    assert no_signal_warning(quiet[:1], 1.0) is None  # not before the first batches are in
    assert no_signal_warning([update(True, False), update(False, True, 0.5)], 1.0) is None


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
