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
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from teamtr.training.advantages import Advantages, advantages_for
from teamtr.training.behaviour import require_on_policy
from teamtr.training.certificate import CertificateTerm, update_term
from teamtr.training.config import LossConfig, TrainConfig, TrustRegionConfig
from teamtr.training.losses import (
    KLEstimates,
    Surrogate,
    clipped_surrogate,
    kl_estimates,
    monitored_kl,
    penalised_loss,
)
from teamtr.training.policy import AdapterPolicy, budget_chunks, message_lengths
from teamtr.training.rollouts import RoleMessages, RolloutBatch, Speakers, messages_of_role
from teamtr.training.trust_region import (
    AttemptLog,
    AttemptResult,
    ExactRegion,
    RegionCheck,
    TrustRegionOutcome,
    enforce_trust_region,
    next_beta,
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


def optimise_inside_region(
    policy: AdapterPolicy,
    msgs: RoleMessages,
    old_logp: torch.Tensor,
    cfg: TrainConfig,
    beta: float,
    region: ExactRegion,
    seed: int,
    on_epoch: Callable[[int, float], None] | None = None,
) -> tuple[RegionCheck, int, str]:
    """Inner epochs of -(eq. 10) with the region checked exactly after every optimiser step.

    A step whose end is outside is line-searched back: theta_prev + 2^-h (theta_step - theta_prev),
    h = 1..line_search_steps, the first inside is kept and the update ends (the boundary is reached);
    none inside: theta_prev. A non-finite gradient ends the update before its step. Returns the check at
    the kept weights, the optimiser steps kept and why the update ended."""
    for group in policy.optimizer.param_groups:
        group["lr"] = cfg.optim.lr
    gen = torch.Generator().manual_seed(seed)
    exact_penalty = cfg.trust_region.penalty_kl == "exact"
    return steps_inside_region(
        policy,
        region,
        lambda: torch.randperm(len(msgs), generator=gen).split(cfg.optim.minibatch_messages),
        lambda idx: penalised_gradient(
            policy, msgs.subset(idx), old_logp[idx], cfg, beta, region if exact_penalty else None, idx
        ),
        policy.optimizer,
        cfg,
        RegionCheck(0.0, 0.0, 0.0, cfg.trust_region.delta),  # at pi_cur
        on_epoch,
    )


def steps_inside_region(
    point: Any,
    region: Any,
    minibatches: Callable[[], Iterable[torch.Tensor]],
    gradient: Callable[[torch.Tensor], torch.Tensor],
    optimizer: Any,
    cfg: TrainConfig,
    inside: RegionCheck,
    on_epoch: Callable[[int, float], None] | None = None,
) -> tuple[RegionCheck, int, str]:
    """The probe check's loop: `cfg.optim.epochs` epochs of `minibatches()`, each minibatch's `gradient(idx)`
    (its norm before clipping returned) stepped by `optimizer`, `region.check()` after every step, a step
    that would leave line-searched back (`line_search`) and the update ended there. `point` is what moves:
    one role's `AdapterPolicy`, or every role's adapters at once (training/joint_step.py `JointPolicy`,
    with its `TeamRegion`); `inside` is the check at pi_cur."""
    tr = cfg.trust_region
    steps = 0
    origin = point.weights() if tr.extrapolate else None  # pi_cur's weights: the displacement's start
    for epoch in range(1, cfg.optim.epochs + 1):
        for idx in minibatches():
            norm = gradient(idx)
            if not bool(torch.isfinite(norm)):  # a NaN / inf gradient never reaches the weights or AdamW
                optimizer.zero_grad(set_to_none=True)
                return inside, steps, "non_finite"
            before = point.weights()
            optimizer.step()
            check = region.check()
            if point.agree(float(check.inside)) > 0.5:
                inside, steps = check, steps + 1
                continue
            # MONITOR: the step would leave the region: the longest inside fraction of it, then stop
            kept = line_search(point, region, before, inside, check, tr)
            if kept is not None:
                return kept, steps + 1, "boundary"
            return inside, steps, "non_finite" if check.value != check.value else "boundary"
        if on_epoch is not None:
            on_epoch(epoch, inside.value)
    scaled = extrapolate(point, region, origin, inside, tr) if origin is not None and steps else None
    if scaled is not None:
        return scaled, steps, "extrapolated"
    return inside, steps, "epochs"


def extrapolate(
    point: Any, region: Any, origin: dict[Any, torch.Tensor], end: RegionCheck, tr: TrustRegionConfig
) -> RegionCheck | None:
    """theta_cur + s (theta_end - theta_cur), s = sqrt(line_search_target * delta / KL_end) at most
    `extrapolate_max` (KL about quadratic in the displacement), repeated from the scaled point while s was
    capped and that point is inside, at most `extrapolate_rounds` times (each round measured, so a KL
    that grows faster than quadratic far along the line is caught); a scaled point outside is line-searched
    back towards the last point inside. Returns the check at the point kept (its `scale`: the kept
    displacement over the optimiser's), None (theta_end in place) when none beyond it is."""
    unscaled = displacement_norm(point.weights(), origin)
    kept: RegionCheck | None = None
    for _ in range(tr.extrapolate_rounds):
        if not end.value > 0:
            break
        scale = min(math.sqrt(tr.line_search_target * tr.delta / end.value), tr.extrapolate_max)
        if scale <= 1.0:
            break
        finish = point.weights()
        point.load_weights({k: origin[k] + scale * (finish[k] - origin[k]) for k in origin})
        check = region.check()
        if point.agree(float(check.inside)) <= 0.5:
            searched = line_search(point, region, finish, end, check, tr)
            kept = searched if searched is not None else kept  # None: `finish` (inside) is back in place
            break
        kept = end = check
        if scale < tr.extrapolate_max:  # the predicted scale was reached: no further round
            break
    if kept is None:
        return None
    return replace(kept, scale=displacement_norm(point.weights(), origin) / unscaled if unscaled > 0 else 1.0)


def displacement_norm(weights: dict[Any, torch.Tensor], origin: dict[Any, torch.Tensor]) -> float:
    return math.sqrt(sum(float((weights[k].double() - origin[k].double()).pow(2).sum()) for k in origin))


def line_search(
    policy: Any,
    region: Any,
    before: dict[Any, torch.Tensor],
    start: RegionCheck,
    end: RegionCheck,
    tr: TrustRegionConfig,
) -> RegionCheck | None:
    """theta_prev + a (theta_step - theta_prev) for the largest a in (0, 1) found inside the region, its
    weights left in the adapter; None (theta_prev back in place) when no point tried is inside. `policy`:
    an `AdapterPolicy`, or training/joint_step.py's `JointPolicy` (every adapter, one a) with its region.

    `bracket`: a bracket [lo, hi] with lo inside (0 at first) and hi outside (1); the next a interpolates
    sqrt(KL) between them (a KL about quadratic in the displacement makes sqrt(KL) about linear along the
    line) towards line_search_target * delta, kept within [10%, 90%] of the bracket, and within its first
    half until a point inside is found (so it closes in on the region at least as fast as halving where the
    KL levels off along the line); an inside point raises lo, an outside one lowers hi; it stops at the first
    inside point above 3/4 of the target or after line_search_steps points. `halving`: a = 1/2, 1/4, ...,
    the first inside kept."""
    stepped = policy.weights()

    def move_to(a: float) -> None:  # theta_prev + a (theta_step - theta_prev)
        policy.load_weights({k: before[k] + a * (stepped[k] - before[k]) for k in before})

    target = tr.line_search_target * tr.delta
    lo, hi, v_lo, v_hi = 0.0, 1.0, start.value, end.value
    best: tuple[float, RegionCheck] | None = None
    for h in range(1, tr.line_search_steps + 1):
        if tr.line_search == "halving":
            a = 0.5**h
        elif math.isfinite(v_hi) and v_hi > v_lo:
            frac = (math.sqrt(target) - math.sqrt(max(v_lo, 0.0))) / (math.sqrt(v_hi) - math.sqrt(max(v_lo, 0.0)))
            a = lo + (hi - lo) * min(max(frac, 0.1), 0.9 if best is not None else 0.5)
        else:  # a non-finite end (or a KL that did not grow): bisect
            a = (lo + hi) / 2
        move_to(a)
        check = region.check()
        if policy.agree(float(check.inside)) > 0.5:
            best = (a, check)
            if tr.line_search == "halving" or check.value >= 0.75 * target:
                return check
            lo, v_lo = a, check.value
        else:
            hi, v_hi = a, check.value
    if best is None:
        policy.load_weights(before)
        return None
    a, check = best
    move_to(a)
    return check


def probed_outcome(
    probed: tuple[RegionCheck, int, str],
    policy: AdapterPolicy,
    msgs: RoleMessages,
    cfg: TrainConfig,
    beta: float,
) -> TrustRegionOutcome:
    """The probe check's result in the trust region's record: accepted iff an optimiser step was kept."""
    check, steps, stop = probed
    tr = cfg.trust_region
    moved = steps > 0
    per_epoch = -(-len(msgs) // cfg.optim.minibatch_messages)  # optimiser steps in one epoch
    epochs_run = -(-steps // per_epoch)
    log = AttemptLog(
        cfg.optim.lr, beta, check.value, epochs_run=epochs_run, early_stopped=stop != "epochs", inside=True
    )
    if not moved:
        return TrustRegionOutcome(
            accepted=False, d_hat=0.0, attempts=[log], beta_next=next_beta(beta, tr.delta * 2.0, tr)
        )
    with torch.no_grad():
        new_logp = policy.logp(msgs, grad=False)
    result = AttemptResult(
        d_hat=check.value, epochs_run=epochs_run, early_stopped=stop != "epochs", new_logp=new_logp
    )
    return TrustRegionOutcome(
        accepted=True,
        d_hat=check.value,
        accepted_attempt=result,
        attempts=[log],
        beta_next=next_beta(beta, check.value, tr),
    )


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


def whole_batch_kl(
    policy: AdapterPolicy, msgs: RoleMessages, old_logp: torch.Tensor, cfg: TrainConfig
) -> tuple[torch.Tensor, float]:
    """log pi_new of the whole batch and the monitored d_hat on it (eq. 11), agreed over ranks."""
    tr = cfg.trust_region
    with torch.no_grad():
        new_logp = policy.logp(msgs, grad=False)
        kl_all = kl_estimates(new_logp, old_logp, msgs.mask, msgs.weight)
    return new_logp, policy.agree(float(monitored_kl(kl_all, tr.estimator, tr.per_token)))


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
