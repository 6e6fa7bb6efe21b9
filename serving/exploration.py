"""Exploratory served episodes: a share of a team's episodes sampled at the training temperature, so
that feedback on them (`/v1/feedback`) can train the team (improve/feedback.py).

A served team answers greedily by default (temperature 0), and a greedy turn is no sample of a
stochastic policy (training/behaviour.py refuses it). With `exploration_share` > 0 each new episode is
drawn once, independently, as exploratory with that probability: every engine-backed role then samples
at the exploration temperature (the run's `rollout.temperature`, what training trains pi_T at) with
top_p = 1, the turns carry their behaviour log-probs and temperature as always, and the episode span
says `teamtr.exploration = true` (so does the trajectory's metadata). A request that sets temperature
or top_p itself is never explored (its client asked for a sampling), and a team's pins still win.

The draw is an independent Bernoulli draw, not a running count as the canary's (serving/canary.py): a
client that cycles through its prompts with a period that divides 1 / share would otherwise have the
same prompts explored every time, and others never.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from teamtr.client.admin_protocol import EXPLORATION_KEY

__all__ = ["EXPLORATION_KEY", "ExplorationDraw"]  # the metadata key (serving/tracing.py EXPLORATION: the span's)


@dataclass
class ExplorationDraw:
    """The per-episode draw of one team: exploratory with probability `share`."""

    share: float = 0.0
    temperature: float = 1.0  # the exploratory episodes' temperature (the training temperature)
    seed: int | None = None  # None: from the OS (a restarted server draws afresh)
    episodes: int = 0  # drawn so far
    explored: int = 0  # of them, exploratory
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"exploration share must be in [0, 1], got {self.share}")
        if not self.temperature > 0:
            raise ValueError(f"exploration temperature must be > 0, got {self.temperature}")
        self._rng = random.Random(self.seed)

    def draw(self) -> bool:
        """Whether the next episode is exploratory."""
        self.episodes += 1
        take = self.share > 0 and self._rng.random() < self.share
        self.explored += take
        return take

    def overrides(self) -> dict[str, float]:
        """The request-style sampling fields of an exploratory episode (serving/sampling.py)."""
        return {"temperature": self.temperature, "top_p": 1.0}
