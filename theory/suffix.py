"""Suffix resampling, exactly: after agent j's update only the part of an episode from j's first message
on can change, so an episode of the old team cut before that message is already a sample of the new
team's prefix. Keeping the prefix and sampling the rest from the new team gives episodes distributed as
full resampling of the new team; `suffix_resampled_distribution` computes that distribution exactly and
tests/theory/test_suffix.py checks it against `episode_distribution` of the new team.

An episode is the tuple (s_0, m_0, s_1, m_1, ..., s_{T-1}, m_{T-1}, s_T) of contexts and messages.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from teamtr.theory.env import TeamInstance
from teamtr.theory.exact import Logits, policies

Episode = tuple[int, ...]
Distribution = dict[Episode, float]


def _continuations(
    instance: TeamInstance, pi: list[np.ndarray], t: int, prefix: Episode, prob: float, out: Distribution
) -> None:
    """Add to `out` every completion of `prefix` (which ends in context s_t) with its probability under
    pi, times `prob`."""
    if prob == 0.0:
        return
    if t == instance.horizon:
        out[prefix] += prob
        return
    s = prefix[-1]
    P = instance.transitions[t]
    for m in range(instance.n_messages):
        for s_next in range(P.shape[2]):
            _continuations(
                instance, pi, t + 1, (*prefix, m, s_next), prob * pi[t][s, m] * P[s, m, s_next], out
            )


def episode_distribution(instance: TeamInstance, logits: Logits) -> Distribution:
    """P(episode) under the team `logits` (full resampling)."""
    pi = policies(logits)
    out: Distribution = defaultdict(float)
    for s0, p0 in enumerate(instance.initial):
        _continuations(instance, pi, 0, (s0,), float(p0), out)
    return dict(out)


def first_turn(instance: TeamInstance, episode: Episode, agent: int) -> int | None:
    """The turn t of the agent's first message in the episode (None: it never speaks)."""
    for t in range(instance.horizon):
        if instance.router[t][episode[2 * t]] == agent:
            return t
    return None


def suffix_resampled_distribution(
    instance: TeamInstance, old_logits: Logits, new_logits: Logits, agent: int
) -> Distribution:
    """The distribution of episodes made by sampling from the old team, keeping each episode up to (not
    including) `agent`'s first message and sampling the rest from the new team. The new team differs
    from the old one in `agent`'s contexts only (its update); an episode where it never speaks is kept."""
    pi_new = policies(new_logits)
    out: Distribution = defaultdict(float)
    prefixes: dict[tuple[Episode, int], float] = defaultdict(float)  # the old team's kept prefixes
    for episode, p in episode_distribution(instance, old_logits).items():
        t = first_turn(instance, episode, agent)
        if t is None:
            out[episode] += p
        else:
            prefixes[(episode[: 2 * t + 1], t)] += p
    for (prefix, t), p in prefixes.items():
        _continuations(instance, pi_new, t, prefix, p, out)
    return dict(out)
