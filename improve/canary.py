"""Canary vs incumbent on live traffic: which arm each served episode ran on, its reward, the decision.

An episode is a canary episode when every adapter the candidate changes ran at its candidate version,
an incumbent one when every one ran at the incumbent's; anything else is a mixed team, which the
registry never serves (serving/canary.py) and the monitor counts so a test can say so. Rewards: the
canary judge's (judge.py): a reward function on the episode's answer, or the episode's stored feedback.

Pairs, by judge:
- paired by prompt (a reward function judges: verifier, module:function, judge:FILE): the server
  answers each canary request a second time with the incumbent, a shadow episode whose answer is not
  returned (serving/episodes.py), and a pair is the canary episode's reward minus its shadow's, on the
  same prompt, same seed and sampling. Pairs enter in the canary episodes' start order; a pair whose
  shadow has not ended waits (later pairs wait behind it), unless SHADOW_LOST later shadows ended
  before it, then it is left out (a failed shadow), for good.
- unpaired (the canary judged by feedback: a shadow's answer reaches no user, so it gets none): the
  k-th scored canary episode with the k-th scored incumbent episode, in the order served (different
  prompts: the traffic's prompt-to-prompt variance stays in every difference).

The decision is a sequential betting test on the differences (stats.py `canary_crossings`), looked at
after every poll: promote at the first pair where the promote test rejects "mean <= 0" (<= -margin
with `non_inferiority`), roll back at the first where the other rejects "mean >= 0" (shown worse), or
at `max_episodes` pairs (not shown better); each wrong early stop has probability <= (1 -
confidence) / 2 however often it looks. docs/improve.md has the power; the bounds logged beside the
decision are the confidence sequence the two tests make (stats.py `canary_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from teamtr.client.admin_protocol import ServedEpisode
from teamtr.improve.data import RewardFn
from teamtr.improve.stats import Bound, canary_bounds, canary_crossings, test_name

Arm = Literal["candidate", "incumbent", "mixed"]
SHADOW_LOST = 16  # a shadow this many later shadows overtook is taken as failed: its pair is left out


@dataclass
class CanaryConfig:
    share: float = 0.5  # of new episodes sent to the candidate
    # the cap, in pairs: not shown better by then: roll back (1000: +0.1 promoted 95% of the time within it,
    # docs/improve.md's power table; 400 rolled back about 45% of true +0.1 candidates)
    max_episodes: int = 1000
    min_episodes: int = 0  # look only from this many canary episodes on (the tests are valid either way)
    confidence: float = 0.95  # two-sided; each wrong early stop has probability <= 2.5%
    non_inferiority: float | None = None  # a margin: promote when not worse by more (explicit only)
    reward_range: tuple[float, float] = (0.0, 1.0)
    timeout_s: float = 3600.0  # no decision by then: roll back
    poll_s: float = 1.0


def paired_by_prompt(reward: RewardFn | None) -> bool:
    """Whether the canary asks the server for shadow episodes and pairs by prompt: only when a reward
    function judges (feedback cannot score a shadow's answer, which no user sees)."""
    return reward is not None


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
    paired: bool = False  # pairs by prompt (canary - its shadow), else the k-th of each arm
    differences: list[float] = field(default_factory=list)  # the pairs, in the order they enter
    mixed: int = 0
    unscored: int = 0  # feedback source: episodes without feedback yet
    shadows: int = 0  # shadow episodes seen
    lost: int = 0  # canary episodes whose shadow never came (left out)

    def figures(self) -> dict[str, Any]:
        c, i = self.rewards["candidate"], self.rewards["incumbent"]
        return {
            "candidate_episodes": len(c),
            "incumbent_episodes": len(i),
            "candidate_reward": float(np.mean(c)) if c else None,
            "incumbent_reward": float(np.mean(i)) if i else None,
            "paired_by_prompt": self.paired,
            "mean_difference": float(np.mean(self.differences)) if self.differences else None,
            "shadow_episodes": self.shadows,
            "lost_pairs": self.lost,
            "mixed_episodes": self.mixed,
            "unscored_episodes": self.unscored,
        }

    def bound(self, cfg: CanaryConfig) -> Bound:
        lo, hi = cfg.reward_range
        return canary_bounds(self.differences, lo, hi, cfg.confidence)


def _prompt_pairs(
    canaries: list[tuple[ServedEpisode, float]], shadows: dict[str, tuple[int, float]]
) -> tuple[list[float], list[float], int]:
    """(canary rewards, their shadows' rewards, lost): canary episodes in start order against their
    shadows (pair id -> (end ns, reward)); a pair without its ended shadow stops the sequence, unless
    SHADOW_LOST later shadows ended before it did (or before now, when it has not): then it is left out.
    So the sequence only ever grows at its end."""
    ends = np.array([shadows[c.pair_id][0] if c.pair_id in shadows else np.inf for c, _ in canaries])
    cand: list[float] = []
    inc: list[float] = []
    lost = 0
    for j, (c, reward) in enumerate(canaries):
        if int(np.sum(ends[j + 1 :] < ends[j])) >= SHADOW_LOST:
            lost += 1
        elif c.pair_id in shadows:
            cand.append(reward)
            inc.append(shadows[c.pair_id][1])
        else:
            break
    return cand, inc, lost


def tally(
    episodes: list[ServedEpisode],
    role_of: dict[str, str],
    candidate: dict[str, int],
    incumbent: dict[str, int],
    reward: RewardFn | None,
) -> CanaryTally:
    """reward None: the stored feedback scores an episode (unscored until it has some), unpaired; a
    reward function: paired by prompt with the shadow episodes among `episodes`."""
    out = CanaryTally(paired=paired_by_prompt(reward))
    canaries: list[tuple[ServedEpisode, float]] = []
    shadows: dict[str, tuple[int, float]] = {}
    for e in sorted(episodes, key=lambda e: e.start_ns):
        arm = arm_of(e, role_of, candidate, incumbent)
        if arm == "mixed" or (e.shadow and arm != "incumbent"):
            out.mixed += 1
            continue
        if reward is None:
            if e.reward is None:
                out.unscored += 1
                continue
            value = e.reward
        else:
            value = reward(e.prompt, e.final_answer or "")
        if e.shadow:
            out.shadows += 1
            if e.pair_id is not None:
                shadows[e.pair_id] = (e.end_ns, value)
            continue
        if arm == "candidate":
            canaries.append((e, value))
        out.rewards[arm].append(value)
    if out.paired:  # the decision's rewards are the pairs': same prompts, same count
        cand, inc, out.lost = _prompt_pairs(canaries, shadows)
        out.rewards = {"candidate": cand, "incumbent": inc}
    c, i = out.rewards["candidate"], out.rewards["incumbent"]
    out.differences = [a - b for a, b in zip(c, i, strict=False)]
    return out


def decide(t: CanaryTally, cfg: CanaryConfig) -> tuple[bool, str] | None:
    """None: not decided yet; else (promote?, why)."""
    if t.mixed:
        return False, f"{t.mixed} episodes ran a mixed team"
    if len(t.rewards["candidate"]) < cfg.min_episodes:
        return None
    lo, hi = cfg.reward_range
    margin = cfg.non_inferiority or 0.0
    d = np.asarray(t.differences[: cfg.max_episodes])  # pairs beyond the cap never count
    n = d.size
    up, down = (int(x) for x in canary_crossings(d, lo, hi, cfg.confidence, margin))
    b = t.bound(cfg)
    c, i = t.rewards["candidate"], t.rewards["incumbent"]
    how = "paired by prompt" if t.paired else "unpaired"
    figures = (
        f"canary {np.mean(c) if c else float('nan'):.3f} vs incumbent {np.mean(i) if i else float('nan'):.3f}, "
        f"mean difference {b.mean:+.3f} over {n} pairs ({how}), {cfg.confidence:.0%} bounds "
        f"[{b.lower:+.3f}, {b.upper:+.3f}] ({test_name(cfg.non_inferiority)})"
    )
    better, worse = ("better", "worse") if not margin else (f"within {margin:g}", f"worse by over {margin:g}")
    if up < n and up <= down:
        return True, f"shown {better} at pair {up + 1}: {figures}"
    if down < n:
        return False, f"shown {worse} at pair {down + 1}: {figures}"
    if n >= cfg.max_episodes:
        return False, f"not shown better within {cfg.max_episodes} pairs: {figures}"
    return None
