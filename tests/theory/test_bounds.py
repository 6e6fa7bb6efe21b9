"""Property tests: TeamTR's bounds (in the finite-horizon form of theory/bounds.py) are never
violated by the exact improvement on thousands of random teams, and a wrong constant is caught."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from teamtr.cli.theory import app
from teamtr.theory.bounds import BOUND_NAMES, BoundConstants, BoundForm, check_stage
from teamtr.theory.cases import check_case, random_case, speak_once_case
from teamtr.theory.env import chain_instance, chain_warm_logits, random_instance, random_logits
from teamtr.theory.team import TabularTeam, train
from teamtr.training.stage import ScheduleConfig

seeds = st.integers(0, 2**32 - 1)


def violated(checks, names=BOUND_NAMES) -> list[str]:
    return [
        f"{c.name} stage {c.stage} update {c.index}: {c.lhs:.6g} < {c.rhs:.6g}"
        for c in checks
        if c.name in names and c.violated
    ]


@settings(max_examples=2000, deadline=None)
@given(seeds)
def test_no_bound_is_ever_violated_on_random_teams(seed: int) -> None:
    # occupancy shift, Thm 3.4 (paper constant and exact-eps form), Thm 3.6, Prop 3.3, Thm 3.7
    checks = check_case(random_case(np.random.default_rng(seed)))
    assert {c.name for c in checks} >= set(BOUND_NAMES)
    assert violated(checks) == []


@settings(max_examples=60, deadline=None)
@given(
    seeds,
    st.integers(2, 6),
    st.sampled_from(["teamtr", "naive", "importance_weighting"]),
    st.floats(1e-3, 0.5),
)
def test_no_bound_is_violated_on_larger_chain_teams(seed: int, n: int, kind: str, delta: float) -> None:
    rng = np.random.default_rng(seed)
    instance = chain_instance(n, rng, rounds=2)
    team = TabularTeam(instance, chain_warm_logits(instance, rng, competence=float(rng.uniform(0, 4))), delta)
    constants = BoundConstants.of(instance)
    for stage in train(team, ScheduleConfig(kind=kind), stages=2, seed=seed):  # type: ignore[arg-type]
        assert violated(check_stage(stage.updates, constants)) == []


def first_violation(form: BoundForm, names: tuple[str, ...], budget: int = 3000) -> str | None:
    """Search the same random teams as the property test for a violation of a (wrong) bound."""
    for k in range(budget):
        found = violated(check_case(random_case(np.random.default_rng([7, k])), form), names)
        if found:
            return found[0]
    return None


@pytest.mark.parametrize(
    ("form", "names"),
    [
        (BoundForm(c_scale=0.1), ("occupancy_shift",)),  # c/10
        (BoundForm(c_scale=0.1), ("thm34_tight",)),
        (BoundForm(c_scale=0.1), ("prop33",)),
        (BoundForm(power=1.0), ("occupancy_shift",)),  # delta instead of sqrt(delta)
        (BoundForm(c_scale=1 / 50), ("thm34",)),  # the paper-constant Thm 3.4 is loose: c/50 is caught
        (BoundForm(c_scale=0.1), ("thm34_own",)),  # the own-turn constant c_own / 10
        (BoundForm(assume_speak_once=True), ("thm34_own", "thm36_own")),  # speak-once form on any team
    ],
)
def test_a_wrong_constant_makes_the_check_fail(form: BoundForm, names: tuple[str, ...]) -> None:
    assert first_violation(form, names) is not None


def test_the_stale_surrogate_error_grows_with_the_updates_before_it() -> None:
    # Prop 3.3's right-hand side grows with i; so does the exact |L_i - L_i^stale| on a chain team.
    rng = np.random.default_rng(3)
    instance = chain_instance(6, rng, rounds=2)
    team = TabularTeam(instance, chain_warm_logits(instance, rng), 0.05)
    (stage,) = train(team, ScheduleConfig(kind="naive"), stages=1)
    gaps = [abs(u.surrogate_intermediate - u.surrogate_stale) for u in stage.updates]
    assert gaps[0] == pytest.approx(0.0, abs=1e-15)
    assert gaps[-1] > gaps[1] > 0


@settings(max_examples=500, deadline=None)
@given(seeds)
def test_the_speak_once_bound_is_an_equality_on_speak_once_teams(seed: int) -> None:
    # every agent speaks on one turn: c_own = 0 and J(pi^i) - J(pi^(i-1)) = L_i exactly, per update and
    # summed over the stage; every other bound still holds
    case = speak_once_case(np.random.default_rng(seed))
    assert BoundConstants.of(case.instance).speak_once
    checks = check_case(case)
    assert violated(checks) == []
    own = [c for c in checks if c.name in ("thm34_own", "thm36_own")]
    assert own and all(c.penalty == 0.0 for c in own)
    assert max(abs(c.lhs - c.base) for c in own) < 1e-12


def test_the_speak_once_form_is_violated_on_a_two_round_team() -> None:
    # a two-round round-robin team: an agent's update moves the contexts of its own second turn, so
    # dropping the own-turn penalty (c_own = 0) is caught; the true c_own > 0 covers it. (On chain teams
    # the shift only ever helps - more intact chains - so a random team is needed.)
    rng = np.random.default_rng(0)
    instance = random_instance(rng, n_agents=2, horizon=4, round_robin=True)
    constants = BoundConstants.of(instance)
    assert not constants.speak_once and min(constants.W_own.values()) > 0
    team = TabularTeam(instance, random_logits(instance, rng, 2.0), 0.5)
    (stage,) = train(team, ScheduleConfig(kind="teamtr"), stages=1)
    wrong = check_stage(stage.updates, constants, BoundForm(assume_speak_once=True))
    assert violated(wrong, ("thm34_own", "thm36_own"))
    assert violated(check_stage(stage.updates, constants)) == []


def test_the_check_command_on_speak_once_teams() -> None:
    # `teamtr theory check --speak-once`: 0 violations, the own-turn penalty is 0 (used share -inf);
    # `--assume-speak-once` on the general random teams is caught
    def run(*args: str) -> dict:
        result = CliRunner().invoke(app, ["check", "--instances", "100", "--json", *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    once = run("--speak-once")
    assert once["teams"] == "speak_once" and all(v == 0 for v in once["violations"].values())
    assert once["checks"]["thm34_own"] >= 100 and once["max_used_fraction"]["thm34_own"] == float("-inf")
    wrong = run("--assume-speak-once")
    assert wrong["violations"]["thm34_own"] > 0 and wrong["form"]["assume_speak_once"]
