"""Feedback as training reward: served exploratory episodes (serving/exploration.py) rewarded by their
`/v1/feedback`, trained on as samples of the incumbent and importance-corrected once the policy moved.

An exploratory episode was sampled at the training temperature T (top_p 1) by the incumbent team mu,
with its behaviour log-probs on every turn; its feedback is its reward. Algorithm 1's update i optimises
role j on episodes of the intermediate team pi^(i-1), so the feedback episodes enter update i weighted by

    rho_g = prod over the messages m of episode g of every role k moved since mu:  pi_k(m) / mu_k(m)
    w_g   = min(rho_g, cap)                                   (truncated importance sampling, cap c-bar)

(`episode_log_ratios`, `truncated_weights`): the exact per-message ratio (a message's ratio is the
product of its tokens' ratios), multiplied over the episode because the reward is one number for the
whole episode. While no role has moved (the first update of the first stage) every rho_g = 1: the
episodes are samples of the incumbent and enter as they are. log mu is the trainer's own forward pass at
the incumbent's weights (taken before any update), so engine-vs-trainer numerics never enter a ratio
(the recorded log-probs are still the update record's `logprob_gap`). Why truncation at c-bar = 1 by
default (V-trace's rho-bar): a weight can only shrink an episode that pi_cur makes less likely than mu
did, never blow one up; the bias it leaves is towards mu, which the trust region keeps pi_cur near
anyway (docs/improve.md, "Learning from feedback").

Only episodes served on exactly the incumbent's versions are samples of mu; the others (an older team,
a canary's candidate) are left out and counted. A turn that is greedy, of unknown temperature, sampled
at another temperature or without behaviour log-probs makes the whole set an error
(`FeedbackEpisodeError`, or training/behaviour.py's `OffPolicyTurnsError`): such a turn is no sample of
the policy trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from teamtr.client.admin_protocol import EXPLORATION_KEY
from teamtr.graphs.trajectory import Trajectory, Turn, save_jsonl
from teamtr.improve.data import ImproveDataError
from teamtr.training.behaviour import require_on_policy
from teamtr.training.policy import AdapterPolicy

FEEDBACK_KEY = "feedback"  # metadata flag of a feedback episode inside a training batch
FEEDBACK_FILE = "feedback.jsonl"  # the episodes an improve run trains on, in its run directory


class FeedbackEpisodeError(ValueError):
    """Served episodes that cannot be trained on as they are; the message says which and why."""


@dataclass
class FeedbackEpisodes:
    """The exploratory served episodes of the incumbent with feedback, ready to train on."""

    episodes: list[Trajectory]
    other_versions: int = 0  # left out: served on versions other than the incumbent's
    not_exploratory: int = 0  # left out: served as the team answers (greedy), not explored
    temperature: float = 1.0

    def figures(self) -> dict[str, Any]:
        return {
            "episodes": len(self.episodes),
            "prompts": len({t.group_id for t in self.episodes}),
            "mean_feedback": float(np.mean([t.reward for t in self.episodes])) if self.episodes else None,
            "left_out_other_versions": self.other_versions,
            "left_out_not_exploratory": self.not_exploratory,
        }


def _turn_from_dict(d: dict[str, Any], where: str) -> Turn:
    if d.get("completion_ids") and not d.get("logprobs"):
        raise FeedbackEpisodeError(
            f"{where}: the turn has {len(d['completion_ids'])} sampled tokens but no behaviour log-probs "
            "(serve with tracing.capture_tokens on, the default)"
        )
    try:
        return Turn(**d)
    except (TypeError, ValueError) as e:
        raise FeedbackEpisodeError(f"{where}: not a recorded turn ({e})") from None


def trajectory_from_dict(d: dict[str, Any]) -> Trajectory:
    """A served episode as `GET /admin/feedback-episodes` gives it; FeedbackEpisodeError if a turn has
    tokens without behaviour log-probs."""
    d = dict(d)
    task = d.get("task_id", "?")
    d["turns"] = [
        _turn_from_dict(t, f"episode {task!r} turn {i} (role {t.get('role')!r})")
        for i, t in enumerate(d.get("turns") or [])
    ]
    return Trajectory(**d)


def feedback_episodes(
    served: Iterable[Trajectory | dict[str, Any]], incumbent: dict[str, int], temperature: float
) -> FeedbackEpisodes:
    """The exploratory episodes with feedback that the incumbent (adapter -> served version) sampled at
    `temperature`; every turn of them must be a sample of pi_T with behaviour log-probs, else an error."""
    kept: list[Trajectory] = []
    other = greedy = 0
    for item in served:
        traj = trajectory_from_dict(item) if isinstance(item, dict) else item
        if not traj.metadata.get(EXPLORATION_KEY):
            greedy += 1
            continue
        if any(t.adapter in incumbent and t.adapter_version != incumbent[t.adapter] for t in traj.turns):
            other += 1
            continue
        for i, t in enumerate(traj.turns):
            if t.completion_ids and len(t.logprobs) != len(t.completion_ids):
                raise FeedbackEpisodeError(
                    f"episode {traj.task_id!r} turn {i} (role {t.role!r}): no behaviour log-probs"
                )
        kept.append(traj)
    require_on_policy(kept, temperature)  # greedy or other-temperature turns: OffPolicyTurnsError
    return FeedbackEpisodes(kept, other, greedy, temperature)


def collect_feedback(
    served: Iterable[Trajectory | dict[str, Any]],
    incumbent: dict[str, int],
    temperature: float,
    train_prompts: list[str],
    run_dir: Path,
) -> dict[str, Any]:
    """The incumbent's exploratory feedback episodes of the training prompts (never the gate's held-out
    ones), saved as `run_dir/feedback.jsonl`; their figures. ImproveDataError when there are none."""
    found = feedback_episodes(served, incumbent, temperature)
    prompts = set(train_prompts)
    kept = [t for t in found.episodes if t.metadata.get("prompt") in prompts]
    figures = {
        **replace(found, episodes=kept).figures(),
        "left_out_held_out": len(found.episodes) - len(kept),
    }
    if not kept:
        raise ImproveDataError(
            f"no exploratory served episode of the incumbent {incumbent} with feedback on a training prompt "
            f"in the window ({figures}): serve the team with exploration_share > 0 (serving/exploration.py) "
            "and send /v1/feedback on its answers"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    save_jsonl(kept, run_dir / FEEDBACK_FILE)
    return figures


def no_fresh_reward(prompt: str, response: str) -> float:
    """The training reward of `--reward feedback`: there is none for a newly sampled episode."""
    raise ImproveDataError(
        "--reward feedback trains on served episodes only; nothing can score a new episode's answer "
        f"(prompt {prompt[:60]!r}): give a reward (verifier, module:function, judge:FILE) to sample fresh ones"
    )


def truncated_weights(log_rho: np.ndarray, cap: float) -> np.ndarray:
    """w_g = min(exp(log rho_g), cap): truncated importance weights (no self-normalisation)."""
    if not cap > 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    return np.exp(np.minimum(log_rho, np.log(cap)))  # clipped in log space: no overflow


@dataclass
class BehaviourLogProbs:
    """log mu of every trainable turn of the feedback episodes: the trainer's forward pass at the
    incumbent's weights, per adapter, keyed by (episode, turn)."""

    sums: dict[tuple[int, int], float] = field(default_factory=dict)

    @classmethod
    def of(cls, episodes: list[Trajectory], policies: dict[str, AdapterPolicy]) -> BehaviourLogProbs:
        out = cls()
        for adapter, policy in policies.items():
            keys, lps = _score(episodes, adapter, policy)
            out.sums.update(zip(keys, lps, strict=True))
        return out


def _score(
    episodes: list[Trajectory], adapter: str, policy: AdapterPolicy
) -> tuple[list[tuple[int, int]], list[float]]:
    keys = [
        (g, k)
        for g, traj in enumerate(episodes)
        for k, t in enumerate(traj.turns)
        if t.adapter == adapter and t.completion_ids
    ]
    if not keys:
        return [], []
    turns = [episodes[g].turns[k] for g, k in keys]
    scored = policy.score([t.prompt_ids for t in turns], [t.completion_ids for t in turns])
    return keys, [float(lp.sum()) for lp in scored]


def episode_log_ratios(
    episodes: list[Trajectory],
    behaviour: BehaviourLogProbs,
    policies: dict[str, AdapterPolicy],
    moved: Iterable[str],
) -> np.ndarray:
    """log rho_g = sum over the turns of the moved adapters of log pi_now(m) - log mu(m)."""
    log_rho = np.zeros(len(episodes))
    for adapter in moved:
        keys, now = _score(episodes, adapter, policies[adapter])
        for (g, k), lp in zip(keys, now, strict=True):
            log_rho[g] += lp - behaviour.sums[(g, k)]
    return log_rho
