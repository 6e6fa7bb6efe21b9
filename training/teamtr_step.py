"""The per-agent step of Algorithm 1: update agent j = sigma(i) of the team on one rollout batch.

`teamtr_step` reads top to bottom as the algorithm; docs/training.md ("The per-agent step") maps each
line to its equation, (A), (10), (11), (T) there:

    ADV       A_g = clip(R_g - mean_{h != g} R_h, -A_clip, A_clip)  (rloo; or group-normalised)  (A)
              too few prompt groups with reward spread: no step (no_signal)
    CACHE     log pi_cur of j's sampled tokens (at the rollout temperature; training/behaviour.py)
    OPTIMISE  epochs of -(L(w) - beta d_hat) on minibatches of j's messages                (10)
    MONITOR   after EVERY optimiser step: exact KL(pi_cur, pi_now) on the batch's contexts and the
              probe's bound on held-out contexts <= delta; a step that would leave is line-searched
              back along its direction (the farthest point inside, near the boundary) and the update
              ends there; a
              non-finite gradient or KL is outside: the update ends at the last inside iterate   (11)
              (check = sampled: d_hat on the batch's own tokens per epoch, undo, lr / 2, beta * 2)
    CERTIFY   term_i = L_hat - c sqrt(d_hat) - zeta_hat / (1 - gamma); speak-once or general form  (T)
    COMMIT    swap j's accepted weights in (version bump)

Which batch the step sees (fresh pi^(i-1), or the stale one of pi^0) is the schedule's choice, made by
training/stage.py `run_stage`; diagnostics, logging and resume bookkeeping are training/llm_team.py's.
The step's pieces by job: the objective (10) in training/penalised_objective.py, OPTIMISE + MONITOR of the
probe check in training/probe_check.py and of the sampled check in training/sampled_check.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from teamtr.training.advantages import Advantages, advantages_for
from teamtr.training.behaviour import require_on_policy
from teamtr.training.certificate import CertificateTerm, update_term
from teamtr.training.config import LossConfig, TrainConfig
from teamtr.training.losses import KLEstimates, Surrogate, kl_estimates, monitored_kl
from teamtr.training.penalised_objective import surrogate
from teamtr.training.policy import AdapterPolicy
from teamtr.training.probe_check import optimise_inside_region, probed_outcome
from teamtr.training.rollouts import RoleMessages, RolloutBatch, Speakers, messages_of_role
from teamtr.training.sampled_check import penalised_surrogate_epochs
from teamtr.training.trust_region import (
    AttemptLog,
    AttemptResult,
    ExactRegion,
    RegionCheck,
    TrustRegionOutcome,
    enforce_trust_region,
)
from teamtr.training.vocab_kl import Side

Contexts = tuple[list[list[int]], list[list[int]]]  # (prompts, completions) of one role's messages


@dataclass
class StepResult:
    """What one update of agent j did, at the accepted (or, if rejected, restored) weights."""

    advantages: Advantages
    messages: RoleMessages  # j's M messages the update was optimised on
    old_logp: torch.Tensor  # [M, T] log pi_cur
    new_logp: torch.Tensor  # [M, T] log pi_new (= old_logp when rejected)
    region: TrustRegionOutcome  # accepted or not, every attempt, the next beta
    surrogate: Surrogate  # L_hat and the ratio clip's share at pi_new
    kl: KLEstimates  # k1 / k3, per message / per token
    d_hat: float  # the estimate the trust region constrains (eq. 11, or its k3 form)
    certificate: CertificateTerm
    version: int  # j's adapter version after the step (bumped iff accepted)
    no_signal: bool = False  # no message, or too few groups with reward spread: nothing optimised
    region_check: RegionCheck | None = None  # check = probe: the exact KLs at the accepted weights
    optimiser_steps: int = 0  # check = probe: optimiser steps kept (the last one possibly shortened)
    stop: str = ""  # check = probe: "epochs" (all inside), "boundary" (line search), "extrapolated", "non_finite"
    probe_messages: int = 0  # check = probe: j's messages in the probe's held-out episodes

    @property
    def accepted(self) -> bool:
        return self.region.accepted


def teamtr_step(
    batch: RolloutBatch,
    role: Speakers,
    policy: AdapterPolicy,
    beta: float,
    cfg: TrainConfig,
    *,
    minibatch_seed: Callable[[int], int],
    episode_weights: np.ndarray | None = None,
    probe: Callable[[], Contexts] | None = None,
    baselines: np.ndarray | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> StepResult:
    """Update `role` (policy pi_j) on `batch` inside its KL trust region; commit it if accepted.

    minibatch_seed(attempt) seeds the minibatch order of each attempt; episode_weights reweight a stale
    batch towards the current team (importance_weighting schedule); probe() draws role j's contexts in
    held-out episodes of the current team, on which check = probe holds the region (none: the batch only);
    it is called only when a step is attempted, so an update without signal samples nothing; baselines:
    loss.credit = prefix, each episode's mean return from j's own prefix (training/advantages.py)."""
    tr = cfg.trust_region
    # the batch must be samples of pi_T, the policy trained (training/behaviour.py says why not)
    require_on_policy(batch.trajectories, policy.temperature)
    # ADV (A): bounded advantage of every episode against its prompt group (rloo by default), or against
    # continuations from j's own prefix (loss.credit = prefix)
    adv = advantages_for(batch.rewards, batch.groups, cfg.loss, baselines)
    # only j's tokens enter its loss; each of its messages carries its episode's A_g
    msgs = messages_of_role(batch, role, adv, episode_weights)
    # CACHE: log pi_cur(x_u | s, x_<u) by the trainer's own forward pass (the ratio's denominator)
    old_logp = policy.logp(msgs, grad=False)

    # too little evidence: no message (DAPO dropped every group), or fewer than min_signal_groups prompt
    # groups with reward spread: no step and no new version (`no_signal`). Rank 0's decision on every rank
    no_signal = policy.agree(float(lacks_signal(adv, msgs, cfg.loss))) > 0.5
    probed: tuple[RegionCheck, int, str] | None = None
    probe_contexts: Contexts = ([], [])
    if no_signal:
        region = no_attempt(beta)
    elif tr.enabled and tr.check == "probe":
        # OPTIMISE + MONITOR (10, 11): the region checked exactly after every step, on the batch's
        # contexts and on held-out ones (the probe); the last iterate is always inside
        probe_contexts = probe() if probe is not None else ([], [])
        exact = ExactRegion(
            Side(policy.engine, policy.base, policy.adapter),
            policy.temperature,
            (msgs.prompts, msgs.completions),
            probe_contexts,
            tr,
        )
        restore = policy.snapshot()
        probed = optimise_inside_region(policy, msgs, old_logp, cfg, beta, exact, minibatch_seed(1), on_epoch)
        region = probed_outcome(probed, policy, msgs, cfg, beta)
        policy.passed_tokens += exact.passed_tokens  # the region's KL passes are the update's cost too
        if not region.accepted:  # no step kept: pi_cur and its optimiser state, bit for bit
            restore()
    else:
        # check = sampled: epochs of -(L(w) - beta d_hat) (10); accepted iff d_hat <= delta (11) on the
        # batch's own tokens, else restored exactly and retried with lr / 2, beta * 2
        attempt_number = itertools.count(1)

        def attempt(lr: float, beta: float) -> AttemptResult:
            seed = minibatch_seed(next(attempt_number))
            return penalised_surrogate_epochs(policy, msgs, old_logp, cfg, lr, beta, seed, on_epoch)

        region = enforce_trust_region(attempt, policy.snapshot, tr, cfg.optim.lr, beta)
    # LOG, CERTIFY (T), COMMIT at the accepted weights (or pi_cur, restored)
    probe_messages = len(probe_contexts[0])
    return step_result(batch, role, policy, cfg, adv, msgs, old_logp, region, probed, no_signal, probe_messages)


def lacks_signal(adv: Advantages, msgs: RoleMessages, loss: LossConfig) -> bool:
    """No message (DAPO dropped every group), fewer than `min_signal_groups` prompt groups with reward
    spread, or no message with a non-zero advantage: an update would have nothing to follow."""
    return not len(msgs) or adv.signal_groups < loss.min_signal_groups or not torch.any(msgs.adv != 0)


def batch_lacks_signal(
    batch: RolloutBatch, role: Speakers, loss: LossConfig, baselines: np.ndarray | None = None
) -> bool:
    """`lacks_signal` from the batch's rewards alone (no forward pass): known before the update's step."""
    adv = advantages_for(batch.rewards, batch.groups, loss, baselines)
    return lacks_signal(adv, messages_of_role(batch, role, adv), loss)


def no_attempt(beta: float) -> TrustRegionOutcome:
    """The region's record of an update that tried no step (no signal): not accepted, beta unchanged."""
    log = AttemptLog(0.0, beta, 0.0, epochs_run=0, early_stopped=False, inside=True)
    return TrustRegionOutcome(accepted=False, d_hat=0.0, attempts=[log], beta_next=beta)


