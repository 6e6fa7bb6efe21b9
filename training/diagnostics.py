"""What the trainer measures around each update, beside the step itself (docs/training.md, "Certificate
and diagnostics"): the stale gap, the occupancy divergence, the ESS of importance weights, the log-prob
gap between the engine and the trainer (`behaviour_gaps`: on every role's turns, when vLLM samples the
rollouts), the adapter versions a batch was sampled with, and the held-out KL check
(KL(pi_cur || pi_new) on held-out contexts, `OutOfSampleKL`), which also gives the certificate its held-out
surrogate (`OutOfSampleKL.heldout_surrogate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from teamtr.graphs.trajectory import Trajectory, Turn
from teamtr.training.advantages import advantages_for
from teamtr.training.certificate import heldout_surrogate
from teamtr.training.config import LossConfig
from teamtr.training.penalised_objective import surrogate
from teamtr.training.policy import AdapterPolicy
from teamtr.training.rollouts import RoleMessages, RolloutBatch, Speakers, messages_of_role
from teamtr.training.stage import UpdateContext
from teamtr.training.teamtr_step import StepResult
from teamtr.training.vocab_kl import MessageKL, Side, message_divergences

HELDOUT_KL_CHUNK = 8  # messages per forward pass of the held-out KL check (vocabulary in chunks of positions)


def logprob_gap(msgs: RoleMessages, old_logp: torch.Tensor) -> float:
    """mean |behaviour log-prob recorded by the engine - the trainer's own log pi_cur| per token."""
    return float(((old_logp - msgs.behaviour_logp).abs() * msgs.mask).sum() / msgs.mask.sum().clamp_min(1))


def logprob_gap_max(msgs: RoleMessages, old_logp: torch.Tensor) -> float:
    """max |behaviour log-prob recorded by the engine - the trainer's own log pi_cur| over the tokens."""
    return float(((old_logp - msgs.behaviour_logp).abs() * msgs.mask).max()) if msgs.mask.numel() else 0.0


def behaviour_gaps(batch: RolloutBatch, policies: dict[str, AdapterPolicy]) -> dict[str, dict[str, float]]:
    """adapter -> max / mean |recorded log-prob - the trainer's log-prob now| over the batch's turns of
    that adapter, for every adapter the batch was sampled at the trainer's current version of. When
    another engine (vLLM) samples the rollouts, this checks that it served the weights the trainer holds:
    an adapter pushed late or not at all shows a gap of the size of the update, not of rounding."""
    out: dict[str, dict[str, float]] = {}
    for adapter, policy in policies.items():
        turns = [t for _, t in _turns_of(batch, adapter) if t.completion_ids]
        if not turns or any(t.adapter_version != policy.version() for t in turns):
            continue
        now = policy.score([t.prompt_ids for t in turns], [t.completion_ids for t in turns])
        gaps = torch.cat(
            [(lp - torch.tensor(t.logprobs, dtype=lp.dtype)).abs() for t, lp in zip(turns, now, strict=True)]
        )
        out[adapter] = {"max": float(gaps.max()), "mean": float(gaps.mean()), "tokens": int(gaps.numel())}
    return out


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


