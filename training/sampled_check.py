"""The sampled check (trust_region.check = sampled) of the per-agent step: one attempt of
training/trust_region.py `enforce_trust_region`, epochs of -(L(w) - beta d_hat) (10) with d_hat (11)
measured on the batch's own tokens after each epoch; the caller undoes an attempt outside and retries with
lr / 2, beta * 2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from teamtr.training.config import TrainConfig
from teamtr.training.losses import kl_estimates, monitored_kl
from teamtr.training.penalised_objective import penalised_gradient
from teamtr.training.policy import AdapterPolicy
from teamtr.training.rollouts import RoleMessages
from teamtr.training.trust_region import AttemptResult


def penalised_surrogate_epochs(
    policy: AdapterPolicy,
    msgs: RoleMessages,
    old_logp: torch.Tensor,
    cfg: TrainConfig,
    lr: float,
    beta: float,
    seed: int,
    on_epoch: Callable[[int, float], None] | None = None,
) -> AttemptResult:
    """One attempt: inner epochs over minibatches of j's messages, early stop once d_hat exceeds delta.

    After each epoch d_hat is measured on the whole batch at the epoch's final weights (one forward
    pass): that decides early stopping, so it works with one minibatch too (an estimate taken before
    each minibatch's step is 0 for the first one: it is measured at pi_cur). The last epoch's
    measurement decides acceptance and comes back with log pi_new of the whole batch."""
    tr = cfg.trust_region
    for group in policy.optimizer.param_groups:
        group["lr"] = lr
    gen = torch.Generator().manual_seed(seed)
    epochs_run, early_stopped = 0, False
    for epoch in range(1, cfg.optim.epochs + 1):
        for idx in torch.randperm(len(msgs), generator=gen).split(cfg.optim.minibatch_messages):
            penalised_gradient(policy, msgs.subset(idx), old_logp[idx], cfg, beta)
            policy.optimizer.step()
        epochs_run = epoch
        new_logp, d_hat = whole_batch_kl(policy, msgs, old_logp, cfg)  # one decision on every rank
        if on_epoch is not None:
            on_epoch(epoch, d_hat)
        outside = not d_hat <= tr.delta  # a non-finite d_hat is outside
        if tr.enabled and tr.early_stop and outside and epoch < cfg.optim.epochs:
            early_stopped = True
            break
    return AttemptResult(d_hat=d_hat, epochs_run=epochs_run, early_stopped=early_stopped, new_logp=new_logp)


def whole_batch_kl(
    policy: AdapterPolicy, msgs: RoleMessages, old_logp: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, float]:
    """log pi_new of the whole batch and the monitored d_hat on it (eq. 11), agreed over ranks."""
    tr = cfg.trust_region
    with torch.no_grad():
        new_logp = policy.logp(msgs, grad=False)
        kl_all = kl_estimates(new_logp, old_logp, msgs.mask, msgs.weight)
    return new_logp, policy.agree(float(monitored_kl(kl_all, tr.estimator, tr.per_token)))
