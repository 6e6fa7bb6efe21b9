"""The sampling-temperature guard: the trainer only learns from turns that are samples of the policy it
trains, with behaviour log-probs of that policy.

The trainer trains pi_T = softmax(logits / T) at the rollout temperature T (`rollout.temperature`;
training/policy.py computes its own log pi_cur at T, so every ratio is pi_new_T / pi_cur_T). A turn is
usable when it was sampled at that same T > 0 from the full distribution (top_p = 1). Refused, with the
reason, are turns that were:

- greedy (T = 0: served turns, held-out evaluations): a deterministic policy, its recorded log-probs
  are those of pi at T = 1, not of the policy that produced the message;
- sampled at another temperature (the ratios and KLs would be of another policy: silently off-policy);
- sampled with top_p < 1 (the nucleus of pi_new differs from pi_cur's, so the ratio of the truncated
  policies is not defined on every sampled token);
- of unknown temperature (recorded before graphs/trajectory.py Turn stored it).

docs/training.md ("Sampling temperature") gives the reasons for training at T rather than refusing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from teamtr.graphs.trajectory import Trajectory, Turn


class OffPolicyTurnsError(ValueError):
    """Turns that are not samples of the policy being trained (wrong temperature, greedy, nucleus)."""


def why_not_on_policy(turn: Turn, temperature: float) -> str | None:
    """None when `turn` is a sample of pi at `temperature` with behaviour log-probs of it; else why not."""
    if turn.temperature is None:
        return "its sampling temperature is unknown (recorded before turns stored it)"
    if turn.temperature == 0:
        return "it was sampled greedily (T = 0): not a sample of a stochastic policy"
    if not math.isclose(turn.temperature, temperature, rel_tol=1e-9, abs_tol=0.0):
        return f"it was sampled at temperature {turn.temperature}, the trainer trains pi at T = {temperature}"
    if turn.top_p is not None and turn.top_p < 1:
        return f"it was sampled with top_p = {turn.top_p} < 1 (nucleus ratios are not defined)"
    return None


def require_on_policy(trajectories: Iterable[Trajectory], temperature: float) -> None:
    """Raise OffPolicyTurnsError, naming the first offending turn and how many there are, unless every
    turn with tokens is a sample of pi at `temperature` (T > 0, top_p = 1)."""
    first: tuple[Trajectory, Turn, str] | None = None
    bad = total = 0
    for traj in trajectories:
        for turn in traj.turns:
            if not turn.completion_ids:  # nothing to train on (a text-only turn)
                continue
            total += 1
            reason = why_not_on_policy(turn, temperature)
            if reason is not None:
                bad += 1
                first = first or (traj, turn, reason)
    if first is not None:
        traj, turn, reason = first
        raise OffPolicyTurnsError(
            f"{bad} of {total} turns are not samples of the policy being trained; e.g. role "
            f"{turn.role!r} in episode {traj.task_id!r}: {reason}. Sample the rollouts at "
            f"rollout.temperature = {temperature} with top_p = 1 (docs/training.md, 'Sampling temperature')"
        )
