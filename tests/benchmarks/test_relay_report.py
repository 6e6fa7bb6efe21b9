"""benchmarks/relay_report.py: the preregistered decision rule read off the relay study's cells (paired t
over seeds, the lab's prediction at the radius nearest delta_eff), and "pending" while cells are missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from relay_report import (  # noqa: E402
    analyse,
    cost_rows,
    decide,
    decide_delta06,
    paired_t,
    secondary,
    secondary_markdown,
    table_markdown,
)
from relay_study import RelayStudyConfig  # noqa: E402

CONFIG = RelayStudyConfig(sizes=[4, 6, 2], deltas=[0.3], seeds=3, cell_seeds={})


def prediction(gap: float) -> list[dict]:
    return [
        {"delta": r, "gap": gap if r > 0.1 else 0.0, "band": [gap - 0.02, gap + 0.02]} for r in (0.05, 0.3)
    ]


def cells(
    gaps: dict[str, list[float]], predicted: float = 0.6, warm: float = 0.3, delta: float = 0.3
) -> dict[str, dict]:
    """One setting per key of `gaps` ('n4/l0'): TeamTR = warm + 0.1 + gap_s, naive = warm + 0.1 per seed."""
    out = {}
    for setting, per_seed in gaps.items():
        n, legibility = setting.split("/")
        out[f"{setting}/warm"] = {"accuracy_t1": warm, "lab_prediction": prediction(predicted)}
        for s, g in enumerate(per_seed):
            base = {"delta_eff": [0.25, 0.35], "rejected_fraction": 0.0, "curve_t1": [warm, warm + 0.1]}
            for arm, acc in (("teamtr", warm + 0.1 + g), ("naive", warm + 0.1), ("sequential_grpo", warm)):
                out[f"{setting}/d{delta:g}/seed{s}/{arm}"] = {**base, "accuracy_t1": acc}
    return out


def test_paired_t_interval():
    out = paired_t([0.087, -0.007, -0.026, 0.198, -0.072])  # the n = 4, delta 0.3 cell's five seeds
    assert out["mean"] == pytest.approx(0.036)
    assert out["ci95"] == pytest.approx([-0.0973, 0.1693], abs=5e-4)
    assert paired_t([0.1])["ci95"] is None


def test_the_rule_refutes_when_the_big_cells_include_0_and_exclude_the_prediction():
    noisy = [0.05, -0.04, 0.01]
    rows = analyse(CONFIG, cells({"n4/l0": noisy, "n6/l0": noisy}))
    assert decide(rows)["rule"] == "refuted"
    assert rows[0]["prediction"] == {"radius": 0.3, "gap": 0.6, "band": [0.58, 0.62]}  # delta_eff 0.3
    assert rows[0]["matches"] is False and "**refuted**" in table_markdown(rows, decide(rows))


def test_the_rule_supports_a_gap_that_excludes_0_grows_with_n_and_vanishes_in_the_control():
    data = cells({"n4/l0": [0.30, 0.32, 0.31], "n6/l0": [0.40, 0.42, 0.41], "n2/l0": [0.2, 0.22, 0.21]})
    data.update(cells({"n4/l1": [0.01, -0.01, 0.0]}))
    rows = analyse(CONFIG, data)
    assert decide(rows) == {"rule": "supported", "lab_matched_reading": "supported"}
    flat_in_n = cells({"n4/l0": [0.40, 0.42, 0.41], "n6/l0": [0.30, 0.32, 0.31], "n2/l0": [0.2, 0.22, 0.21]})
    flat_in_n.update(cells({"n4/l1": [0.01, -0.01, 0.0]}))
    assert decide(analyse(CONFIG, flat_in_n))["rule"] == "inconclusive"  # excludes 0 but does not grow


def test_a_gap_of_the_wrong_sign_is_inconclusive_by_the_rule_and_not_supported_by_the_lab_reading():
    """Naive ahead beyond noise at n = 6: not "refuted" (its interval excludes 0), never "supported",
    whatever the control and n = 2 show: both are decided before those cells run."""
    rows = analyse(CONFIG, cells({"n4/l0": [0.05, -0.04, 0.01], "n6/l0": [-0.09, -0.11, -0.10]}))
    assert decide(rows) == {"rule": "inconclusive", "lab_matched_reading": "not supported"}


def test_missing_cells_leave_the_rule_pending():
    data = cells({"n4/l0": [0.05, -0.04, 0.01], "n6/l0": [0.05, -0.04]})  # n = 6 has 2 of its 3 seeds
    rows = analyse(CONFIG, data)
    assert decide(rows)["rule"] == "pending"
    assert [r["seeds_done"] for r in rows[:2]] == [3, 2]


def test_secondary_arms_are_paired_with_teamtr_and_token_counts_divide_by_naive():
    data = cells({"n4/l0": [0.05, -0.04, 0.01]})
    for s in range(2):  # two of the three seeds have the secondary arms
        teamtr = data[f"n4/l0/d0.3/seed{s}/teamtr"]
        teamtr["train_tokens"] = 1000
        data[f"n4/l0/d0.3/seed{s}/naive_tokens"] = {"accuracy_t1": teamtr["accuracy_t1"] - 0.1, "stages": 12,
                                                    "train_tokens": 1100, "train_prefill_tokens": 400,
                                                    "train_pass_tokens": 5000}  # fmt: skip
    (row,) = secondary(CONFIG, data)
    naive = row["naive_tokens"]
    assert naive["seeds"] == [0, 1] and naive["minus_teamtr"]["mean"] == pytest.approx(-0.1)
    assert naive["tokens_over_teamtr"] == [1.1, 1.1] and naive["counts"][0] == (1100, 1500, 6500)
    assert row["teamtr_reversed"]["seeds"] == []  # none ran: no row of it in the table
    one_stage = {
        "n4/l0/d0.05/seed0/naive": {"key": "n4/l0/d0.05/seed0/naive", "n": 4, "arm": "naive", "stages": 1,
                                    "train_tokens": 100, "train_prefill_tokens": 50, "train_pass_tokens": 850},
        "n4/l0/d0.05/seed0/teamtr": {"key": "n4/l0/d0.05/seed0/teamtr", "n": 4, "arm": "teamtr", "stages": 1,
                                     "train_tokens": 300, "train_prefill_tokens": 100, "train_pass_tokens": 900},
    }  # fmt: skip
    costs = {c["arm"]: c for c in cost_rows(one_stage)}
    assert costs["teamtr"]["over_naive"] == pytest.approx([3.0, 400 / 150, 1300 / 1000])
    text = secondary_markdown([row], list(costs.values()))
    assert "| n4/l0/d0.3 | naive_tokens | 2 |" in text and "x3.00 / x2.67 / x1.30" in text


DELTA06 = RelayStudyConfig(sizes=[4, 2], deltas=[0.6], seeds=3, cell_seeds={})


def test_the_addendum_rule_supports_refutes_and_waits_for_the_control():
    def rule(n4: list[float], control: list[float] | None = None, skip: frozenset = frozenset()) -> str:
        data = cells({"n4/l0": n4, "n2/l0": [0.0, 0.01, 0.02]}, delta=0.6)
        if control is not None:
            data.update(cells({"n4/l1": control}, delta=0.6))
        return decide_delta06(analyse(DELTA06, data, skip))["rule"]

    assert rule([0.06, 0.08, 0.07]) == "pending (the l = 1 control)"
    assert rule([0.06, 0.08, 0.07], [0.01, -0.01, 0.0]) == "supported"
    assert rule([0.06, 0.08, 0.07], [0.05, 0.06, 0.07]) == "inconclusive"  # the control moved too
    assert rule([0.01, -0.01, 0.0]) == "refuted"  # upper end below +5 points: no large margin
    assert rule([0.2, -0.1, 0.05]) == "inconclusive"  # includes 0 and +5
    assert rule([0.06, 0.08, 0.07, -0.3], [0.0, 0.0, 0.0], frozenset({3})) == "supported"  # seed 3 left out
    assert rule([0.06, 0.08]) == "pending"  # seed 2 of n = 4 missing


def test_the_primary_pair_is_read_before_the_other_arms_have_run():
    """Issue 37's script runs TeamTR and naive everywhere first: their gap needs no GRPO or shared cell."""
    data = cells({"n4/l0": [0.06, 0.08, 0.07]}, delta=0.6)
    for s in range(3):
        del data[f"n4/l0/d0.6/seed{s}/sequential_grpo"]
    data["n4/l0/d0.6/seed0/shared_adapter"] = {**data["n4/l0/d0.6/seed0/naive"], "accuracy_t1": 0.35}
    (row,) = [r for r in analyse(DELTA06, data) if r["setting"] == "n4/l0/d0.6"]
    assert row["seeds_done"] == 3 and row["teamtr_minus_naive"]["mean"] == pytest.approx(0.07)
    assert row["teamtr_minus_sequential_grpo"]["seeds"] == 0
    assert row["teamtr_minus_shared_adapter"]["per_seed"] == pytest.approx([0.3 + 0.1 + 0.06 - 0.35])
    decision = decide_delta06([row])
    assert decision["teamtr_within_delta"] == "yes"  # the helper's delta_eff 0.25 / 0.35: inside 0.6
    assert decision["naive_median_delta_eff_n4"].startswith("0.300")
    assert "| n4/l0/d0.6 | 3/3 |" in table_markdown([row], decision)
    data["n4/l0/d0.6/seed1/teamtr"]["delta_eff"] = [0.7, 0.2]  # 1 of 6 updates beyond: more than 5%
    assert decide_delta06(analyse(DELTA06, data))["teamtr_within_delta"] == "no"