def step_result(
    batch: RolloutBatch,
    role: Speakers,
    policy: AdapterPolicy,
    cfg: TrainConfig,
    adv: Advantages,
    msgs: RoleMessages,
    old_logp: torch.Tensor,
    region: TrustRegionOutcome,
    probed: tuple[RegionCheck, int, str] | None,
    no_signal: bool,
    probe_messages: int,
) -> StepResult:
    """LOG, CERTIFY and COMMIT of one role's update whose weights are final (accepted, or restored):
    L_hat, the KL estimates and d_hat at pi_new, the term (T), and the version bump when accepted."""
    tr = cfg.trust_region
    # pi_new: the accepted attempt's weights; a rejected update restored pi_cur bit for bit
    new_logp = region.accepted_attempt.new_logp if region.accepted_attempt is not None else old_logp

    with torch.no_grad():  # L_hat = mean[min(w A, clip(w) A)] - mean[A], and the KL estimates, at pi_new
        sur = surrogate(new_logp, old_logp, msgs, cfg.loss)
        kl = kl_estimates(new_logp, old_logp, msgs.mask, msgs.weight)
    # d_hat: the probe check's constrained value (exact), else the sampled estimate on the batch
    d_hat = (
        probed[0].value
        if probed is not None and region.accepted
        else float(monitored_kl(kl, tr.estimator, tr.per_token))
    )
    # CERTIFY (T): term_i = L_hat_i - c sqrt(d_hat_i) - (zeta_clip + zeta_ratio + zeta_norm) / (1 - gamma);
    # the held-out forms' constants: T and N_j from the batch's turns (speak_once iff N_j <= 1)
    term = update_term(
        surrogate=float(sur.improvement),
        d_hat=d_hat,
        zeta_clip=adv.zeta_clip,
        zeta_ratio=float(sur.zeta_ratio),
        zeta_norm=adv.zeta_norm,
        a_max=adv.a_max,
        gamma=cfg.certificate.gamma,
        horizon=max((len(traj.turns) for traj in batch.trajectories), default=0),
        role_turns=max((len(traj.turns_of(role)) for traj in batch.trajectories), default=0),
    )
    # COMMIT: swap j's accepted weights in; the next rollouts record the new version
    version = policy.commit() if region.accepted else policy.version()
    check, steps, stop = probed if probed is not None else (None, 0, "")
    return StepResult(
        adv, msgs, old_logp, new_logp, region, sur, kl, d_hat, term, version, no_signal, check, steps, stop,
        probe_messages,
    )


