"""The probe check (trust_region.check = probe, the default) of the per-agent step: OPTIMISE + MONITOR
of training/teamtr_step.py, (10) and (11) of docs/training.md.

Epochs of -(L(w) - beta d_hat) with the region checked exactly after EVERY optimiser step, on the batch's
contexts and on the probe's held-out ones (training/trust_region.py `ExactRegion`); a step that would leave
is line-searched back along its direction and the update ends there; a non-finite gradient or KL is
outside: the update ends at the last inside iterate. Shared with the joint baseline
(training/joint_step.py), whose point is every role's adapters at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch

from teamtr.training.config import TrainConfig, TrustRegionConfig
from teamtr.training.penalised_objective import penalised_gradient
from teamtr.training.policy import AdapterPolicy
from teamtr.training.rollouts import RoleMessages
from teamtr.training.trust_region import (
    AttemptLog,
    AttemptResult,
    ExactRegion,
    RegionCheck,
    TrustRegionOutcome,
    next_beta,
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
