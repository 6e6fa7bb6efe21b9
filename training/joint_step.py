"""The joint baseline (schedule `joint`): ONE trust-region update of the whole team on the stage-start batch.

Where TeamTR updates the roles one at a time (training/teamtr_step.py `teamtr_step`, each on rollouts of
the intermediate team), the paper's joint update treats every role's adapter as a variable of one
objective, on one batch of pi^0:

    ADV       A_e = clip(R_e - mean_{h != e} R_h, -A_clip, A_clip) per episode e (rloo by default)  (A)
    CACHE     log pi_cur_j of every role j's sampled tokens
    RATIO     W_e = exp(sum over every role's messages m of episode e of sum_u [log pi_new_j - log pi_cur_j])
              the team's trajectory ratio: the product of the roles' message ratios
    OPTIMISE  epochs of -(mean_e min(W_e A_e, clip(W_e, 1-eps, 1+eps_high) A_e) - sum_j beta_j d_hat_j)
              on minibatches of EPISODES; one optimiser step moves every adapter together
    MONITOR   after every optimiser step, every role's exact region (trust_region.py `ExactRegion`, the
              probe check of teamtr_step): the team is inside iff each role is inside its own delta; a step
              that would leave is line-searched back along the joint direction (every adapter at
              theta_prev + a (theta_step - theta_prev), ONE a for the team: teamtr_step's `line_search`,
              trust_region.line_search bracket or halving) and the update ends there; no step kept:
              every adapter and its optimiser restored bit for bit
    COMMIT    every role's new weights swapped in at once (one version bump each)

It is not the naive schedule under another name: in naive each role's loss depends on its own adapter only,
so updating the roles one by one on the stage-start batch is n separate problems (bit for bit the same
adapters as updating them "at once"). Here the clip acts on W_e, which holds every role's ratio: how far
one role's messages may move in an episode depends on how far the others' already moved, and the line
search scales all roles back together.

Each role gets a `StepResult` as from `teamtr_step` (its own messages, its own L_hat at the joint weights,
its region's figures), so training/llm_team.py logs one "update" record per role as for the other schedules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from teamtr.training.advantages import advantages_for
from teamtr.training.behaviour import require_on_policy
from teamtr.training.config import TrainConfig
from teamtr.training.losses import Surrogate, clipped_surrogate, kl_estimates, monitored_kl
from teamtr.training.policy import AdapterPolicy
from teamtr.training.probe_check import probed_outcome, steps_inside_region
from teamtr.training.rollouts import RoleMessages, RolloutBatch, messages_of_role
from teamtr.training.teamtr_step import Contexts, StepResult, no_attempt, step_result
from teamtr.training.trust_region import ExactRegion, RegionCheck
from teamtr.training.vocab_kl import Side

Weights = dict[tuple[str, str], torch.Tensor]  # (role, tensor name) -> every adapter's tensors


@dataclass
class JointResult:
    """What the joint update did: each role's step at the joint weights, and the team's own figures."""

    steps: dict[str, StepResult]  # role -> its messages, L_hat, region figures, version (as teamtr_step's)
    surrogate: Surrogate | None  # the team's clipped surrogate over episodes at the kept weights
    episodes: int  # episodes in the objective (kept by the advantage, with a message of some role)
    optimiser_steps: int
    stop: str  # "epochs" (every step inside), "boundary" (line search), "extrapolated", "non_finite", "no_signal"

    @property
    def accepted(self) -> bool:
        return self.optimiser_steps > 0

    def to_dict(self) -> dict[str, float | int | str | bool | None]:
        """The team's figures, written into every role's update record (`joint`)."""
        sur = self.surrogate
        return {
            "accepted": self.accepted,
            "surrogate": float(sur.improvement) if sur is not None else None,  # L_hat of the team
            "clip_fraction": float(sur.clip_fraction) if sur is not None else None,  # episodes clipped
            "episodes": self.episodes,
            "optimiser_steps": self.optimiser_steps,
            "stop": self.stop,
        }


class JointPolicy:
    """Every role's adapter as one point theta = (theta_1, ..., theta_n): what a joint step moves."""

    def __init__(self, policies: dict[str, AdapterPolicy]) -> None:
        self.policies = policies

    def weights(self) -> Weights:
        return {(r, k): v for r, p in self.policies.items() for k, v in p.weights().items()}

    def load_weights(self, weights: Weights) -> None:
        for r, p in self.policies.items():
            p.load_weights({k: v for (role, k), v in weights.items() if role == r})

    def agree(self, value: float) -> float:
        """Data parallel: rank 0's decision on every rank (every role's policy shares the ranks)."""
        return next(iter(self.policies.values())).agree(value)

    def snapshot(self) -> Callable[[], None]:
        """Every adapter's tensors and optimiser state; the returned function restores them bit for bit."""
        restores = [p.snapshot() for p in self.policies.values()]

        def restore() -> None:
            for undo in restores:
                undo()

        return restore

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.policies.values():
            p.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        # each adapter's own AdamW on its share of the one gradient: AdamW acts weight by weight, so this
        # is one AdamW step of theta (and the optimiser states stay per adapter, as checkpoints keep them)
        for p in self.policies.values():
            p.optimizer.step()


