"""The convention family of the exact lab (theory/env.py): its exact return on a hand-checkable
team, observation-tied policies staying tied through the shared stage loop, TeamTR's bounds on it, and
the return gap between TeamTR and naive sequential that chain teams do not show (docs/theory.md 5b)."""

from __future__ import annotations

import numpy as np
import pytest

from teamtr.theory.bounds import BOUND_NAMES, BoundConstants, check_stage
from teamtr.theory.env import TeamInstance, convention_instance, convention_warm_logits
from teamtr.theory.exact import evaluate, policies
from teamtr.theory.scaling import ScalingConfig, run_one
from teamtr.theory.team import TabularTeam, train
from teamtr.training.stage import ScheduleConfig


def softmax(z: list[float]) -> np.ndarray:
    e = np.exp(np.asarray(z, float))
    return e / e.sum()


def two_role_logits(first: list[float], legible: list[list[float]], blind: list[float]) -> list[np.ndarray]:
    """Turn 0: one context; turn 1: contexts 0..1 (offset readable), 2..3 (not: one shared row)."""
    return [np.array([first]), np.array([*legible, blind, blind])]


def test_exact_return_of_a_blind_two_role_team_is_the_hand_sum() -> None:
    # role 0 slips (switches) with probability p1; role 1 cannot read the offset and switches with q1:
    # the episode ends in the starting convention iff both switch or neither does.
    instance = convention_instance(2, rounds=1, conventions=2, legibility=0.0)
    p, q = softmax([0.3, -0.4]), softmax([1.2, 0.1])
    logits = two_role_logits([0.3, -0.4], [[5.0, 0.0], [0.0, 5.0]], [1.2, 0.1])
    assert evaluate(instance, logits).J == pytest.approx(p[0] * q[0] + p[1] * q[1], abs=1e-14)


def test_exact_return_of_a_readable_two_role_team_is_the_hand_sum() -> None:
    # legibility 1: role 1 sees the offset; from offset o it restores 0 with its own readable row
    instance = convention_instance(2, rounds=1, conventions=2, legibility=1.0)
    p, keep, back = softmax([0.3, -0.4]), softmax([2.0, -1.0]), softmax([0.5, 1.5])
    logits = two_role_logits([0.3, -0.4], [[2.0, -1.0], [0.5, 1.5]], [0.0, 0.0])
    assert evaluate(instance, logits).J == pytest.approx(p[0] * keep[0] + p[1] * back[1], abs=1e-14)


def test_three_conventions_two_corrections_of_one_slip_are_a_new_error() -> None:
    # C = 3, blind roles 1 and 2 switch back (m = 2) with certainty after a certain slip (m = 1)
    instance = convention_instance(3, rounds=1, conventions=3, legibility=0.0)
    big = 50.0
    slip, back = [0.0, big, 0.0], [0.0, 0.0, big]
    logits = [np.array([slip]), np.tile(back, (6, 1)), np.tile(back, (6, 1))]
    assert evaluate(instance, logits).J == pytest.approx(0.0, abs=1e-12)  # 1 + 2 + 2 = 2 mod 3
    logits[2] = np.tile([big, 0.0, 0.0], (6, 1))  # only one role corrects
    assert evaluate(instance, logits).J == pytest.approx(1.0, abs=1e-12)


def test_contexts_sharing_an_observation_must_share_a_speaker() -> None:
    good = convention_instance(2, rounds=1, conventions=2, legibility=0.5)
    router = [good.router[0], np.array([1, 1, 0, 1])]  # an unreadable context given to another role
    with pytest.raises(ValueError, match="different speakers"):
        TeamInstance(2, 2, good.initial, good.transitions, router, good.reward, observation=good.observation)


@pytest.mark.parametrize("kind", ["teamtr", "naive", "joint", "importance_weighting"])
def test_updates_keep_policies_tied_and_bounds_hold(kind: str) -> None:
    rng = np.random.default_rng(3)
    instance = convention_instance(4, rounds=2, conventions=3, legibility=0.3)
    team = TabularTeam(instance, convention_warm_logits(instance, rng), delta=0.05)
    j0 = team.evaluation().J
    stages = train(team, ScheduleConfig(kind=kind), stages=2)  # type: ignore[arg-type]
    for obs, pi in zip(instance.observation or [], policies(team.logits), strict=True):
        for o in np.unique(obs):
            assert np.allclose(pi[obs == o], pi[obs == o][0], atol=1e-12)
    assert team.evaluation().J > j0
    if kind != "joint":
        constants = BoundConstants.of(instance)
        for stage in stages:
            checks = check_stage(stage.updates, constants)
            assert {c.name for c in checks} >= set(BOUND_NAMES)
            assert [c for c in checks if c.name in BOUND_NAMES and c.violated] == []


def mean_return_gap(family: str, n: int, seeds: range, delta: float) -> float:
    cfg = ScalingConfig(agents=[n, n + 1], seeds=len(seeds), delta=delta, family=family)
    gaps = []
    for seed in seeds:
        teamtr = run_one(cfg, n, seed, "teamtr")[0].return_final
        naive = run_one(cfg, n, seed, "naive")[0].return_final
        gaps.append(teamtr - naive)
    return float(np.mean(gaps))


def test_teamtr_beats_naive_on_convention_teams_where_chain_teams_show_no_gap() -> None:
    convention = mean_return_gap("convention", 4, range(3), delta=0.05)
    chain = mean_return_gap("chain", 4, range(3), delta=0.05)
    assert convention > 0.05
    assert convention > chain + 0.05


def test_scaling_command_runs_the_convention_family(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from teamtr.cli.theory import app

    args = ["scaling", "--family", "convention", "--agents", "2,4", "--seeds", "2", "--delta", "0.05"]
    result = CliRunner().invoke(app, [*args, "--json", "--out", str(tmp_path / "s.png")])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["config"]["family"] == "convention"
    assert [row["n"] for row in out["table"]] == [2, 4]
    assert out["table"][1]["return_gap"]["mean"] > 0 and out["table"][1]["return_gap"]["seeds"] == 2
    bad = CliRunner().invoke(app, ["scaling", "--family", "nope", "--out", str(tmp_path / "t.png")])
    assert bad.exit_code != 0
