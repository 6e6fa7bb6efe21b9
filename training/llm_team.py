"""The `StageTeam` of an LLM team: what training/stage.py `run_stage` drives for `teamtr train`.

One trainable engine (graphs/engine.py `TrainableEngine`, e.g. `EmbeddedEngine`: one base + one LoRA
adapter per role, each role an `AdapterPolicy` with its own AdamW). Its two halves: ROLLOUT is
training/llm_rollouts.py's `TeamSampler` (episodes through the team's LangGraph graph, sampled by that engine
or by vLLM, suffix resampling, the held-out KL check's held-out episodes); OPTIMISE is `update` here, a thin
adapter around the per-agent step (training/teamtr_step.py): it replays updates a resumed run already
completed, measures the diagnostics around the step (training/diagnostics.py), saves the accepted adapter
(and pushes it to vLLM), logs the update record (training/update_record.py) and hands over to the trainer's
checkpoint. The update's log-probs are always the trainable engine's. The schedule only changes which batch
`update` receives (run_stage decides).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from teamtr.graphs.engine import Engine, TrainableEngine
from teamtr.graphs.roles import Role
from teamtr.graphs.run_layout import adapter_dir
from teamtr.graphs.spec import build_team
from teamtr.graphs.task import TaskFamily
from teamtr.graphs.team import derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.training.certificate import no_term
from teamtr.training.checkpoint import save_peft_adapter
from teamtr.training.config import TrainConfig
from teamtr.training.diagnostics import (
    OutOfSampleKL,
    StaleGap,
    behaviour_gaps,
    ess_fraction,
    importance_weights,
    logprob_gap,
    logprob_gap_max,
    occupancy_divergence,
    stale_penalty,
)
from teamtr.training.distributed import DataParallel
from teamtr.training.joint_step import joint_step
from teamtr.training.llm_rollouts import TeamSampler
from teamtr.training.metrics import MetricsLog
from teamtr.training.policy import AdapterPolicy
from teamtr.training.progress import TrainingProgress
from teamtr.training.rollouts import RolloutBatch, Speakers
from teamtr.training.stage import UpdateContext
from teamtr.training.teamtr_step import StepResult, batch_lacks_signal, teamtr_step
from teamtr.training.update_record import (
    AroundStep,
    LoggedUpdate,
    heldout_certificate,
    unseen_share,
    update_record,
)
from teamtr.training.vllm_rollouts import VLLMRollouts

log = logging.getLogger(__name__)
T = TypeVar("T")


class UnusedRoleWarning(UserWarning):
    """A role made no trainable call in the batch its update was given: the update is skipped."""


@dataclass
class RunState:
    """Counters that a checkpoint carries."""

    step: int = 0  # updates completed in the whole run
    train_tokens: int = 0  # completion tokens of rollouts used for training
    diagnostic_tokens: int = 0  # completion tokens sampled only for the stale-gap diagnostic
    heldout_tokens: int = 0  # completion tokens of the held-out KL check's held-out episodes
    probe_tokens: int = 0  # completion tokens of the probe check's held-out episodes (check = probe)
    # the two other counts of training/token_counts.py: uncached prompt tokens of the training rollouts'
    # sampled turns (prefix cache model), and tokens through the model in the updates' log-prob passes
    train_prefill_tokens: int = 0
    train_pass_tokens: int = 0
    betas: dict[str, float] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)  # held-out return at the start, after each stage
    # eval.keep_best (training/stage_safety.py): the best validated stage so far and its held-out return
    best_stage: int = 0
    best_result: dict[str, Any] = field(default_factory=dict)
    stage_certificates: list[float | None] = field(default_factory=list)


class LLMStageTeam:
    """`StageTeam[RolloutBatch, LoggedUpdate]` for a LangGraph team of LLM roles on a trainable engine
    (graphs/engine.py `TrainableEngine`; `EmbeddedEngine` today)."""

    def __init__(
        self,
        cfg: TrainConfig,
        engine: TrainableEngine,
        roles: list[Role],
        task: TaskFamily,
        metrics: MetricsLog,
        state: RunState,
        run_dir: Path,
        progress: TrainingProgress,
        rollout_engine: Engine | None = None,
        data_parallel: DataParallel | None = None,
    ) -> None:
        self.cfg, self.engine, self.task, self.metrics, self.state = cfg, engine, task, metrics, state
        # torchrun: episodes sampled on rank 0 and broadcast, each update split (training/distributed.py)
        self.data_parallel = data_parallel
        self.run_dir, self.progress = run_dir, progress
        self.roles = {r.name: r for r in roles}
        # rollout.engine: vllm: the team samples through vLLM, to which every accepted version is pushed
        self.vllm = rollout_engine if isinstance(rollout_engine, VLLMRollouts) else None
        rollouts = engine if rollout_engine is None else rollout_engine
        # errors name the user's graph (team.graph), else teamtr's own round-robin team
        team = build_team(
            cfg.team, roles, rollouts, temperature=cfg.rollout.temperature, name=cfg.team.graph or "train"
        )
        # the update units: the roles that speak with one adapter are one policy, updated once per stage on
        # all their turns (team.shared_adapter: the whole team on one adapter); a unit is named after its
        # role, or after its adapter when several roles share it
        self.units: dict[str, list[Role]] = {}
        for r in roles:
            members = [m for m in roles if m.adapter == r.adapter]
            self.units.setdefault(r.name if len(members) == 1 else r.adapter, members)
        self.policies: dict[str, AdapterPolicy] = {}  # adapter -> pi_j, in role order
        for name, (r, *_) in self.units.items():
            params = engine.adapter_parameters(r.adapter, r.base_model)
            optimizer = make_optimizer(list(params.values()), cfg)
            self.policies[r.adapter] = AdapterPolicy(
                engine,
                r.adapter,
                r.base_model,
                params,
                optimizer,
                temperature=cfg.rollout.temperature,
                data_parallel=data_parallel,
                token_budget=cfg.optim.logprob_token_budget,
                gradient_checkpointing=cfg.optim.gradient_checkpointing,
                bf16_autocast=cfg.optim.bf16_autocast,
            )
            self.state.betas.setdefault(name, cfg.trust_region.beta_init)
        self.sampler = TeamSampler(
            cfg, team, task, self.policies, state, metrics, progress, run_dir, self.vllm, data_parallel
        )
        self.team = team
        self.stage_start_weights: dict[str, dict[str, torch.Tensor]] = {}  # pi^0 of the current stage
        self.replay_updates: dict[tuple[int, int, str], dict[str, Any]] = {}  # resumed: already done
        self.done_updates: list[dict[str, Any]] = []  # this stage's completed updates (checkpointed)
        self.on_update_done: Callable[[], None] | None = None  # the trainer checkpoints here

    def speakers(self, unit: str) -> Speakers:
        """Whose turns unit `unit` trains on: its role, or every role of a shared adapter."""
        members = self.units[unit]
        return members[0].name if len(members) == 1 else tuple(m.name for m in members)

    # ---- ROLLOUT: the sampling half (training/llm_rollouts.py) --------------------------------------
    @property
    def stage_batches(self) -> dict[str, RolloutBatch]:
        return self.sampler.batches

    @stage_batches.setter
    def stage_batches(self, batches: dict[str, RolloutBatch]) -> None:
        self.sampler.batches = batches

    def versions(self) -> dict[str, int]:
        return self.sampler.versions()

    def rollout(self, stage: int, index: int, trains: bool = True) -> RolloutBatch:
        if index == 0 and f"s{stage}-k0" not in self.sampler.batches:
            # stage start: remember pi^0 (occupancy divergence is measured against it)
            self.stage_start_weights = {a: p.weights() for a, p in self.policies.items()}
        return self.sampler.rollout(stage, index, trains)

    def resample_suffix(
        self, stage: int, index: int, previous: RolloutBatch, updated: list[str]
    ) -> RolloutBatch:
        return self.sampler.resample_suffix(stage, index, previous, updated)

    def heldout_episodes(self, stage: int, index: int, purpose: str = "kl-monitor") -> list[Trajectory]:
        return self.sampler.heldout_episodes(stage, index, purpose)

    def probe_contexts(self, ctx: UpdateContext[RolloutBatch]) -> tuple[list[list[int]], list[list[int]]]:
        """Role j's (prompt, completion) pairs in fresh held-out episodes of the current team: where the
        probe check holds the region (nothing sampled when the check is `sampled` or the region is off)."""
        tr = self.cfg.trust_region
        if not tr.enabled or tr.check != "probe":
            return [], []
        return contexts_of(self.heldout_episodes(ctx.stage, ctx.index, "kl-probe"), self.speakers(ctx.role))

    def _skipped(self, ctx: UpdateContext[RolloutBatch], role: Role) -> LoggedUpdate | None:
        """A role the graph never called (with a trainable model) in ctx.batch is reported, not updated
        on empty data: a "skipped" record in metrics.jsonl, an UnusedRoleWarning, a zero certificate term."""
        speakers = self.speakers(ctx.role)
        if any(t.completion_ids for traj in ctx.batch.trajectories for t in traj.turns_of(speakers)):
            return None
        text = (
            f"stage {ctx.stage + 1} update {ctx.index}: role {ctx.role!r} made no trainable call in the "
            f"{len(ctx.batch.trajectories)} episodes of batch {ctx.batch.key}; its update is skipped"
        )
        warnings.warn(text, UnusedRoleWarning, stacklevel=3)
        log.warning(text)
        term = no_term(self.cfg.certificate.gamma)
        record = {
            "stage": ctx.stage + 1,
            "index": ctx.index,
            "role": ctx.role,
            "adapter": role.adapter,
            "skipped": "no messages",
            "messages": 0,
            "accepted": False,
            "certificate": term.to_dict(),
            "batch_key": ctx.batch.key,
            "version_after": self.policies[role.adapter].version(),
        }
        self.metrics.log("skipped", self.state.step, **record)
        return LoggedUpdate(record)

    # ---- one update: the step, with what is measured and kept around it -------------------------------
    def episode_weights(self, ctx: UpdateContext[RolloutBatch]) -> np.ndarray | None:
        """Per-episode weights of the update's batch (None: every episode 1). The importance_weighting
        schedule: the stale batch of pi^0 reweighted towards pi^(i-1); a subclass may weigh otherwise
        (improve/feedback_team.py: served episodes of the incumbent)."""
        return importance_weights(ctx.batch, self.policies) if ctx.reweight else None

    def update(self, ctx: UpdateContext[RolloutBatch]) -> LoggedUpdate:
        done = self.replay_updates.get((ctx.stage, ctx.index, ctx.role))
        if done is not None:  # resumed: this update completed before the interruption
            return LoggedUpdate(done)
        skipped = self._skipped(ctx, self.units[ctx.role][0])
        if skipped is not None:
            return skipped
        loss = self.cfg.loss
        baselines = (
            self.sampler.prefix_baselines(ctx.stage, ctx.index, ctx.batch, ctx.role, loss.credit_samples)
            if loss.credit == "prefix"
            else None
        )
        # an update without signal changes nothing: its held-out KL check would sample episodes to measure 0
        quiet = batch_lacks_signal(ctx.batch, self.speakers(ctx.role), loss, baselines)
        quiet = self.policies[self.units[ctx.role][0].adapter].agree(float(quiet)) > 0.5  # rank 0's decision
        around = self.before_step(ctx, unchanged=quiet)
        policy = around.policy
        passed_before = policy.passed_tokens  # count 3: the step's own passes, not the instruments' around it
        step = teamtr_step(
            ctx.batch,
            self.speakers(ctx.role),
            policy,
            self.state.betas[ctx.role],
            self.cfg,
            minibatch_seed=lambda attempt: derive_seed(
                self.cfg.seed, "minibatch", ctx.stage, ctx.index, attempt
            ),
            episode_weights=around.weights,
            probe=lambda: self.probe_contexts(ctx),
            baselines=baselines,
            on_epoch=lambda epoch, d: self.progress.epoch(ctx.role, epoch, self.cfg.optim.epochs, d),
        )
        self.state.train_pass_tokens += policy.passed_tokens - passed_before
        return self.log_update(ctx, step, around)

    def before_step(
        self, ctx: UpdateContext[RolloutBatch], heldout: list[Trajectory] | None = None, unchanged: bool = False
    ) -> AroundStep:
        """What is measured before the step of ctx.role: log pi_cur on the stale-gap batches and on the held-out
        KL check's episodes (`heldout`, else drawn for this update; none when the step is known to leave
        pi_cur `unchanged`: its held-out figures are exactly 0), the importance weights, the vLLM gaps."""
        policy = self.policies[self.units[ctx.role][0].adapter]
        if unchanged and self.cfg.trust_region.heldout_episodes:
            heldout_kl = OutOfSampleKL.unchanged(policy)
        else:
            heldout_kl = OutOfSampleKL.before(
                self.heldout_episodes(ctx.stage, ctx.index) if heldout is None else heldout,
                self.speakers(ctx.role),
                policy,
            )
        return AroundStep(
            t0=time.perf_counter(),
            policy=policy,
            versions_before=self.versions(),
            weights=self.episode_weights(ctx),
            stale_gap=StaleGap.before(ctx, policy, self.cfg.loss),  # log pi_cur on pi^0's and pi^(i-1)'s batches
            heldout_kl=heldout_kl,
            # vLLM mode: the batch's log-probs as vLLM recorded them vs the trainer's, for every role (pi_cur)
            rollout_gaps=behaviour_gaps(ctx.batch, self.policies) if self.vllm is not None else None,
        )

    def log_update(
        self,
        ctx: UpdateContext[RolloutBatch],
        step: StepResult,
        around: AroundStep,
        extra: dict[str, Any] | None = None,
        checkpoint: bool = True,
    ) -> LoggedUpdate:
        """After the step of ctx.role: its next beta, the accepted adapter saved (and pushed), the
        diagnostics measured, the "update" record written and, with `checkpoint`, the trainer's checkpoint."""
        policy = around.policy
        self.state.betas[ctx.role] = step.region.beta_next
        push_seconds = self.publish(policy) if step.accepted else None

        tr = self.cfg.trust_region
        heldout_kl, weights = around.heldout_kl, around.weights
        # delta_eff in the direction the probe check constrains (forward when the check is sampled: eq. 11)
        measured = heldout_kl.after(tr.delta, tr.per_token, tr.direction if tr.check == "probe" else "forward")
        diagnostics = {
            "clip_fraction": float(step.surrogate.clip_fraction),
            "logprob_gap": logprob_gap(step.messages, step.old_logp),
            "logprob_gap_max": logprob_gap_max(step.messages, step.old_logp),
            "rollout_engine": self.cfg.rollout.engine,
            "rollout_logprob_gaps": around.rollout_gaps,
            "adapter_push_seconds": push_seconds,
            "certificate": heldout_certificate(step, heldout_kl, measured).to_dict(),
            "ess": ess_fraction(weights) if weights is not None else None,
            **around.stale_gap.after(step, policy),
            "occupancy_divergence": (
                occupancy_divergence(
                    ctx.fresh_batch, ctx.stage_start_batch, self.stage_start_weights, self.policies
                )
                if ctx.index >= 2 and ctx.fresh_batch is not None
                else None
            ),
            **measured,
            **stale_penalty(step, ctx.batch, heldout_kl),  # after heldout_kl.after: it needs the held-out ratios
            "no_signal": step.no_signal,
            "signal_groups": step.advantages.signal_groups,
            # check = probe: exact KLs at the kept weights, optimiser steps kept, why the update ended
            **(step.region_check.to_dict() if step.region_check is not None else {}),
            "probe_messages": step.probe_messages,
            "optimiser_steps": step.optimiser_steps,
            "stop": step.stop,
            # contexts covered: the share of the held-out check's contexts the batch never contained
            "heldout_contexts_unseen": unseen_share(heldout_kl.prompts, step.messages.prompts),
            **(extra or {}),
        }
        self.state.step += 1
        record = update_record(ctx, self.units[ctx.role][0], step, self.cfg, diagnostics, around.versions_before)
        record.update(
            train_tokens=self.state.train_tokens,
            diagnostic_tokens=self.state.diagnostic_tokens,
            heldout_tokens=self.state.heldout_tokens,
            probe_tokens=self.state.probe_tokens,
            train_prefill_tokens=self.state.train_prefill_tokens,
            train_pass_tokens=self.state.train_pass_tokens,
            seconds=time.perf_counter() - around.t0,
        )
        self.metrics.log("update", self.state.step, **record)
        self.progress.update(record)
        self.done_updates.append(record)
        if checkpoint and self.on_update_done is not None:
            self.on_update_done()
        return LoggedUpdate(record)

    def publish(self, policy: AdapterPolicy) -> float | None:
        """Save the adapter's current version where serve loads it and, with vLLM rollouts, push it there
        (the next rollouts sample it); rank 0 only. Returns the push's seconds (None without vLLM)."""
        if self.data_parallel is not None and not self.data_parallel.is_main:
            return None
        version = policy.version()
        saved = save_peft_adapter(
            self.engine.model(policy.base), policy.adapter, adapter_dir(self.run_dir, policy.adapter, version)
        )
        return None if self.vllm is None else self.vllm.push(policy.adapter, saved, version, policy.base)

    def update_joint(self, stage: int, roles: list[str], batch: RolloutBatch) -> list[LoggedUpdate]:
        """The joint baseline: one update of every role at once on the stage-start batch (training/joint_step.py
        `joint_step`: one objective over the team's trajectory ratios, one optimiser step moves every adapter,
        every role's region checked after each). Each role still gets its "update" record, written in sigma's
        order; one checkpoint after the last, so a resumed run replays all of them or none."""
        ctxs = [UpdateContext(stage, i, role, batch, batch, fresh=True, reweight=False) for i, role in enumerate(roles, 1)]
        done = [self.replay_updates.get((stage, ctx.index, ctx.role)) for ctx in ctxs]
        if any(d is not None for d in done):  # resumed after the joint update: its records, as written
            if not all(d is not None for d in done):
                raise RuntimeError(f"stage {stage + 1}: a checkpoint holds part of a joint update's records")
            return [LoggedUpdate(d) for d in done]
        t0 = time.perf_counter()
        skipped = {ctx.role: self._skipped(ctx, self.units[ctx.role][0]) for ctx in ctxs}
        moving = [ctx for ctx in ctxs if skipped[ctx.role] is None]
        if not moving:
            return [u for u in skipped.values() if u is not None]
        heldout = self.heldout_episodes(stage, 1)  # the held-out KL check's episodes of pi^0, one draw for all
        arounds = {ctx.role: self.before_step(ctx, heldout) for ctx in moving}
        policies = {ctx.role: arounds[ctx.role].policy for ctx in moving}
        passed_before = sum(p.passed_tokens for p in policies.values())
        tr = self.cfg.trust_region

        def probes() -> dict[str, tuple[list[list[int]], list[list[int]]]]:  # one probe draw for the team
            if not tr.enabled or tr.check != "probe":
                return {}
            episodes = self.heldout_episodes(stage, 1, "kl-probe")
            return {r: contexts_of(episodes, self.speakers(r)) for r in policies}

        result = joint_step(
            batch,
            list(policies),
            policies,
            {r: self.state.betas[r] for r in policies},
            self.cfg,
            minibatch_seed=derive_seed(self.cfg.seed, "minibatch", stage, 0, 1),
            probe=probes,
            on_epoch=lambda epoch, d: self.progress.epoch("team", epoch, self.cfg.optim.epochs, d),
        )
        self.state.train_pass_tokens += sum(p.passed_tokens for p in policies.values()) - passed_before
        team = {"joint": result.to_dict()}
        seconds = (time.perf_counter() - t0) / len(moving)  # the joint update's wall, shared by its records
        logged: dict[str, LoggedUpdate] = {}
        for n, ctx in enumerate(moving, start=1):
            arounds[ctx.role].t0 = time.perf_counter() - seconds
            logged[ctx.role] = self.log_update(
                ctx, result.steps[ctx.role], arounds[ctx.role], team, checkpoint=n == len(moving)
            )
        return [logged.get(ctx.role) or skipped[ctx.role] for ctx in ctxs]


def contexts_of(episodes: list[Trajectory], speakers: Speakers) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, completions) of the speakers' sampled turns in `episodes`: the contexts a probe holds."""
    turns = [t for traj in episodes for t in traj.turns_of(speakers) if t.completion_ids]
    return [t.prompt_ids for t in turns], [t.completion_ids for t in turns]


def make_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """One role's optimiser (optim.optimizer): AdamW, or RAdam (no sign-descent first steps)."""
    if cfg.optim.optimizer == "radam":
        return torch.optim.RAdam(
            params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, decoupled_weight_decay=True
        )
    return torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)