@dataclass
class JointCheck(RegionCheck):
    """The team's region check: inside iff every role's is; `value` is the role farthest out (its own
    check's batch / probe figures), `roles` every role's check."""

    roles: dict[str, RegionCheck] = field(default_factory=dict)

    @classmethod
    def of(cls, checks: dict[str, RegionCheck], delta: float) -> JointCheck:
        values = [c.value for c in checks.values()]
        if any(v != v for v in values):  # a non-finite KL of any role: the team is outside
            return cls(math.nan, math.nan, math.nan, delta, roles=checks)
        worst = max(checks.values(), key=lambda c: c.value, default=RegionCheck(0.0, 0.0, 0.0, delta))
        return cls(worst.batch, worst.probe, worst.probe_ucb, delta, roles=checks)


class TeamRegion:
    """Every role's `ExactRegion` as one: `check()` measures each role's exact KL at the adapters now."""

    def __init__(self, regions: dict[str, ExactRegion], enabled: bool, delta: float) -> None:
        self.regions, self.enabled, self.delta = regions, enabled, delta

    def check(self) -> JointCheck:
        if not self.enabled:  # ablation "no trust region": every step is kept
            return JointCheck.of({}, self.delta)
        return JointCheck.of({r: region.check() for r, region in self.regions.items()}, self.delta)


