"""Random teams for the bound checks: one generator shared by `teamtr theory check` and the property tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teamtr.theory.bounds import BoundConstants, BoundForm, Check, check_stage
from teamtr.theory.env import (
    TeamInstance,
    chain_instance,
    chain_warm_logits,
    convention_instance,
    convention_warm_logits,
    random_instance,
    random_logits,
)
from teamtr.theory.exact import Logits
from teamtr.theory.team import TabularTeam, train
from teamtr.training.stage import ScheduleConfig, ScheduleKind

SEQUENTIAL_SCHEDULES: tuple[ScheduleKind, ...] = ("teamtr", "naive", "importance_weighting")


@dataclass
class RandomCase:
    instance: TeamInstance
    logits: Logits
    delta: float
    schedule: ScheduleKind
    order: str
    stages: int


def random_case(
    rng: np.random.Generator, max_agents: int = 3, max_horizon: int = 6, max_contexts: int = 3
) -> RandomCase:
    """A small random team: 1..max_agents agents, 2-3 messages, random or round-robin router, discount in
    [0.5, 1], trust-region radius log-uniform in [1e-3, 2] (large radii stress the bounds), 1-2 stages.
    One case in five is a chain team, one in ten a convention team (the scaling study's families)."""
    n = int(rng.integers(1, max_agents + 1))
    gamma = float(rng.choice([1.0, rng.uniform(0.5, 1.0)]))
    family = rng.uniform()
    if family < 0.1:  # partly readable contexts: one policy over the contexts a role cannot tell apart
        instance, logits = _convention(rng, n, gamma, rounds=int(rng.integers(1, 3)))
    elif family < 0.3:
        instance, logits = _chain(rng, n, gamma, rounds=int(rng.integers(1, 3)))
    else:
        instance = random_instance(
            rng,
            n_agents=n,
            n_messages=int(rng.integers(2, 4)),
            contexts=int(rng.integers(1, max_contexts + 1)),
            horizon=int(rng.integers(1, max_horizon + 1)),
            gamma=gamma,
            round_robin=bool(rng.integers(2)),
            concentration=float(rng.choice([0.1, 0.5, 2.0])),
        )
        logits = random_logits(instance, rng, float(rng.uniform(0.0, 3.0)))
    return _case(rng, instance, logits)


def speak_once_case(rng: np.random.Generator, max_agents: int = 4, max_contexts: int = 3) -> RandomCase:
    """A random team in which every agent speaks on one turn only, in a fixed order: a one-round chain or
    convention team, or a random team with a one-round round-robin router (T = n). The own-turn bounds
    hold with equality there (theory/bounds.py); schedules, radii and orders as `random_case`."""
    n = int(rng.integers(1, max_agents + 1))
    gamma = float(rng.choice([1.0, rng.uniform(0.5, 1.0)]))
    family = rng.uniform()
    if family < 0.2:
        instance, logits = _convention(rng, n, gamma, rounds=1)
    elif family < 0.5:
        instance, logits = _chain(rng, n, gamma, rounds=1)
    else:
        instance = random_instance(
            rng,
            n_agents=n,
            n_messages=int(rng.integers(2, 4)),
            contexts=int(rng.integers(1, max_contexts + 1)),
            horizon=n,
            gamma=gamma,
            round_robin=True,
            concentration=float(rng.choice([0.1, 0.5, 2.0])),
        )
        logits = random_logits(instance, rng, float(rng.uniform(0.0, 3.0)))
    return _case(rng, instance, logits)


def _convention(rng: np.random.Generator, n: int, gamma: float, rounds: int) -> tuple[TeamInstance, Logits]:
    instance = convention_instance(
        n,
        rounds=rounds,
        conventions=int(rng.integers(2, 4)),
        legibility=float(rng.choice([0.0, rng.uniform()])),
        gamma=gamma,
    )
    logits = convention_warm_logits(
        instance, rng, competence=float(rng.uniform(0, 4)), slip=float(rng.uniform(0, 4)), noise=1.0
    )
    return instance, logits


def _chain(rng: np.random.Generator, n: int, gamma: float, rounds: int) -> tuple[TeamInstance, Logits]:
    instance = chain_instance(n, rng, rounds=rounds, flavours=int(rng.integers(1, 3)), gamma=gamma)
    return instance, chain_warm_logits(instance, rng, competence=float(rng.uniform(0, 4)), noise=1.0)


def _case(rng: np.random.Generator, instance: TeamInstance, logits: Logits) -> RandomCase:
    """A case's training settings, drawn after its team (the same draws in the same order for every family)."""
    return RandomCase(
        instance=instance,
        logits=logits,
        delta=float(np.exp(rng.uniform(np.log(1e-3), np.log(2.0)))),
        schedule=SEQUENTIAL_SCHEDULES[int(rng.integers(len(SEQUENTIAL_SCHEDULES)))],
        order=str(rng.choice(["fixed", "reversed", "random"])),
        stages=int(rng.integers(1, 3)),
    )


def check_case(case: RandomCase, form: BoundForm = BoundForm(), seed: int = 0) -> list[Check]:
    """Train the case with its schedule through the shared stage loop and check every bound on every stage."""
    team = TabularTeam(case.instance, case.logits, case.delta)
    records = train(team, ScheduleConfig(kind=case.schedule, order=case.order), case.stages, seed)  # type: ignore[arg-type]
    constants = BoundConstants.of(case.instance)
    checks: list[Check] = []
    for stage in records:
        checks.extend(check_stage(stage.updates, constants, form))
    return checks
