"""examples/word_problems.py: the four-role word-problem graph's plain parts and the author's task files."""

from __future__ import annotations

import json

from examples import word_problems as wp
from teamtr.graphs.task import TaskInstance


def test_the_calculator_reads_the_first_expression_and_nothing_else():
    assert wp.calculate("Eli has 10 - 8 = 2 shells") == 2
    assert wp.calculate("3 x 4, then 5+5") == 12
    assert wp.calculate("To solve this problem, we need") is None


def test_the_reward_is_the_finalizers_last_integer():
    task = TaskInstance(id="t", prompt="Ann has 7 pens and gets 5 more. How many pens?", answer="12")
    assert wp.reward(task, {"answer": "7 + 5 = 12"}) == 1.0
    assert wp.reward(task, {"answer": "12 pens, not 7"}) == 0.0
    assert wp.reward(task, {"answer": "7", "value": 12}) == 0.5  # the calculator had it
    assert wp.reward(task, {}) == 0.0
    assert wp.verify(task, "so 12") == 1.0 and wp.verify(task, "12 or 7") == 0.0


def test_the_committed_task_files_are_what_the_example_writes(tmp_path):
    files = [(wp.TRAIN_FILE, 400, 1, "train"), (wp.HELDOUT_FILE, 100, 2, "heldout")]
    for committed, count, seed, prefix in files:
        written = tmp_path / committed.name
        wp.write_tasks(written, count, seed=seed, prefix=prefix)
        assert written.read_text() == committed.read_text()
    train = {json.loads(line)["prompt"] for line in wp.TRAIN_FILE.read_text().splitlines()}
    heldout = [json.loads(line)["prompt"] for line in wp.HELDOUT_FILE.read_text().splitlines()]
    assert len(heldout) == 100 and sum(p in train for p in heldout) < 10  # stories drawn apart
    written = tmp_path / wp.HELDOUT_LARGE_FILE.name
    wp.write_tasks(written, 300, seed=3, prefix="heldout300", unique_from=wp.TRAIN_FILE)
    assert written.read_text() == wp.HELDOUT_LARGE_FILE.read_text()
    large = [json.loads(line)["prompt"] for line in written.read_text().splitlines()]
    assert len(set(large)) == 300 and not set(large) & train  # none seen in training, none twice