def joint_step(
    batch: RolloutBatch,
    roles: list[str],
    policies: dict[str, AdapterPolicy],
    betas: dict[str, float],
    cfg: TrainConfig,
    *,
    minibatch_seed: int,
    probe: Callable[[], dict[str, Contexts]] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> JointResult:
    """Update every role of `roles` (role -> its policy in `policies`) at once on `batch` inside each role's
    trust region (check = probe); commit them all if a step was kept. probe() draws every role's contexts in
    held-out episodes of the team (one draw for the team), called only when a step is attempted."""
    tr = cfg.trust_region
    if tr.enabled and tr.check != "probe":
        raise ValueError("schedule joint enforces the trust region by the probe check only (trust_region.check)")
    first = policies[roles[0]]
    require_on_policy(batch.trajectories, first.temperature)
    # ADV (A): one advantage per episode, the team's: every role's messages of episode e carry A_e
    adv = advantages_for(batch.rewards, batch.groups, cfg.loss)
    msgs = {r: messages_of_role(batch, r, adv) for r in roles}
    # CACHE: log pi_cur_j of each role's tokens, by the trainer's own forward passes
    old_logp = {r: policies[r].logp(msgs[r], grad=False) for r in roles}
    # the episodes of the objective: kept ones (dynamic sampling drops groups) in which some role spoke
    episodes = torch.unique(torch.cat([m.episode for m in msgs.values()]))  # sorted
    advantage = torch.as_tensor(adv.values, dtype=torch.float32)

    too_little = not len(episodes) or adv.signal_groups < cfg.loss.min_signal_groups or not torch.any(
        advantage[episodes] != 0
    )
    team = JointPolicy({r: policies[r] for r in roles})
    if team.agree(float(too_little)) > 0.5:  # no evidence: no step, no version (`no_signal`), as teamtr_step
        steps = {
            r: step_result(batch, r, policies[r], cfg, adv, msgs[r], old_logp[r], no_attempt(betas[r]), None, True, 0)
            for r in roles
        }
        return JointResult(steps, None, len(episodes), 0, "no_signal")

    probes = (probe() if probe is not None else {}) if tr.enabled else {}
    regions = {
        r: ExactRegion(
            Side(policies[r].engine, policies[r].base, policies[r].adapter),
            policies[r].temperature,
            (msgs[r].prompts, msgs[r].completions),
            probes.get(r, ([], [])),
            tr,
        )
        for r in roles
    }
    restore = team.snapshot()
    # OPTIMISE + MONITOR: the last iterate is inside every role's region
    check, kept, stop = optimise_team_inside_regions(
        team, msgs, old_logp, episodes, advantage, betas, regions, cfg, minibatch_seed, on_epoch
    )
    for r in roles:  # the region's KL passes are the update's cost too
        policies[r].passed_tokens += regions[r].passed_tokens
    if kept == 0:  # no step kept: pi_cur and every optimiser's state, bit for bit
        restore()
    steps = {}
    for r in roles:  # LOG, CERTIFY, COMMIT per role, as teamtr_step does at its accepted weights
        # every adapter moved along one line: the team's extrapolation scale is each role's
        own = replace(check.roles.get(r, RegionCheck(0.0, 0.0, 0.0, tr.delta)), scale=check.scale)
        probed = (own, kept, stop)
        region = probed_outcome(probed, policies[r], msgs[r], cfg, betas[r])
        # without a region (ablation) d_hat is the sampled estimate, as teamtr_step's
        steps[r] = step_result(
            batch, r, policies[r], cfg, adv, msgs[r], old_logp[r], region, probed if tr.enabled else None,
            False, len(probes.get(r, ([], []))[0]),
        )  # fmt: skip
    with torch.no_grad():  # the team's L_hat at the kept weights (zero when restored)
        new_logp = {r: steps[r].new_logp for r in roles}
        sur = team_surrogate(new_logp, old_logp, msgs, episodes, advantage, cfg)
    return JointResult(steps, sur, len(episodes), kept, stop)


def optimise_team_inside_regions(
    team: JointPolicy,
    msgs: dict[str, RoleMessages],
    old_logp: dict[str, torch.Tensor],
    episodes: torch.Tensor,
    advantage: torch.Tensor,
    betas: dict[str, float],
    regions: dict[str, ExactRegion],
    cfg: TrainConfig,
    seed: int,
    on_epoch: Callable[[int, float], None] | None = None,
) -> tuple[JointCheck, int, str]:
    """Inner epochs of the team's -(objective) over minibatches of episodes, every role's region checked
    exactly after every optimiser step; a step whose end is outside any role's region is line-searched back
    along the joint direction (one fraction for every adapter) and the update ends there. Returns the team's check
    at the kept weights, the optimiser steps kept and why the update ended (as `optimise_inside_region`)."""
    tr = cfg.trust_region
    for p in team.policies.values():
        for group in p.optimizer.param_groups:
            group["lr"] = cfg.optim.lr
    gen = torch.Generator().manual_seed(seed)
    # teamtr_step's loop on the team's point: each step moves every adapter, a step that would leave some
    # role's region is line-searched back with ONE fraction for every adapter, and the update ends there
    return steps_inside_region(
        team,
        TeamRegion(regions, tr.enabled, tr.delta),
        lambda: episode_minibatches(episodes, msgs, cfg.optim.minibatch_messages, gen),
        lambda idx: team_gradient(team, msgs, old_logp, idx, advantage, betas, cfg),
        team,
        cfg,
        JointCheck.of({r: RegionCheck(0.0, 0.0, 0.0, tr.delta) for r in regions}, tr.delta),  # at pi_cur
        on_epoch,
    )


def episode_minibatches(
    episodes: torch.Tensor, msgs: dict[str, RoleMessages], minibatch_messages: int, gen: torch.Generator
) -> list[torch.Tensor]:
    """One epoch's minibatches of episodes (shuffled by `gen`): as many as a per-role update of the busiest
    role makes of its messages (ceil(M_max / minibatch_messages)), so each role sees about
    `minibatch_messages` of its messages per step, as in the sequential schedules."""
    busiest = max((len(m) for m in msgs.values()), default=0)
    count = max(1, min(len(episodes), -(-busiest // minibatch_messages)))
    shuffled = episodes[torch.randperm(len(episodes), generator=gen)]
    return [torch.sort(chunk).values for chunk in shuffled.tensor_split(count)]  # sorted: team_surrogate


def team_gradient(
    team: JointPolicy,
    msgs: dict[str, RoleMessages],
    old_logp: dict[str, torch.Tensor],
    idx: torch.Tensor,
    advantage: torch.Tensor,
    betas: dict[str, float],
    cfg: TrainConfig,
) -> torch.Tensor:
    """The clipped gradient of the team's -(objective) on the episodes `idx`, in every adapter's .grad;
    returns its norm (over every adapter) before clipping.

    The objective is a function of every role's log-probs; its gradient reaches role j's adapter through
    j's own log-probs only (chain rule): first d objective / d log pi_j at the current weights, then one
    backward pass per role through that role's forward passes with its adapter active. One token-budget
    pass of one role is held at a time, and a pass recomputed in the backward (gradient checkpointing)
    sees its own adapter."""
    tr = cfg.trust_region
    mb = {r: m.subset(torch.nonzero(torch.isin(m.episode, idx)).flatten()) for r, m in msgs.items()}
    old = {r: old_logp[r][torch.isin(msgs[r].episode, idx)] for r in msgs}
    logp = {r: team.policies[r].logp(mb[r], grad=False).requires_grad_() for r in mb}
    sur = team_surrogate(logp, old, mb, idx, advantage, cfg)
    penalty = sum(
        betas[r] * monitored_kl(kl_estimates(logp[r], old[r], mb[r].mask, mb[r].weight), tr.estimator, tr.per_token)
        for r in mb
        if len(mb[r])
    )
    team.zero_grad()
    (-(sur.objective - penalty)).backward()  # d(-objective) / d log pi_j for every role j
    for r, policy in team.policies.items():
        if len(mb[r]) and logp[r].grad is not None:
            policy.backward(mb[r], logp[r].grad)  # one token-budget pass's activations at a time
            policy.sync_gradients()  # data parallel: summed over the ranks (training/distributed.py)
    params = [w for p in team.policies.values() for w in p.params.values()]
    return torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm)


def team_surrogate(
    logp: dict[str, torch.Tensor],
    old_logp: dict[str, torch.Tensor],
    msgs: dict[str, RoleMessages],
    episodes: torch.Tensor,
    advantage: torch.Tensor,
    cfg: TrainConfig,
) -> Surrogate:
    """mean_e min(W_e A_e, clip(W_e, 1-eps, 1+eps_high) A_e) over `episodes` (sorted batch indices), W_e the
    team's trajectory ratio: losses.py `clipped_surrogate` with each episode as one "message" whose
    log-ratio is the sum of every role's message log-ratios in it."""
    log_w = torch.zeros(len(episodes))
    for r, m in msgs.items():
        if len(m):
            per_message = ((logp[r] - old_logp[r]) * m.mask).sum(1)
            log_w = log_w.index_add(0, torch.searchsorted(episodes, m.episode), per_message)
    ones = torch.ones((len(episodes), 1))
    return clipped_surrogate(
        log_w[:, None],
        torch.zeros_like(ones),
        ones,
        advantage[episodes],
        clip_eps=cfg.loss.clip_eps,
        clip_eps_high=float(cfg.loss.clip_eps_high),
        message_ratio=True,
    )