@dataclass
class OutOfSampleKL:
    """The held-out KL check: KL(pi_cur || pi_new) of the updated role on contexts it was
    not fitted on. `before` takes role j's messages in held-out episodes of the current team (sampled
    before the update, never trained on: the contexts j meets, with messages of pi_cur) and pi_cur's
    weights; `after` computes, at each message position, the exact next-token KL over the vocabulary
    (training/vocab_kl.py, the computation Stage-0 uses), sums it per message (the unit of eq. 11) and
    averages over messages. By the chain rule this is an unbiased estimate of the message-level
    KL(pi_cur || pi_new) on those contexts. A rejected update restored pi_cur exactly: 0."""

    policy: AdapterPolicy
    prompts: list[list[int]]
    completions: list[list[int]]
    weights_before: dict[str, torch.Tensor]
    # for the held-out surrogate of the certificate (training/certificate.py `heldout_surrogate`):
    episode_of: list[int] = field(default_factory=list)  # the held-out episode of each message
    rewards: list[float] = field(default_factory=list)  # every held-out episode's reward
    log_ratios: torch.Tensor | None = None  # [M] log pi_new / pi_cur of each sampled message (per_message)
    divergences: MessageKL | None = None  # forward and reverse KL of each message (per_message)
    exact_zero: bool = False  # the update is known to leave pi_cur unchanged: nothing sampled, every figure 0

    @classmethod
    def unchanged(cls, policy: AdapterPolicy) -> OutOfSampleKL:
        """The check of an update without signal (no step: pi_new = pi_cur bit for bit): its KL and
        held-out surrogate are exactly 0, known without sampling the held-out episodes."""
        return cls(policy, [], [], {}, exact_zero=True)

    @classmethod
    def before(cls, trajectories: list[Trajectory], role: Speakers, policy: AdapterPolicy) -> OutOfSampleKL:
        turns = [
            (k, t) for k, traj in enumerate(trajectories) for t in traj.turns_of(role) if t.completion_ids
        ]
        return cls(
            policy,
            [t.prompt_ids for _, t in turns],
            [t.completion_ids for _, t in turns],
            policy.weights() if turns else {},
            episode_of=[k for k, _ in turns],
            rewards=[float(traj.reward) for traj in trajectories],
        )

    def per_message(self) -> torch.Tensor:
        """[M] KL(pi_cur || pi_new) of each held-out message (pi_T at the policy's temperature), chunked by
        positions (training/vocab_kl.py `message_divergences`); sets `log_ratios` from the same passes."""
        policy = self.policy
        side = Side(policy.engine, policy.base, policy.adapter)
        self.divergences, self.log_ratios = message_divergences(
            side, self.prompts, self.completions, self.weights_before, policy.temperature, HELDOUT_KL_CHUNK
        )
        return self.divergences.forward

    def heldout_surrogate(self) -> tuple[float, float, int] | None:
        """(L_ho, its standard error, episodes) of the update just measured by `per_message`: the
        importance-weighted surrogate of pi_new on the held-out episodes of pi_cur, in reward units."""
        if self.exact_zero:
            return 0.0, 0.0, 0
        if self.log_ratios is None or not self.rewards:
            return None
        per_episode: list[list[float]] = [[] for _ in self.rewards]
        for k, lr in zip(self.episode_of, self.log_ratios.tolist(), strict=True):
            per_episode[k].append(lr)
        value, se = heldout_surrogate(per_episode, self.rewards)
        return value, se, len(self.rewards)

    def after(self, delta: float, per_token: bool, direction: str = "forward") -> dict[str, float | int | bool | None]:
        """The update record's fields: mean forward KL per message and per token, the reverse KL, how many
        messages, and delta_eff: the KL in the region's `direction` (per token when the region is per
        token), and whether it exceeded delta."""
        if self.exact_zero:
            return {
                "kl_out_of_sample": 0.0,
                "kl_out_of_sample_token": 0.0,
                "kl_out_of_sample_messages": 0,
                "kl_out_of_sample_reverse": 0.0,
                "left_region_out_of_sample": False,
                "delta_eff": 0.0,
            }
        if not self.prompts:
            return {
                "kl_out_of_sample": None,
                "kl_out_of_sample_token": None,
                "kl_out_of_sample_messages": 0,
                "kl_out_of_sample_reverse": None,
                "left_region_out_of_sample": None,
                "delta_eff": None,
            }
        kl = self.per_message()
        tokens = sum(len(c) for c in self.completions)
        constrained = self.divergences.of(direction)
        effective = float(constrained.sum()) / tokens if per_token else float(constrained.mean())
        return {
            "kl_out_of_sample": float(kl.mean()),
            "kl_out_of_sample_token": float(kl.sum()) / tokens,
            "kl_out_of_sample_reverse": float(self.divergences.reverse.mean()),
            "kl_out_of_sample_messages": len(self.prompts),
            "left_region_out_of_sample": effective > delta,
            "delta_eff": effective,  # the step really taken, in the units of delta (logged beside it)
        }


def out_of_sample_summary(updates: list[dict]) -> dict[str, float | None]:
    """Per run: the fraction of monitored updates whose out-of-sample KL exceeded delta (the paper's
    violation rate) and the mean out-of-sample KL; None when no update was monitored."""
    flags = [
        u["left_region_out_of_sample"] for u in updates if u.get("left_region_out_of_sample") is not None
    ]
    values = [u["kl_out_of_sample"] for u in updates if u.get("kl_out_of_sample") is not None]
    return {
        "left_region_out_of_sample_fraction": float(np.mean(flags)) if flags else None,
        "kl_out_of_sample_mean": float(np.mean(values)) if values else None,
    }


def logprob_gap_summary(updates: list[dict]) -> dict[str, float | None]:
    """Per run: the largest |engine's recorded log-prob - trainer's| of any update's role (the updated
    role's own gap) and, when vLLM sampled the rollouts, of any role's turns in any batch."""
    own = [u["logprob_gap_max"] for u in updates if u.get("logprob_gap_max") is not None]
    rollout = [g["max"] for u in updates for g in (u.get("rollout_logprob_gaps") or {}).values()]
    return {
        "logprob_gap_max": max(own) if own else None,
        "rollout_logprob_gap_max": max(rollout) if rollout else None,
    }


def promised_surrogate(step: StepResult, batch: RolloutBatch) -> float:
    """The update's promised improvement in reward units, on the batch it was fitted on: the estimator
    of the held-out surrogate (training/certificate.py `heldout_surrogate`: mean_k sum_u (w_ku - 1)
    (R_k - b_k), leave-one-out baseline) with pi_new's in-sample log-ratios, so that it and L_ho differ
    only in the episodes they are computed on."""
    msgs = step.messages
    ratios = ((step.new_logp - step.old_logp) * msgs.mask).sum(-1).tolist()
    per_episode: list[list[float]] = [[] for _ in batch.trajectories]
    for k, lr in zip(msgs.episode.tolist(), ratios, strict=True):
        per_episode[k].append(lr)
    return heldout_surrogate(per_episode, batch.rewards)[0]


def stale_penalty(step: StepResult, batch: RolloutBatch, heldout_kl: OutOfSampleKL) -> dict[str, float | None]:
    """Promised vs delivered: the update's in-sample L_hat (reward units, `promised_surrogate`) minus
    L_ho on the held-out KL check's independent fresh episodes of pi^(i-1) (measured by `heldout_kl.after` first).
    In TeamTR's arm the batch is pi^(i-1)'s too, so the penalty is overfitting plus noise; in the naive
    arm it is pi^0's, so it adds the staleness: their difference between arms is the stale penalty."""
    heldout = heldout_kl.heldout_surrogate()
    if heldout is None or not len(step.messages):
        return {"surrogate_promised": None, "surrogate_heldout": None, "stale_penalty": None}
    promised = promised_surrogate(step, batch)
    return {"surrogate_promised": promised, "surrogate_heldout": heldout[0], "stale_penalty": promised - heldout[0]}
