"""Canary vs incumbent on live traffic: which arm each served episode ran on, its reward, the decision.

An episode is a canary episode when every adapter the candidate changes ran at its candidate version,
an incumbent one when every one ran at the incumbent's; anything else is a mixed team, which the
registry never serves (serving/canary.py) and the monitor counts so a test can say so. Rewards: the
canary judge's (judge.py): the episode's stored feedback, or a reward function on its answer.

The decision is a sequential test on the reward difference: the k-th canary episode is paired with the
k-th incumbent episode (in the order served), and after every poll the always-valid confidence
sequence of the mean difference (stats.py, two-sided at `confidence`) decides: promote as soon as its
lower bound is above 0 (shown better; above -non_inferiority when that margin is given), roll back as
soon as its upper bound is below that (shown worse), and roll back at `max_episodes` canary episodes
(not shown better). A not-better candidate is promoted with probability <= (1 - confidence) / 2 however
often the loop looks; docs/improve.md has the power of the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from teamtr.serving.protocol import ServedEpisode
from teamtr.training.improve.data import RewardFn
from teamtr.training.improve.stats import confidence_sequence, paired_differences, test_name

Arm = Literal["candidate", "incumbent", "mixed"]


@dataclass
class CanaryConfig:
    share: float = 0.5  # of new episodes sent to the candidate
    max_episodes: int = 400  # the cap: canary episodes without a decision by then: roll back
    min_episodes: int = 0  # look only from this many canary episodes on (the bounds are valid either way)
    confidence: float = 0.95  # two-sided; each wrong early stop has probability <= 2.5%
    non_inferiority: float | None = None  # a margin: promote when not worse by more (explicit only)
    reward_range: tuple[float, float] = (0.0, 1.0)
    timeout_s: float = 3600.0  # no decision by then: roll back
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

    def bound(self, cfg: CanaryConfig):
        lo, hi = cfg.reward_range
        d = paired_differences(self.rewards["candidate"], self.rewards["incumbent"])
        return confidence_sequence(d, lo - hi, hi - lo, alpha=1 - cfg.confidence, sides=2)


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
    """None: not decided yet; else (promote?, why)."""
    if t.mixed:
        return False, f"{t.mixed} episodes ran a mixed team"
    if len(t.rewards["candidate"]) < cfg.min_episodes:
        return None
    b = t.bound(cfg)
    margin = cfg.non_inferiority or 0.0
    test = test_name(cfg.non_inferiority)
    c, i = t.rewards["candidate"], t.rewards["incumbent"]
    figures = (
        f"canary {np.mean(c) if c else float('nan'):.3f} vs incumbent {np.mean(i) if i else float('nan'):.3f}, "
        f"mean difference {b.mean:+.3f} over {b.n} pairs, {cfg.confidence:.0%} bounds "
        f"[{b.lower:+.3f}, {b.upper:+.3f}] ({test})"
    )
    better, worse = ("better", "worse") if not margin else (f"within {margin:g}", f"worse by over {margin:g}")
    if b.n and b.lower > -margin:
        return True, f"shown {better}: {figures}"
    if b.n and b.upper < -margin:
        return False, f"shown {worse}: {figures}"
    if len(c) >= cfg.max_episodes:
        return False, f"not shown better within {cfg.max_episodes} canary episodes: {figures}"
    return None
