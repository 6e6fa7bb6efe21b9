"""pass@k / avg@k estimators and their intervals; the harness on runners that are plain functions."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teamtr.evals.harness import Episode, best_of_n, evaluate, matched_n, responses_file_runner
from teamtr.evals.metrics import bootstrap_mean, pass_at_k, pass_at_k_curve, summarize
from teamtr.tasks import get_task


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 8), data=st.data())
def test_pass_at_k_equals_the_fraction_of_k_subsets_holding_a_correct_sample(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=4, max_size=4), min_size=1, max_size=20))
def test_summary_intervals_contain_the_estimate(rewards):
    s = summarize(rewards, k=4)
    for key in ("pass_at_k", "avg_at_k"):
        assert 0.0 <= s[key]["low"] <= s[key]["value"] <= s[key]["high"] <= 1.0
    assert s["pass_at_k"]["value"] >= s["avg_at_k"]["value"]
    curve = pass_at_k_curve(rewards)
    assert list(curve) == [1, 2, 3, 4] and all(a <= b + 1e-12 for a, b in itertools.pairwise(curve.values()))


def test_bootstrap_interval_narrows_with_more_instances():
    few = bootstrap_mean([0, 1] * 5)
    many = bootstrap_mean([0, 1] * 200)
    assert many.high - many.low < few.high - few.low
    with pytest.raises(ValueError, match="k="):
        summarize([[1.0]], k=2)


def _answer_every_other(instances, samples):
    """A runner: right on even samples, wrong on odd ones; 10 tokens per answer."""
    return [
        [Episode(inst.answer if g % 2 == 0 else "z9", completion_tokens=10) for g in range(samples)]
        for inst in instances
    ]


def test_evaluate_scores_with_the_family_verifier_and_breaks_down_by_difficulty():
    family = get_task("split")
    instances = family.generate(4, 0, hops=1) + family.generate(4, 0, hops=2)
    result = evaluate(family, instances, _answer_every_other, k=2, batch_size=3, progress=False)
    assert result.episodes == 16 and result.instances == 8
    assert result.pass_at_k["value"] == 1.0 and result.avg_at_k["value"] == 0.5
    assert result.pass_at_k_curve == {1: 0.5, 2: 1.0}
    assert set(result.by_difficulty) == {"hops=1,size=4", "hops=2,size=4"}
    assert result.tokens_per_episode == 10


def test_the_team_majority_vote_counts_the_most_common_answer_not_any_right_one():
    family = get_task("split")
    instances = family.generate(4, 0)

    def runner(right: int):
        def answers(instances, samples):
            return [
                [Episode(inst.answer if g < right else "z9", completion_tokens=10) for g in range(samples)]
                for inst in instances
            ]

        return answers

    mostly_right = evaluate(family, instances, runner(2), k=3, progress=False)
    once_right = evaluate(family, instances, runner(1), k=3, progress=False)
    assert mostly_right.majority_at_k["value"] == 1.0 and mostly_right.pass_at_k["value"] == 1.0
    assert once_right.majority_at_k["value"] == 0.0 and once_right.pass_at_k["value"] == 1.0


def test_best_of_n_matches_the_team_token_budget():
    family = get_task("split")
    instances = family.generate(5, 1)
    team = evaluate(family, instances, _answer_every_other, k=4, progress=False)  # 4 x 10 team tokens

    def single(instances, samples):  # 20 tokens per answer, always wrong
        return [[Episode("z9", completion_tokens=20) for _ in range(samples)] for _ in instances]

    report = best_of_n(family, instances, single, team, progress=False)
    assert report["n"] == matched_n(10, 20, 4) == 2
    assert report["single_budget"] == pytest.approx(report["team_budget"])
    assert report["best_of_n"]["value"] == 0.0 and report["majority_at_n"]["value"] == 0.0


def test_responses_file_runner_replays_answers_and_reports_missing_ones(tmp_path):
    family = get_task("arbench")
    instances = family.generate(3, 0)
    path = tmp_path / "responses.jsonl"
    rows = [{"id": x.id, "response": x.answer} for x in instances] + [
        {"id": instances[0].id, "response": "0"}
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    result = evaluate(family, instances[:1], responses_file_runner(path), k=2, progress=False)
    assert result.records[0].rewards == [1.0, 0.0]
    with pytest.raises(ValueError, match="need 2"):
        evaluate(family, instances, responses_file_runner(path), k=2, progress=False)
    path.write_text('{"response": "x"}')
    with pytest.raises(ValueError, match="'id'"):
        responses_file_runner(path)
