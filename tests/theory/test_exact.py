"""The exact theory lab's dynamic programming, trust-region step and stage-loop wiring."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teamtr.theory.env import (
    TeamInstance,
    chain_instance,
    chain_warm_logits,
    random_instance,
    random_logits,
)
from teamtr.theory.exact import (
    evaluate,
    policies,
    trajectory_ess_fraction,
    trust_region_step,
    weighted_kl,
)
from teamtr.theory.team import TabularTeam, train
from teamtr.training.stage import ScheduleConfig

seeds = st.integers(0, 2**32 - 1)


def tiny_team(seed: int) -> tuple[TeamInstance, list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    instance = random_instance(
        rng,
        n_agents=int(rng.integers(1, 3)),
        n_messages=int(rng.integers(2, 4)),
        contexts=int(rng.integers(1, 3)),
        horizon=int(rng.integers(1, 4)),
        gamma=float(rng.uniform(0.5, 1.0)),
    )
    return instance, random_logits(instance, rng, 2.0), random_logits(instance, rng, 2.0)


def enumerate_episodes(instance: TeamInstance, pi: list[np.ndarray]):
    """Every episode (contexts s_0..s_T, messages m_0..m_{T-1}) with its probability, by brute force."""
    T = instance.horizon
    sizes = [len(instance.initial)] + [P.shape[2] for P in instance.transitions]
    M = instance.n_messages
    for contexts in itertools.product(*(range(k) for k in sizes)):
        for messages in itertools.product(range(M), repeat=T):
            prob = instance.initial[contexts[0]]
            for t in range(T):
                prob *= (
                    pi[t][contexts[t], messages[t]]
                    * instance.transitions[t][contexts[t], messages[t], contexts[t + 1]]
                )
            if prob > 0:
                yield contexts, messages, prob


@settings(max_examples=60, deadline=None)
@given(seeds)
def test_exact_values_match_brute_force_enumeration(seed: int) -> None:
    instance, logits, _ = tiny_team(seed)
    ev = evaluate(instance, logits)
    T, gamma = instance.horizon, instance.gamma
    J, visits = 0.0, [np.zeros_like(p) for p in ev.p]
    for contexts, _messages, prob in enumerate_episodes(instance, ev.policy):
        J += prob * gamma ** (T - 1) * instance.reward[contexts[T]]
        for t in range(T):
            visits[t][contexts[t]] += prob
    assert ev.J == pytest.approx(J, abs=1e-12)
    for p, v in zip(ev.p, visits, strict=True):
        np.testing.assert_allclose(p, v, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(seeds)
def test_performance_difference_identity_is_exact(seed: int) -> None:
    instance, old_logits, new_logits = tiny_team(seed)
    old, new = evaluate(instance, old_logits), evaluate(instance, new_logits)
    predicted = sum(
        (d * (pi * A).sum(axis=1)).sum() for d, pi, A in zip(new.d, new.policy, old.A, strict=True)
    )
    assert new.J - old.J == pytest.approx(predicted, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seeds)
def test_episode_ess_matches_brute_force(seed: int) -> None:
    instance, behaviour_logits, target_logits = tiny_team(seed)
    behaviour, target = policies(behaviour_logits), policies(target_logits)
    target_prob = {(c, m): p for c, m, p in enumerate_episodes(instance, target)}
    second_moment = sum(
        target_prob.get((c, m), 0.0) ** 2 / p for c, m, p in enumerate_episodes(instance, behaviour)
    )
    assert trajectory_ess_fraction(instance, behaviour, target) == pytest.approx(
        1.0 / second_moment, rel=1e-10
    )


@settings(max_examples=100, deadline=None)
@given(seeds, st.floats(1e-3, 1.0))
def test_trust_region_step_moves_only_the_agent_and_lands_on_the_boundary(seed: int, delta: float) -> None:
    instance, logits, _ = tiny_team(seed)
    ev = evaluate(instance, logits)
    mask = instance.agent_mask(0)
    step = trust_region_step(logits, mask, ev.d, ev.A, delta)
    for z_old, z_new, m in zip(logits, step.logits, mask, strict=True):
        np.testing.assert_array_equal(z_old[~m], z_new[~m])  # other agents keep their weights
    weights = [np.where(m, d, 0.0) for d, m in zip(ev.d, mask, strict=True)]
    total = sum(w.sum() for w in weights)
    if total > 0:
        weights = [w / total for w in weights]
    kl = weighted_kl(weights, ev.policy, policies(step.logits))
    assert kl <= delta * (1 + 1e-9)
    assert step.surrogate >= -1e-12  # an ascent step never loses on its own batch
    if total > 0 and 0 < step.eta < 1e4:  # the agent is reached and A is not flat: the boundary
        assert kl == pytest.approx(delta, rel=1e-6)


def test_bad_input_is_rejected_with_a_clear_error() -> None:
    rng = np.random.default_rng(0)
    instance = random_instance(rng, n_agents=2, horizon=2)
    with pytest.raises(ValueError, match="gamma"):
        TeamInstance(
            2, 3, instance.initial, instance.transitions, instance.router, instance.reward, gamma=1.5
        )
    with pytest.raises(ValueError, match="reward"):
        TeamInstance(2, 3, instance.initial, instance.transitions, instance.router, instance.reward + 2.0)
    with pytest.raises(ValueError, match="delta"):
        TabularTeam(instance, random_logits(instance, rng), delta=0.0)
    with pytest.raises(ValueError, match="unknown role"):
        instance.agent_index("critic")


def chain_team(n: int, seed: int = 0, delta: float = 0.01) -> TabularTeam:
    rng = np.random.default_rng(seed)
    instance = chain_instance(n, rng, rounds=2)
    return TabularTeam(instance, chain_warm_logits(instance, rng), delta)


@pytest.mark.parametrize(
    ("kind", "later_data"),
    [("teamtr", "fresh"), ("naive", "stale"), ("importance_weighting", "reweighted"), ("joint", "joint")],
)
def test_the_shared_stage_loop_feeds_each_schedule_its_batches(kind: str, later_data: str) -> None:
    team = chain_team(4)
    stages = train(team, ScheduleConfig(kind=kind), stages=2)  # type: ignore[arg-type]
    for stage in stages:
        assert [u.index for u in stage.updates] == [1, 2, 3, 4]
        assert {u.data for u in stage.updates[1:]} == {later_data}
        assert stage.rollouts == (4 if kind == "teamtr" else 1)
    assert len(team.records) == 8


def test_naive_and_teamtr_differ_only_after_the_first_update() -> None:
    naive, fresh = chain_team(5), chain_team(5)
    (naive_stage,) = train(naive, ScheduleConfig(kind="naive"), stages=1)
    (fresh_stage,) = train(fresh, ScheduleConfig(kind="teamtr"), stages=1)
    first_naive, first_fresh = naive_stage.updates[0], fresh_stage.updates[0]
    assert first_naive.improvement == pytest.approx(first_fresh.improvement, abs=1e-15)
    assert first_naive.surrogate_stale == pytest.approx(first_naive.surrogate_intermediate, abs=1e-15)
    later = naive_stage.updates[-1]
    assert later.surrogate_stale != pytest.approx(later.surrogate_intermediate, abs=1e-9)
    assert later.occupancy_shift_from_start > 0


def test_naive_sequential_equals_joint_for_tabular_agents() -> None:
    # Each agent owns its contexts, and a stale step only reads pi^0's batch: the naive stage is the joint one.
    naive, joint = chain_team(4), chain_team(4)
    train(naive, ScheduleConfig(kind="naive"), stages=1)
    train(joint, ScheduleConfig(kind="joint"), stages=1)
    for a, b in zip(naive.logits, joint.logits, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_teamtr_keeps_the_trust_region_on_the_contexts_it_acts_on_and_naive_leaks() -> None:
    teamtr, naive = chain_team(6, delta=0.01), chain_team(6, delta=0.01)
    train(teamtr, ScheduleConfig(kind="teamtr"), stages=2)
    train(naive, ScheduleConfig(kind="naive"), stages=2)
    assert max(u.kl_intermediate for u in teamtr.records) <= 0.01 * (1 + 1e-9)
    assert max(u.kl_batch for u in naive.records) <= 0.01 * (1 + 1e-9)  # inside the region on its stale batch
    assert max(u.kl_intermediate for u in naive.records) > 0.01 * 1.05  # outside it where the agent acts
