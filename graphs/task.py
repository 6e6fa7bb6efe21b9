"""What a task family is: a seeded generator with difficulty knobs and an exact verifier.

The data contract between the graph layer (a team runs a `TaskInstance`, a verifier scores it) and the task
families in evals/ that implement it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

HELDOUT_SEED = 2_000_003  # held-out evaluation prompts' generator seed: disjoint from every train_seed's


@dataclass(frozen=True)
class TaskInstance:
    """One problem: the text the team sees and the ground truth the verifier checks against."""

    id: str
    prompt: str
    answer: Any  # JSON-serialisable ground truth
    difficulty: str = "default"
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@runtime_checkable
class TaskFamily(Protocol):
    name: str
    description: str

    def generate(self, n: int, seed: int, **difficulty: Any) -> list[TaskInstance]:
        """n instances, the same for the same seed and knobs."""
        ...

    def extract_answer(self, response: str) -> str | None:
        """The final answer in a team's final message, or None if there is none."""
        ...

    def verify(self, instance: TaskInstance, response: str) -> float:
        """Exact reward in [0, 1] (1.0 = correct) for the team's final message."""
        ...


def balanced_prompts(task: TaskFamily, n: int, seed: int, pool_factor: int = 4) -> list[TaskInstance]:
    """`task.generate(n, seed)`, or, for a task whose instances declare a stratum (`stratum(instance)`: what
    the later turns' contexts depend on, e.g. the relay's private value), n instances balanced over strata:
    taken from a pool of pool_factor * n generated instances one stratum at a time, in the order the strata
    first appear, so a batch covers as many strata as it can (a batch of 8 relay prompts holds 8 of the 10
    values instead of 5.7 on average). Meant for strata the task draws with equal probability; the same
    (n, seed) gives the same batch."""
    stratum = getattr(task, "stratum", None)
    if stratum is None:
        return task.generate(n, seed=seed)
    buckets: dict[Any, list[TaskInstance]] = {}
    for instance in task.generate(pool_factor * n, seed=seed):
        buckets.setdefault(stratum(instance), []).append(instance)
    out: list[TaskInstance] = []
    for round_ in range(max(len(b) for b in buckets.values())):
        out += [b[round_] for b in buckets.values() if round_ < len(b)]
    return out[:n]

