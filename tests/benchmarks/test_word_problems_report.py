"""benchmarks/word_problems_report.py: issue 34's decision rule on seeds' per-task changes."""

import json

import pytest

from benchmarks.word_problems_report import decide, per_task_change


def _changes(per_seed: list[list[float]]) -> dict[str, dict[str, float]]:
    return {f"seed{s}": {f"t{i}": v for i, v in enumerate(vals)} for s, vals in enumerate(per_seed)}


def test_every_seed_up_and_pooled_interval_above_zero_learns():
    up = [1.0] * 30 + [0.0] * 260 + [-1.0] * 10  # +6.7 points on 300 tasks
    assert decide(_changes([up, up, up]))["decision"] == "learns beyond noise"


def test_one_seed_at_or_below_its_start_is_not_learning_beyond_noise():
    up = [1.0] * 40 + [0.0] * 260
    flat = [1.0] * 10 + [0.0] * 280 + [-1.0] * 10
    assert decide(_changes([up, up, flat]))["decision"] == "inconclusive"


def test_a_seed_whose_interval_lies_below_zero_does_not_learn():
    up = [1.0] * 40 + [0.0] * 260
    down = [0.0] * 260 + [-1.0] * 40
    assert decide(_changes([up, up, down]))["decision"] == "does not learn"


def test_no_change_anywhere_does_not_learn():
    noise = [1.0] * 2 + [0.0] * 296 + [-1.0] * 2
    assert decide(_changes([noise, noise, noise]))["decision"] == "does not learn"


def test_seeds_on_different_tasks_are_refused():
    changes = _changes([[0.0] * 10, [0.0] * 10])
    changes["seed1"]["other"] = changes["seed1"].pop("t0")
    with pytest.raises(ValueError, match="same tasks"):
        decide(changes)


def test_per_task_change_pairs_before_and_after_by_task(tmp_path):
    (tmp_path / "before").mkdir()
    rows = lambda rewards: "".join(  # noqa: E731
        json.dumps({"id": f"t{i}", "rewards": [r]}) + "\n" for i, r in enumerate(rewards)
    )
    (tmp_path / "episodes.jsonl").write_text(rows([1.0, 0.0, 1.0]))
    (tmp_path / "before" / "episodes.jsonl").write_text(rows([0.0, 0.0, 1.0]))
    assert per_task_change(tmp_path) == {"t0": 1.0, "t1": 0.0, "t2": 0.0}
