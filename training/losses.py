"""OPTIMISE step: the clipped surrogate (eq. 10) and the token KL estimates (eq. 11) of docs/training.md.

All functions take padded [M, T] tensors over the updated agent's M messages:
    new_logp  log pi_new(x_u | s, x_<u)   (with grad)
    old_logp  log pi_cur(x_u | s, x_<u)   (the policy before this update; no grad)
    mask      1 on real completion tokens, 0 on padding
and per-message advantages `adv` [M] and sample weights `weight` [M] (1, or the importance weights of
a reweighted stale batch, normalised to mean 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# exp() of a summed log-ratio overflows for long messages far from the old policy; the clip makes the
# gradient zero there anyway, so bounding the exponent changes nothing else.
_MAX_LOG_RATIO = 20.0


@dataclass
class KLEstimates:
    """Estimates of KL(pi_cur || pi_new) from tokens sampled by pi_cur (no vocabulary sum)."""

    k1_message: torch.Tensor  # d_hat (eq. 11): mean over messages of sum_u [log pi_cur - log pi_new]
    k1_token: torch.Tensor  # the same log-ratio, averaged per token
    k3_message: torch.Tensor  # mean over messages of sum_u [(r - 1) - log r], r = pi_new / pi_cur
    k3_token: torch.Tensor  # k3 averaged per token (always >= 0)


def kl_estimates(
    new_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor | None = None
) -> KLEstimates:
    """k1 over sampled tokens, summed per message then averaged over messages (eq. 11), plus k3."""
    weight = torch.ones(mask.shape[0], dtype=new_logp.dtype) if weight is None else weight
    log_r = (new_logp - old_logp) * mask  # log pi_new/pi_cur per sampled token
    k1_tok = -log_r  # log pi_cur - log pi_new
    k3_tok = (torch.exp(log_r) - 1.0 - log_r) * mask
    tokens = (weight[:, None] * mask).sum().clamp_min(1.0)
    return KLEstimates(
        k1_message=_weighted_mean(k1_tok.sum(1), weight),
        k1_token=(weight[:, None] * k1_tok).sum() / tokens,
        k3_message=_weighted_mean(k3_tok.sum(1), weight),
        k3_token=(weight[:, None] * k3_tok).sum() / tokens,
    )


@dataclass
class Surrogate:
    """The clipped surrogate and the terms the certificate needs, on one set of messages."""

    objective: torch.Tensor  # E[min(w A, clip(w, 1-eps, 1+eps_high) A)] (the quantity maximised)
    improvement: torch.Tensor  # L_hat = objective - E[A] (zero when pi_new = pi_cur)
    zeta_ratio: torch.Tensor  # E|min(wA, clip(w)A) - wA|: what the ratio clip removes from the IS estimate
    clip_fraction: torch.Tensor  # share of messages (or tokens) whose ratio was clipped


def clipped_surrogate(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    adv: torch.Tensor,
    *,
    clip_eps: float,
    clip_eps_high: float,
    message_ratio: bool,
    token_level_aggregation: bool = False,
    weight: torch.Tensor | None = None,
) -> Surrogate:
    """Eq. 10's first term.

    message_ratio=True (TeamTR): w_m = exp(sum_u log pi_new/pi_cur), one ratio per message.
    message_ratio=False (PPO/GRPO/DAPO): w_u = pi_new/pi_cur per token; the per-token terms are averaged
    within each message (token_level_aggregation=False) or over all tokens of the batch (DAPO).
    """
    weight = torch.ones(mask.shape[0], dtype=new_logp.dtype) if weight is None else weight
    log_r = (new_logp - old_logp) * mask
    lo, hi = 1.0 - clip_eps, 1.0 + clip_eps_high
    if message_ratio:
        w = torch.exp(log_r.sum(1).clamp(max=_MAX_LOG_RATIO))  # [M] message-level ratio
        unclipped = w * adv
        per_message = torch.minimum(unclipped, torch.clamp(w, lo, hi) * adv)
        clipped = (per_message != unclipped).to(w.dtype)
        return Surrogate(
            objective=_weighted_mean(per_message, weight),
            improvement=_weighted_mean(per_message - adv, weight),
            zeta_ratio=_weighted_mean((per_message - unclipped).abs(), weight),
            clip_fraction=_weighted_mean(clipped, weight),
        )

    w = torch.exp(log_r.clamp(max=_MAX_LOG_RATIO))  # [M, T] per-token ratio
    a = adv[:, None].expand_as(w)
    unclipped = w * a
    per_token = torch.minimum(unclipped, torch.clamp(w, lo, hi) * a)
    clipped = (per_token != unclipped).to(w.dtype)
    if token_level_aggregation:  # DAPO: every token of the batch weighs the same
        tw = weight[:, None] * mask
        total = tw.sum().clamp_min(1.0)

        def agg(x: torch.Tensor) -> torch.Tensor:
            return (x * tw).sum() / total
    else:  # PPO/GRPO: mean over a message's tokens, then mean over messages
        lengths = mask.sum(1).clamp_min(1.0)

        def agg(x: torch.Tensor) -> torch.Tensor:
            return _weighted_mean((x * mask).sum(1) / lengths, weight)

    return Surrogate(
        objective=agg(per_token),
        improvement=agg(per_token - a),
        zeta_ratio=agg((per_token - unclipped).abs()),
        clip_fraction=agg(clipped),
    )


def monitored_kl(kl: KLEstimates, estimator: str = "k1", per_token: bool = False) -> torch.Tensor:
    """The d_hat the trust region constrains: eq. 11's k1 message sum by default."""
    if estimator == "k1":
        return kl.k1_token if per_token else kl.k1_message
    if estimator == "k3":
        return kl.k3_token if per_token else kl.k3_message
    raise ValueError(f"unknown KL estimator {estimator!r}")


def penalised_loss(
    surrogate: Surrogate, kl: KLEstimates, beta: float, estimator: str = "k1", per_token: bool = False
) -> torch.Tensor:
    """Eq. 10 as a loss to minimise: -(surrogate - beta * d_hat).

    On tokens sampled from pi_cur, k1 and k3 are both unbiased estimates of KL(pi_cur || pi_new) and of
    its gradient with respect to pi_new (the sampling distribution does not depend on the new weights).
    """
    return -(surrogate.objective - beta * monitored_kl(kl, estimator, per_token))


def _weighted_mean(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x * weight).sum() / weight.sum().clamp_min(1e-12)
