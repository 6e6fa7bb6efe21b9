"""ADV step of Algorithm 1: bounded advantages from a per-prompt baseline (docs/training.md, "Advantages").

For the G episodes of one prompt with team returns R_1..R_G, one of

    rloo              A_g = clip(R_g - mean_{h != g} R_h, -A_clip, +A_clip)      (the default)
    group_normalised  A_g = clip((R_g - mean(R)) / sqrt(var(R) + eps), -A_clip, +A_clip)   (the paper's)
    centred           A_g = clip(R_g - mean(R), -A_clip, +A_clip)

broadcast to every token of the updated agent's messages in episode g. rloo's leave-one-out baseline is
unbiased and keeps the advantage in reward units: the std division of group_normalised gives one failure
among 16 successes the advantage -3.9 (clipped to -3), a step out of proportion to one episode. The estimator-mismatch terms the
certificate needs (zeta_clip, zeta_norm) are measured on the same numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from teamtr.training.config import LossConfig


@dataclass
class Advantages:
    """Per-episode advantages of one rollout batch, with what the certificate needs about them."""

    values: np.ndarray  # A_g, clipped (what enters the loss)
    unclipped: np.ndarray  # before the +-A_clip clip
    keep: np.ndarray  # bool: episode is used (dynamic sampling drops zero-spread groups)
    zeta_clip: float  # mean |A_unclipped - A| over kept episodes: bias of the advantage clip
    zeta_norm: float  # mean |A_loo - A_unclipped|: finite-G bias of the in-group baseline
    a_max: float  # the bound on |A| (A_clip, or the observed max when clipping is off)
    signal_groups: int = 0  # prompt groups whose returns are not all equal (the evidence of the batch)


def group_normalised_advantages(
    rewards: Sequence[float],
    groups: Sequence[str],
    *,
    adv_clip: float = 3.0,
    eps: float = 1e-6,
    baseline: str = "group_normalised",
    clip: bool = True,
    drop_zero_spread: bool = False,
) -> Advantages:
    """Bounded advantage of every episode (groups = prompt ids; G = group size), `baseline` one of rloo,
    group_normalised, centred (module docstring); clip=False skips the clip.
    drop_zero_spread (DAPO's dynamic sampling) marks groups whose rewards are all equal as unused.
    """
    rewards_arr = np.asarray(rewards, dtype=np.float64)
    if rewards_arr.ndim != 1 or len(rewards_arr) != len(groups):
        raise ValueError("rewards and groups must be 1-D and of equal length")
    members: dict[str, list[int]] = defaultdict(list)
    for idx, g in enumerate(groups):
        members[g].append(idx)

    unclipped = np.zeros_like(rewards_arr)
    loo_gap = np.zeros_like(rewards_arr)
    keep = np.ones(len(rewards_arr), dtype=bool)
    if baseline not in ("rloo", "group_normalised", "centred"):
        raise ValueError(f"unknown advantage baseline {baseline!r} (rloo, group_normalised, centred)")
    signal_groups = 0
    for idx in members.values():
        r = rewards_arr[idx]
        size = len(idx)
        centred = r - r.mean()  # R_g - mean(R)
        spread = not np.all(r == r[0])
        signal_groups += int(spread)
        if baseline == "rloo":  # R_g - mean_{-g}(R) = G/(G-1) (R_g - mean): unbiased, no in-group bias
            unclipped[idx] = centred * size / (size - 1) if size > 1 else 0.0
        else:
            scale = np.sqrt(r.var() + eps) if baseline == "group_normalised" else 1.0  # population variance
            unclipped[idx] = centred / scale
            # the in-group mean (the episode's own return in its baseline) biases A against the
            # leave-one-out one by |A| / (G - 1); zero in the G -> infinity limit
            loo_gap[idx] = np.abs(unclipped[idx]) / (size - 1) if size > 1 else 0.0
        if drop_zero_spread and not spread:
            keep[idx] = False

    values = np.clip(unclipped, -adv_clip, adv_clip) if clip else unclipped.copy()
    a_max = adv_clip if clip else float(np.max(np.abs(unclipped), initial=0.0))
    kept = keep.any()
    return Advantages(
        values=values,
        unclipped=unclipped,
        keep=keep,
        zeta_clip=float(np.mean(np.abs(unclipped - values)[keep])) if kept else 0.0,
        zeta_norm=float(np.mean(loo_gap[keep])) if kept else 0.0,
        a_max=a_max,
        signal_groups=signal_groups,
    )


def prefix_advantages(
    rewards: Sequence[float],
    baselines: Sequence[float],
    groups: Sequence[str],
    *,
    adv_clip: float = 3.0,
    clip: bool = True,
) -> Advantages:
    """loss.credit = prefix: A_n = clip(R_n - b_n, -A_clip, +A_clip), where b_n is the mean return of
    continuations of the current team from episode n's prefix before role j's first turn (NaN: j did not
    speak in episode n; its A is 0 and it carries no message). b_n is drawn independently of R_n from the
    same prefix, so A_n is unbiased for j's own contribution and holds nothing of what the turns before j
    did: no in-group term (zeta_norm 0). signal_groups counts prompt groups with a nonzero A."""
    r = np.asarray(rewards, dtype=np.float64)
    b = np.asarray(baselines, dtype=np.float64)
    if r.shape != b.shape or r.ndim != 1 or len(r) != len(groups):
        raise ValueError("rewards, baselines and groups must be 1-D and of equal length")
    spoke = ~np.isnan(b)
    unclipped = np.where(spoke, r - np.where(spoke, b, 0.0), 0.0)
    values = np.clip(unclipped, -adv_clip, adv_clip) if clip else unclipped.copy()
    return Advantages(
        values=values,
        unclipped=unclipped,
        keep=np.ones(len(r), dtype=bool),
        zeta_clip=float(np.mean(np.abs(unclipped - values))) if len(r) else 0.0,
        zeta_norm=0.0,
        a_max=adv_clip if clip else float(np.max(np.abs(unclipped), initial=0.0)),
        signal_groups=len({g for g, a in zip(groups, values, strict=True) if a != 0}),
    )


def batch_normalised_advantages(
    rewards: Sequence[float], *, adv_clip: float = 3.0, eps: float = 1e-6
) -> Advantages:
    """PPO-style baseline without groups: the whole batch is one group."""
    return group_normalised_advantages(rewards, ["batch"] * len(rewards), adv_clip=adv_clip, eps=eps)


def advantages_for(
    rewards: Sequence[float], groups: Sequence[str], loss: LossConfig, baselines: Sequence[float] | None = None
) -> Advantages:
    """The advantage estimator `loss.kind` uses: one group per prompt, or (ppo_batch_baseline) the whole
    batch; with `baselines` (loss.credit = prefix) each episode's own prefix baseline."""
    if baselines is not None:
        return prefix_advantages(rewards, baselines, groups, adv_clip=loss.adv_clip, clip=loss.clip_advantages)
    if loss.kind == "ppo_batch_baseline":  # no groups, no value function: the batch mean is the baseline
        return batch_normalised_advantages(rewards, adv_clip=loss.adv_clip, eps=loss.adv_eps)
    return group_normalised_advantages(
        rewards,
        groups,
        adv_clip=loss.adv_clip,
        eps=loss.adv_eps,
        baseline=loss.advantage,
        clip=loss.clip_advantages,
        drop_zero_spread=bool(loss.dynamic_sampling),
    )
