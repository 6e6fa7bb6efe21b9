"""What the trainer measures around each update, beside the step itself (docs/training.md, "Certificate
and diagnostics"): the stale gap, the occupancy divergence, the ESS of importance weights, the log-prob
gap between the engine and the trainer, and the adapter versions a batch was sampled with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from teamtr.graphs.trajectory import Turn
from teamtr.training.advantages import advantages_for
from teamtr.training.config import LossConfig
from teamtr.training.policy import AdapterPolicy
from teamtr.training.rollouts import RoleMessages, RolloutBatch, messages_of_role
from teamtr.training.stage import UpdateContext
from teamtr.training.teamtr_step import StepResult, surrogate


def logprob_gap(msgs: RoleMessages, old_logp: torch.Tensor) -> float:
    """mean |behaviour log-prob recorded by the engine - the trainer's own log pi_cur| per token."""
    return float(((old_logp - msgs.behaviour_logp).abs() * msgs.mask).sum() / msgs.mask.sum().clamp_min(1))


def ess_fraction(weights: np.ndarray) -> float:
    """ESS / B = (sum w)^2 / (B sum w^2) of the B episode weights."""
    return float(weights.sum() ** 2 / (len(weights) * (weights**2).sum()))


def turn_versions(batch: RolloutBatch) -> dict[str, list[int]]:
    """adapter -> the adapter versions recorded in the batch's turns (what the episodes were sampled with)."""
    seen: dict[str, set[int]] = {}
    for traj in batch.trajectories:
        for t in traj.turns:
            if t.adapter is not None:
                seen.setdefault(t.adapter, set()).add(t.adapter_version)
    return {a: sorted(v) for a, v in seen.items()}


def _turns_of(batch: RolloutBatch, adapter: str) -> list[tuple[int, Turn]]:
    return [(g, t) for g, traj in enumerate(batch.trajectories) for t in traj.turns if t.adapter == adapter]


def importance_weights(batch: RolloutBatch, policies: dict[str, AdapterPolicy]) -> np.ndarray:
    """Stale episodes reweighted towards the current team: prod over turns of roles updated since the
    batch was sampled of pi_now / pi_behaviour (self-normalised to mean 1)."""
    log_w = np.zeros(len(batch.trajectories))
    for adapter, policy in policies.items():
        if policy.version() == batch.versions.get(adapter):
            continue
        turns = _turns_of(batch, adapter)
        now = policy.score([t.prompt_ids for _, t in turns], [t.completion_ids for _, t in turns])
        for (g, t), lp in zip(turns, now, strict=True):
            log_w[g] += float(lp.sum()) - t.logprob_sum
    w = np.exp(log_w - log_w.max())
    return w / w.mean()


def occupancy_divergence(
    fresh: RolloutBatch,
    stage_start: RolloutBatch,
    stage_start_weights: dict[str, dict[str, torch.Tensor]],
    policies: dict[str, AdapterPolicy],
) -> float:
    """KL(P_{pi^(i-1)} || P_{pi^0}) over episodes, estimated on the fresh rollouts of pi^(i-1):
    mean over episodes of the summed log-ratio of every turn of a role updated this stage (k1)."""
    total = np.zeros(len(fresh.trajectories))
    for adapter, start in stage_start_weights.items():
        if fresh.versions.get(adapter) == stage_start.versions.get(adapter):
            continue
        turns = _turns_of(fresh, adapter)
        policy = policies[adapter]
        now = policy.weights()
        policy.load_weights(start)  # score with pi^0's weights, then put the current ones back exactly
        try:
            old = policy.score([t.prompt_ids for _, t in turns], [t.completion_ids for _, t in turns])
        finally:
            policy.load_weights(now)
        for (g, t), lp in zip(turns, old, strict=True):
            total[g] += t.logprob_sum - float(lp.sum())
    return float(total.mean())


@dataclass
class StaleGap:
    """Stale gap = |L_hat_i(stage-start batch) - L_hat_i(fresh batch)| of the accepted update, each batch with
    its own advantages. Measured for i >= 2 whenever a fresh batch of pi^(i-1) exists: `before` caches
    log pi_cur on both batches, `after` evaluates the surrogate of the step's pi_new on them."""

    ctx: UpdateContext[RolloutBatch]
    messages: dict[str, RoleMessages]  # "stale" / "fresh" -> j's messages in that batch
    old_logp: dict[str, torch.Tensor]  # log pi_cur of those messages (the update's batch: filled by after)
    loss: LossConfig

    @classmethod
    def before(cls, ctx: UpdateContext[RolloutBatch], policy: AdapterPolicy, loss: LossConfig) -> StaleGap:
        messages: dict[str, RoleMessages] = {}
        old_logp: dict[str, torch.Tensor] = {}
        if ctx.index >= 2 and ctx.fresh_batch is not None:
            for name, batch in (("stale", ctx.stage_start_batch), ("fresh", ctx.fresh_batch)):
                adv = advantages_for(batch.rewards, batch.groups, loss)
                messages[name] = messages_of_role(batch, ctx.role, adv)
                if not cls._is_update_batch(ctx, name):
                    old_logp[name] = policy.logp(messages[name], grad=False)
        return cls(ctx, messages, old_logp, loss)

    def after(self, step: StepResult, policy: AdapterPolicy) -> dict[str, float | None]:
        if not self.messages:
            return {"surrogate_stale": None, "surrogate_fresh": None, "stale_gap": None}
        values = {}
        with torch.no_grad():
            for name, msgs in self.messages.items():
                if self._is_update_batch(self.ctx, name):  # the step's own messages: reuse its log-probs
                    old, new = step.old_logp, step.new_logp
                else:
                    old, new = self.old_logp[name], policy.logp(msgs, grad=False)
                values[name] = float(surrogate(new, old, msgs, self.loss).improvement)
        return {
            "surrogate_stale": values["stale"],
            "surrogate_fresh": values["fresh"],
            "stale_gap": abs(values["stale"] - values["fresh"]),
        }

    @staticmethod
    def _is_update_batch(ctx: UpdateContext[RolloutBatch], name: str) -> bool:
        batch = ctx.stage_start_batch if name == "stale" else ctx.fresh_batch
        return batch is ctx.batch and not ctx.reweight
