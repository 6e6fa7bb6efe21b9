"""DAPO's dynamic sampling with refill: a group whose G rewards are all equal has zero advantage and
teaches nothing, so it is dropped and further prompts are sampled until the batch holds B groups with a
reward spread (or `REFILL_ROUNDS` extra rounds are spent, then the batch is what was found).

Refill prompts are a pure function of (stage, round) (`refill_prompts`), so a resumed run and a suffix
resample find the same prompts again from a trajectory's task id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.graphs.team import derive_seed
from teamtr.graphs.trajectory import Trajectory

REFILL_ROUNDS = 3  # at most this many extra rounds of B prompts each


def groups_with_spread(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    """The batch's groups (in order of first appearance) whose rewards are not all equal."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(t)
    return [g for g in groups.values() if len({t.reward for t in g}) > 1]


def refill_prompts(task: TaskFamily, train_seed: int, stage: int, round_: int, n: int) -> list[TaskInstance]:
    """Round `round_` (1-based) of refill prompts of a stage: disjoint seeds from the stage's own."""
    return task.generate(n, seed=derive_seed(train_seed, stage, "refill", round_))


def refilled_episodes(
    first: list[Trajectory],
    want: int,
    sample: Callable[[int], list[Trajectory]],
    rounds: int = REFILL_ROUNDS,
) -> tuple[list[Trajectory], int]:
    """`first`'s groups with a reward spread, topped up from `sample(round)` (round = 1, 2, ...: the
    episodes of that round's refill prompts) until `want` such groups are held; returns the episodes of
    the first `want` of them (or of all found, if fewer; `first` itself if none has a spread: every
    advantage is then 0 and the update changes nothing) and the number of refill rounds used."""
    kept = groups_with_spread(first)
    used = 0
    while len(kept) < want and used < rounds:
        used += 1
        kept += groups_with_spread(sample(used))
    if not kept:
        return first, used
    return [t for g in kept[:want] for t in g], used
