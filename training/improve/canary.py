"""Canary vs incumbent on live traffic: which arm each served episode ran on, its reward, the decision.

An episode is a canary episode when every adapter the candidate changes ran at its candidate version,
an incumbent one when every one ran at the incumbent's; anything else is a mixed team, which the
registry never serves (serving/canary.py) and the monitor counts so a test can say so. Rewards: the
episode's stored feedback when the reward source is feedback, else the reward function on its answer.
After `episodes` canary episodes the candidate is promoted when its mean reward is not below the
incumbent's (over the same window) by more than `margin`; otherwise it is rolled back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from teamtr.serving.protocol import ServedEpisode
from teamtr.training.improve.data import RewardFn

Arm = Literal["candidate", "incumbent", "mixed"]


@dataclass
class CanaryConfig:
    share: float = 0.5  # of new episodes sent to the candidate
    episodes: int = 16  # canary episodes to see before deciding
    margin: float = 0.1  # the candidate's mean reward may trail the incumbent's by at most this
    timeout_s: float = 600.0  # no decision by then: roll back
    poll_s: float = 1.0


def arm_of(
    episode: ServedEpisode, role_of: dict[str, str], candidate: dict[str, int], incumbent: dict[str, int]
) -> Arm:
    """role_of: adapter -> the role that speaks with it (an episode records versions by role)."""
    ran = {a: episode.adapter_versions.get(role_of.get(a, a)) for a in candidate}
    if ran == candidate:
        return "candidate"
    if ran == {a: incumbent[a] for a in candidate}:
        return "incumbent"
    return "mixed"


@dataclass
class CanaryTally:
    rewards: dict[str, list[float]] = field(default_factory=lambda: {"candidate": [], "incumbent": []})
    mixed: int = 0
    unscored: int = 0  # feedback source: episodes without feedback yet

    def figures(self) -> dict[str, Any]:
        c, i = self.rewards["candidate"], self.rewards["incumbent"]
        return {
            "candidate_episodes": len(c),
            "incumbent_episodes": len(i),
            "candidate_reward": float(np.mean(c)) if c else None,
            "incumbent_reward": float(np.mean(i)) if i else None,
            "mixed_episodes": self.mixed,
            "unscored_episodes": self.unscored,
        }


def tally(
    episodes: list[ServedEpisode],
    role_of: dict[str, str],
    candidate: dict[str, int],
    incumbent: dict[str, int],
    reward: RewardFn | None,
) -> CanaryTally:
    """reward None: the stored feedback scores an episode (unscored until it has some)."""
    out = CanaryTally()
    for e in episodes:
        arm = arm_of(e, role_of, candidate, incumbent)
        if arm == "mixed":
            out.mixed += 1
            continue
        if reward is None:
            if e.reward is None:
                out.unscored += 1
                continue
            value = e.reward
        else:
            value = reward(e.prompt, e.final_answer or "")
        out.rewards[arm].append(value)
    return out


def decide(t: CanaryTally, cfg: CanaryConfig) -> tuple[bool, str] | None:
    """None: not enough canary episodes yet; else (promote?, why)."""
    c, i = t.rewards["candidate"], t.rewards["incumbent"]
    if len(c) < cfg.episodes:
        return None
    if t.mixed:
        return False, f"{t.mixed} episodes ran a mixed team"
    if not i:  # a share of 1: no live incumbent episodes to compare with
        return None
    gap = float(np.mean(c)) - float(np.mean(i))
    if gap < -cfg.margin:
        return (
            False,
            f"canary reward {np.mean(c):.3f} trails the incumbent's {np.mean(i):.3f} by more than {cfg.margin}",
        )
    return (
        True,
        f"canary reward {np.mean(c):.3f} vs incumbent {np.mean(i):.3f} over {len(c)} + {len(i)} episodes",
    )
