"""The objective of the per-agent step, (10) of docs/training.md: the clipped surrogate L(w) of a role's
messages, and the clipped gradient of -(L(w) - beta d_hat) on one minibatch, d_hat the sampled tokens'
KL estimate or (penalty_kl = exact) the region's exact KL. Both checks of training/teamtr_step.py step
with it (training/probe_check.py, training/sampled_check.py).
"""

from __future__ import annotations

import torch

from teamtr.training.config import LossConfig, TrainConfig
from teamtr.training.losses import Surrogate, clipped_surrogate, kl_estimates, penalised_loss
from teamtr.training.policy import AdapterPolicy, budget_chunks, message_lengths
from teamtr.training.rollouts import RoleMessages
from teamtr.training.trust_region import ExactRegion


def surrogate(
    new_logp: torch.Tensor, old_logp: torch.Tensor, msgs: RoleMessages, loss: LossConfig
) -> Surrogate:
    """The clipped surrogate of `loss.kind` on msgs (message-level ratio for message_ratio, per token otherwise)."""
    return clipped_surrogate(
        new_logp,
        old_logp,
        msgs.mask,
        msgs.adv,
        clip_eps=loss.clip_eps,
        clip_eps_high=float(loss.clip_eps_high),
        message_ratio=loss.message_ratio,
        token_level_aggregation=loss.token_level_aggregation,
        weight=msgs.weight,
    )


def penalised_gradient(
    policy: AdapterPolicy,
    mb: RoleMessages,
    old_logp: torch.Tensor,
    cfg: TrainConfig,
    beta: float,
    region: ExactRegion | None = None,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """The clipped gradient of -(eq. 10) on one minibatch in the adapter's .grad; returns its norm before
    clipping (non-finite when the loss or the gradient is). With `region` (penalty_kl = exact), d_hat is
    the region's exact KL on the minibatch's contexts (`index`: their rows in the region's batch), not the
    sampled tokens' estimate."""
    tr = cfg.trust_region

    def loss_of(new_logp: torch.Tensor) -> torch.Tensor:  # -(eq. 10); -L(w) alone if the exact d_hat follows
        sur = surrogate(new_logp, old_logp, mb, cfg.loss)
        if region is not None:
            return -sur.objective
        kl = kl_estimates(new_logp, old_logp, mb.mask, mb.weight)
        return penalised_loss(sur, kl, beta, tr.estimator, tr.per_token)

    policy.optimizer.zero_grad(set_to_none=True)
    policy.loss_backward(mb, loss_of)  # one token-budget pass's activations at a time
    if region is not None and index is not None:
        # + beta d_hat, exact: this rank's share of the messages, one token-budget pass at a time (as the
        # surrogate's), each weighted so that the passes' and the ranks' sum is the minibatch's mean
        dp = policy.data_parallel
        start, end = (0, len(index)) if dp is None else dp.shard(len(index))
        lengths = message_lengths(mb.prompts[start:end], mb.completions[start:end])
        for s, e in budget_chunks(lengths, policy.token_budget):
            d_hat = region.penalty(index[start + s : start + e], policy.gradient_checkpointing)
            if d_hat.requires_grad:
                (beta * d_hat * (e - s) / len(index)).backward()
    policy.sync_gradients()  # data parallel: summed over the ranks (training/distributed.py)
    return torch.nn.utils.clip_grad_norm_(list(policy.params.values()), cfg.optim.max_grad_norm)
