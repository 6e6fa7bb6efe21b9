"""Suffix resampling equals full resampling of the updated team in distribution, exactly
(theory/suffix.py), and keeping the stale suffix does not."""

from __future__ import annotations

import numpy as np
import pytest

from teamtr.theory.env import random_instance, random_logits
from teamtr.theory.suffix import episode_distribution, suffix_resampled_distribution
from teamtr.theory.team import TabularTeam, train
from teamtr.training.stage import ScheduleConfig


def _tv(a: dict, b: dict) -> float:
    return sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("seed", range(25))
def test_suffix_resampling_is_full_resampling_of_the_new_team(seed: int) -> None:
    rng = np.random.default_rng(seed)
    instance = random_instance(
        rng,
        n_agents=int(rng.integers(1, 4)),
        n_messages=int(rng.integers(2, 4)),
        contexts=int(rng.integers(1, 4)),
        horizon=int(rng.integers(1, 5)),
        round_robin=bool(rng.integers(2)),
        concentration=float(rng.choice([0.1, 0.5, 2.0])),
    )
    old = random_logits(instance, rng, 2.0)
    agent = int(rng.integers(instance.n_agents))
    new = [z.copy() for z in old]
    for z, m in zip(new, instance.agent_mask(agent), strict=True):  # the update moves the agent only
        z[m] += 3.0 * rng.standard_normal(z[m].shape)
    full = episode_distribution(instance, new)
    suffix = suffix_resampled_distribution(instance, old, new, agent)
    assert abs(sum(full.values()) - 1.0) < 1e-12
    assert max(abs(full.get(k, 0.0) - suffix.get(k, 0.0)) for k in set(full) | set(suffix)) < 1e-12


def test_the_stale_suffix_is_not_the_new_team() -> None:
    """Negative control: keeping the old episodes whole (not resampling from the agent's turn on) is
    detectably different from the new team once the agent's policy moved."""
    rng = np.random.default_rng(5)
    instance = random_instance(rng, n_agents=2, n_messages=3, contexts=2, horizon=2, round_robin=True)
    old = random_logits(instance, rng, 1.0)
    new = [z.copy() for z in old]
    new[1] += 3.0 * rng.standard_normal(new[1].shape)  # layer 1 is agent 1's (round-robin)
    assert _tv(episode_distribution(instance, old), episode_distribution(instance, new)) > 1e-2
    assert (
        _tv(suffix_resampled_distribution(instance, old, new, 1), episode_distribution(instance, new)) < 1e-12
    )


def test_a_change_outside_the_agent_breaks_the_equality() -> None:
    """The equality needs the update to touch the agent's contexts only: moving another agent too
    (whose earlier messages are in the kept prefix) makes suffix resampling wrong, and the test sees it."""
    rng = np.random.default_rng(3)
    instance = random_instance(rng, n_agents=2, n_messages=3, contexts=2, horizon=2, round_robin=True)
    old = random_logits(instance, rng, 1.0)
    new = [z + 2.0 * rng.standard_normal(z.shape) for z in old]  # both agents move
    full = episode_distribution(instance, new)
    suffix = suffix_resampled_distribution(instance, old, new, agent=1)
    assert _tv(full, suffix) > 1e-3


def test_the_stage_loop_with_suffix_resampling_trains_the_exact_team_as_full_resampling() -> None:
    rng = np.random.default_rng(11)
    instance = random_instance(rng, n_agents=3, n_messages=3, contexts=2, horizon=3, round_robin=True)
    logits = random_logits(instance, rng, 1.0)
    runs = {}
    for resample in ("full", "suffix"):
        team = TabularTeam(instance, logits, delta=0.05)
        train(team, ScheduleConfig(kind="teamtr", resample=resample), stages=2)
        runs[resample] = [r.as_dict() for r in team.records]
    assert runs["suffix"] == runs["full"] and len(runs["full"]) == 6
