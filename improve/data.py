"""What `teamtr improve` learns from: the prompts of served episodes, and how any response to one is scored.

Served episodes come from the server's span store (serving/served_episodes.py), through
`GET /admin/episodes` or a serve directory's traces.db. Their prompts (deduplicated, in the order they
were first served) are the task distribution; the most recent share of them is held out for the gate.

Rewards: a verifier TaskFamily scores a response against the prompt's ground truth, which it must be
able to give for a bare prompt (`answer_for(prompt)`, e.g. tasks/chain.py); a user function
`module:function(prompt, response) -> float` scores it directly; stored feedback scores only the served
episode it was given for, so it can judge the canary but cannot score the new rollouts training samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from teamtr.client.admin_protocol import ServedEpisode
from teamtr.graphs.loading import load_function
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.graphs.trajectory import prompt_group

RewardFn = Callable[[str, str], float]  # (prompt, response) -> reward


class ImproveDataError(ValueError):
    """Not enough served data, or no way to score it; the message says what to change."""


def verifier_reward(family: TaskFamily) -> RewardFn:
    """The family's exact verifier on a bare prompt: needs `family.answer_for(prompt)`."""
    answer_for = getattr(family, "answer_for", None)
    if not callable(answer_for):
        raise ImproveDataError(
            f"task family {family.name!r} cannot give the answer of a served prompt (no answer_for(prompt));"
            " give a reward function module:function(prompt, response) instead"
        )

    def reward(prompt: str, response: str) -> float:
        answer = answer_for(prompt)
        if answer is None:
            return 0.0
        return float(family.verify(TaskInstance(id="served", prompt=prompt, answer=answer), response))

    return reward


def function_reward(spec: str) -> RewardFn:
    """A user reward `module:function(prompt, response) -> float`."""
    fn = load_function(spec, "reward")

    def reward(prompt: str, response: str) -> float:
        value = float(fn(prompt, response))
        if not math.isfinite(value):
            raise ImproveDataError(f"reward {spec!r} returned {value} for prompt {prompt!r}")
        return value

    return reward


@dataclass
class DataWindow:
    """Which served episodes the run learned from (recorded in the lineage and the promotion log)."""

    team: str
    since_ns: int  # first episode's start
    until_ns: int  # last episode's start
    episodes: int
    prompts: int
    held_out: int

    def describe(self) -> str:
        return f"{self.episodes} episodes of {self.team}, {self.prompts} prompts ({self.held_out} held out)"


@dataclass
class ServedData:
    train: list[str]  # prompts to train on
    held_out: list[str]  # the most recent prompts, for the gate
    window: DataWindow


def select_episodes(
    episodes: list[ServedEpisode], *, last: int | None = None, since_ns: int = 0
) -> list[ServedEpisode]:
    """Episodes started at or after since_ns, the newest `last` of them, oldest first."""
    chosen = sorted((e for e in episodes if e.start_ns >= since_ns), key=lambda e: e.start_ns)
    return chosen[-last:] if last else chosen


def split_prompts(episodes: list[ServedEpisode], team: str, held_out_fraction: float) -> ServedData:
    """Unique prompts in the order first served; the newest `held_out_fraction` of them are held out."""
    prompts = list(dict.fromkeys(e.prompt for e in episodes if e.prompt.strip()))
    n_held = max(1, round(len(prompts) * held_out_fraction))
    if len(prompts) < n_held + 2:
        raise ImproveDataError(
            f"{len(prompts)} distinct served prompts of team {team!r} in the window: need at least "
            f"{n_held + 2} (2 to train on, {n_held} held out); serve more traffic or widen the window"
        )
    window = DataWindow(
        team=team,
        since_ns=episodes[0].start_ns,
        until_ns=episodes[-1].start_ns,
        episodes=len(episodes),
        prompts=len(prompts),
        held_out=n_held,
    )
    return ServedData(train=prompts[:-n_held], held_out=prompts[-n_held:], window=window)


@dataclass
class ServedTasks:
    """The served prompts as a TaskFamily the trainer samples from; `verify` is the reward function."""

    prompts: list[str]
    reward: RewardFn
    name: str = "served"
    description: str = "prompts of served episodes"
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def instance(self, prompt: str) -> TaskInstance:
        # the prompt's group id, so rollouts and served episodes of one prompt share it
        return TaskInstance(id=prompt_group(prompt), prompt=prompt, answer=None)

    def generate(self, n: int, seed: int, **difficulty: Any) -> list[TaskInstance]:
        rng = random.Random(seed)
        picked = rng.sample(self.prompts, n) if n <= len(self.prompts) else rng.choices(self.prompts, k=n)
        return [self.instance(p) for p in picked]

    def extract_answer(self, response: str) -> str | None:
        return response.strip() or None

    def verify(self, instance: TaskInstance, response: str) -> float:
        return self.reward(instance.prompt, response)
