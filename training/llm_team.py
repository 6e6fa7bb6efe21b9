"""The `StageTeam` of an LLM team: what training/stage.py `run_stage` drives for `teamtr train`.

One `EmbeddedEngine` (one base + one LoRA adapter per role, each role an `AdapterPolicy` with its own
AdamW), rollouts through the team's LangGraph graph, sampled by that engine or, with `rollout.engine:
vllm`, by a vLLM server to which each accepted adapter version is pushed before the next rollout
(training/vllm_rollouts.py); the update's log-probs are always the embedded engine's. `update` is a
thin adapter around the per-agent step (training/teamtr_step.py): it replays updates a resumed run
already completed, measures the diagnostics around the step (training/diagnostics.py), saves the
accepted adapter (and pushes it to vLLM), logs the update record and hands over to the trainer's
checkpoint. The schedule (teamtr / naive / joint /
resample_every / importance_weighting) only changes which batch `update` receives; with
`schedule.resample: suffix` the resample is `resample_suffix` (episodes re-run from the updated role's
first turn). Over 400 lines because rollout, suffix resampling, monitor episodes and the update share
the run's state, seeds and metrics log; the update's pieces live in their own modules already.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from teamtr.graphs.capture import EpisodeError
from teamtr.graphs.role_models import UnknownRoleError
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.graphs.team import Team, derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.embedded import EmbeddedEngine
from teamtr.training.certificate import CertificateTerm, certificate_form
from teamtr.training.checkpoint import adapter_dir, save_peft_adapter
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
    turn_versions,
)
from teamtr.training.distributed import DataParallel
from teamtr.training.metrics import MetricsLog
from teamtr.training.policy import AdapterPolicy
from teamtr.training.progress import TrainingProgress
from teamtr.training.rollouts import RolloutBatch
from teamtr.training.run_dir import RunDirError, build_team
from teamtr.training.stage import UpdateContext
from teamtr.training.teamtr_step import StepResult, teamtr_step
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
    monitor_tokens: int = 0  # completion tokens of the out-of-sample KL monitor's held-out episodes
    betas: dict[str, float] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)  # held-out return before stage 0, after each
    stage_certificates: list[float | None] = field(default_factory=list)


@dataclass
class LoggedUpdate:
    """What `LLMStageTeam.update` returns: the update's metrics record and its certificate term."""

    record: dict[str, Any]  # the "update" record of metrics.jsonl

    @property
    def certificate(self) -> CertificateTerm:
        logged = self.record["certificate"]  # a record from before the held-out forms lacks their fields
        return CertificateTerm(
            **{f.name: logged[f.name] for f in dataclasses.fields(CertificateTerm) if f.name in logged}
        )

    @property
    def accepted(self) -> bool:
        return bool(self.record["accepted"])


class LLMStageTeam:
    """`StageTeam[RolloutBatch, LoggedUpdate]` for a LangGraph team of LLM roles on an embedded engine."""

    def __init__(
        self,
        cfg: TrainConfig,
        engine: EmbeddedEngine,
        roles: list[Role],
        task: TaskFamily,
        metrics: MetricsLog,
        state: RunState,
        run_dir: Path,
        progress: TrainingProgress,
        rollout_engine: EmbeddedEngine | VLLMRollouts | None = None,
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
        self.team = build_team(cfg.team, roles, rollouts, temperature=cfg.rollout.temperature, name="train")
        self.policies: dict[str, AdapterPolicy] = {}  # adapter -> pi_j, in role order
        for r in roles:
            params = engine.adapter_parameters(r.adapter, r.base_model)
            optimizer = torch.optim.AdamW(
                list(params.values()), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
            )
            self.policies[r.adapter] = AdapterPolicy(
                engine,
                r.adapter,
                r.base_model,
                params,
                optimizer,
                temperature=cfg.rollout.temperature,
                data_parallel=data_parallel,
            )
            self.state.betas.setdefault(r.name, cfg.trust_region.beta_init)
        self.stage_start_weights: dict[str, dict[str, torch.Tensor]] = {}  # pi^0 of the current stage
        self.stage_batches: dict[str, RolloutBatch] = {}  # this stage's batches (checkpointed)
        self.replay_updates: dict[tuple[int, int, str], dict[str, Any]] = {}  # resumed: already done
        self.done_updates: list[dict[str, Any]] = []  # this stage's completed updates (checkpointed)
        self.on_update_done: Callable[[], None] | None = None  # the trainer checkpoints here

    # ---- ROLLOUT --------------------------------------------------------------------------------------
    def stage_prompts(self, stage: int) -> list[TaskInstance]:
        """The stage's prompt batch B (the same prompts for every update of the stage)."""
        return self.task.generate(
            self.cfg.rollout.prompts_per_update, seed=derive_seed(self.cfg.task.train_seed, stage)
        )

    def versions(self) -> dict[str, int]:
        return {a: p.version() for a, p in self.policies.items()}

    def sync_rollout_adapters(self) -> None:
        """vLLM mode: make the server serve every role's current version (its saved directory) before
        episodes are sampled: the run's start, a resume, anything an update did not push."""
        if self.vllm is not None:
            self.vllm.sync(
                {
                    (p.base, a): (p.version(), adapter_dir(self.run_dir, a, p.version()))
                    for a, p in self.policies.items()
                }
            )

    def rollout(self, stage: int, index: int) -> RolloutBatch:
        """G episodes per prompt of the current intermediate team pi^index, through the team's graph."""
        key = f"s{stage}-k{index}"
        if key in self.stage_batches:  # resumed mid-stage: this batch was sampled before the interruption
            return self.stage_batches[key]
        if index == 0:  # stage start: remember pi^0 (occupancy divergence is measured against it)
            self.stage_start_weights = {a: p.weights() for a, p in self.policies.items()}
        self.sync_rollout_adapters()
        trajectories = self._episodes(
            f"stage {stage} rollout {index}",
            self.stage_prompts(stage),
            group_size=self.cfg.rollout.group_size,
            seed=derive_seed(self.cfg.seed, "rollout", stage, index),
        )
        sched = self.cfg.schedule
        trains = index == 0 or (sched.kind == "teamtr" and index % sched.resample_every == 0)
        batch = RolloutBatch(key, stage, index, trajectories, self.versions(), diagnostic=not trains)
        if trains:
            self.state.train_tokens += batch.completion_tokens
        else:
            self.state.diagnostic_tokens += batch.completion_tokens
        self.stage_batches[key] = batch
        self.progress.rollout(stage, index, len(trajectories))
        return batch

    def resample_suffix(
        self, stage: int, index: int, previous: RolloutBatch, updated: list[str]
    ) -> RolloutBatch:
        """Rollouts of pi^index by suffix resampling (schedule.resample: suffix): every episode of
        `previous` kept up to the first turn of a role in `updated` (the roles changed since it was
        sampled; the turns before are already samples of the current team), the graph re-run from there.
        An episode none of them spoke in is kept whole. Only the new turns' tokens count as train_tokens.
        A team that cannot restart from a prefix (a user graph, a custom router) resamples in full, and
        the "resample" record in metrics.jsonl says so."""
        key = f"s{stage}-k{index}"
        if key in self.stage_batches:  # resumed mid-stage
            return self.stage_batches[key]
        if not (isinstance(self.team, Team) and self.team.resumable):
            self.metrics.log(
                "resample",
                self.state.step,
                batch_key=key,
                mode="full",
                reason="the team cannot restart from a prefix (user graph or custom router)",
            )
            return self.rollout(stage, index)
        self.sync_rollout_adapters()
        prompts = {p.id: p for p in self.stage_prompts(stage)}
        seed = derive_seed(self.cfg.seed, "suffix", stage, index)
        cuts = [
            next((k for k, t in enumerate(traj.turns) if t.role in updated), None)
            for traj in previous.trajectories
        ]

        async def episode(n: int) -> Trajectory:
            traj, cut = previous.trajectories[n], cuts[n]
            if cut is None:
                return traj
            return await self.team.arun_from(
                prompts[traj.task_id],
                traj.turns[:cut],
                verifier=self.task,
                seed=derive_seed(seed, n),
                group_id=traj.group_id,
            )

        async def episodes() -> list[Trajectory]:
            return list(await asyncio.gather(*(episode(n) for n in range(len(cuts)))))

        try:
            trajectories = self._on_main(lambda: asyncio.run(episodes()))
        except EpisodeError as e:
            self.metrics.log("failed", self.state.step, where=key, error=f"{type(e).__name__}: {e}")
            raise RunDirError(f"stage {stage} suffix resample {index} failed: {e}") from e
        kept = sum(
            len(traj.turns[:c]) for traj, c in zip(previous.trajectories, cuts, strict=True) if c is not None
        )
        new_tokens = sum(
            sum(len(t.completion_ids) for t in traj.turns[c:])
            for traj, c in zip(trajectories, cuts, strict=True)
            if c is not None
        )
        batch = RolloutBatch(key, stage, index, trajectories, self.versions())
        self.state.train_tokens += new_tokens
        self.metrics.log(
            "resample",
            self.state.step,
            batch_key=key,
            mode="suffix",
            updated=list(updated),
            episodes_kept_whole=cuts.count(None),
            turns_kept=kept,
            new_tokens=new_tokens,
        )
        self.stage_batches[key] = batch
        self.progress.rollout(stage, index, len(trajectories))
        return batch

    def monitor_episodes(self, stage: int, index: int) -> list[Trajectory]:
        """Held-out episodes of the current team for the out-of-sample KL monitor: their own prompts and
        seeds (derived from (stage, index), so no training random state is consumed), never trained on."""
        n = self.cfg.trust_region.monitor_episodes
        if n == 0:
            return []
        prompts = self.task.generate(
            n, seed=derive_seed(self.cfg.task.train_seed, "kl-monitor", stage, index)
        )
        self.sync_rollout_adapters()
        trajectories = self._episodes(
            f"stage {stage} KL-monitor episodes before update {index}",
            prompts,
            group_size=1,
            seed=derive_seed(self.cfg.seed, "kl-monitor", stage, index),
        )
        self.state.monitor_tokens += sum(t.num_tokens for t in trajectories)
        return trajectories

    def _episodes(
        self, where: str, prompts: list[TaskInstance], *, group_size: int, seed: int
    ) -> list[Trajectory]:
        """The team's episodes; one that cannot become a trajectory (a user graph asking for an unknown
        role, a reward that raises or is not finite, an endless loop) fails the batch: a "failed" record
        in metrics.jsonl and one RunDirError line. The last checkpoint is intact: fix it and resume."""
        try:
            return self._on_main(
                lambda: self.team.run(prompts, group_size=group_size, verifier=self.task, seed=seed)
            )
        except (EpisodeError, UnknownRoleError) as e:
            self.metrics.log("failed", self.state.step, where=where, error=f"{type(e).__name__}: {e}")
            raise RunDirError(
                f"{where} failed: {type(e).__name__}: {e} (the run resumes from its last checkpoint)"
            ) from e

    def _on_main(self, fn: Callable[[], T]) -> T:
        """fn() here; data parallel: on rank 0 only, its episodes broadcast to every rank."""
        return fn() if self.data_parallel is None else self.data_parallel.on_main(fn)

    def _skipped(self, ctx: UpdateContext[RolloutBatch], role: Role) -> LoggedUpdate | None:
        """A role the graph never called (with a trainable model) in ctx.batch is reported, not updated
        on empty data: a "skipped" record in metrics.jsonl, an UnusedRoleWarning, a zero certificate term."""
        if any(t.completion_ids for traj in ctx.batch.trajectories for t in traj.turns_of(ctx.role)):
            return None
        text = (
            f"stage {ctx.stage} update {ctx.index}: role {ctx.role!r} made no trainable call in the "
            f"{len(ctx.batch.trajectories)} episodes of batch {ctx.batch.key}; its update is skipped"
        )
        warnings.warn(text, UnusedRoleWarning, stacklevel=3)
        log.warning(text)
        term = CertificateTerm(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, self.cfg.certificate.gamma)
        record = {
            "stage": ctx.stage,
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
    def update(self, ctx: UpdateContext[RolloutBatch]) -> LoggedUpdate:
        done = self.replay_updates.get((ctx.stage, ctx.index, ctx.role))
        if done is not None:  # resumed: this update completed before the interruption
            return LoggedUpdate(done)
        skipped = self._skipped(ctx, self.roles[ctx.role])
        if skipped is not None:
            return skipped
        t0 = time.perf_counter()
        role = self.roles[ctx.role]
        policy = self.policies[role.adapter]
        versions_before = self.versions()
        # importance_weighting schedule: the stale batch of pi^0 reweighted towards pi^(i-1)
        weights = importance_weights(ctx.batch, self.policies) if ctx.reweight else None
        stale_gap = StaleGap.before(ctx, policy, self.cfg.loss)  # log pi_cur on pi^0's and pi^(i-1)'s batches
        monitor = OutOfSampleKL.before(self.monitor_episodes(ctx.stage, ctx.index), ctx.role, policy)
        # vLLM mode: the batch's log-probs as vLLM recorded them vs the trainer's, for every role (pi_cur)
        rollout_gaps = behaviour_gaps(ctx.batch, self.policies) if self.vllm is not None else None

        step = teamtr_step(
            ctx.batch,
            ctx.role,
            policy,
            self.state.betas[ctx.role],
            self.cfg,
            minibatch_seed=lambda attempt: derive_seed(
                self.cfg.seed, "minibatch", ctx.stage, ctx.index, attempt
            ),
            episode_weights=weights,
            on_epoch=lambda epoch, d: self.progress.epoch(ctx.role, epoch, self.cfg.optim.epochs, d),
        )
        self.state.betas[ctx.role] = step.region.beta_next
        push_seconds = None
        if step.accepted and (self.data_parallel is None or self.data_parallel.is_main):  # what serve loads
            saved = save_peft_adapter(
                self.engine.model(policy.base),
                policy.adapter,
                adapter_dir(self.run_dir, role.adapter, step.version),
            )
            if self.vllm is not None:  # the next rollouts (the resample of pi^i) sample this version
                push_seconds = self.vllm.push(role.adapter, saved, step.version, policy.base)

        monitored = monitor.after(self.cfg.trust_region.delta, self.cfg.trust_region.per_token)
        diagnostics = {
            "clip_fraction": float(step.surrogate.clip_fraction),
            "logprob_gap": logprob_gap(step.messages, step.old_logp),
            "logprob_gap_max": logprob_gap_max(step.messages, step.old_logp),
            "rollout_engine": self.cfg.rollout.engine,
            "rollout_logprob_gaps": rollout_gaps,
            "adapter_push_seconds": push_seconds,
            "certificate": heldout_certificate(step, monitor, monitored).to_dict(),
            "ess": ess_fraction(weights) if weights is not None else None,
            **stale_gap.after(step, policy),
            "occupancy_divergence": (
                occupancy_divergence(
                    ctx.fresh_batch, ctx.stage_start_batch, self.stage_start_weights, self.policies
                )
                if ctx.index >= 2 and ctx.fresh_batch is not None
                else None
            ),
            **monitored,
        }
        self.state.step += 1
        record = update_record(ctx, role, step, self.cfg, diagnostics, versions_before)
        record.update(
            train_tokens=self.state.train_tokens,
            diagnostic_tokens=self.state.diagnostic_tokens,
            monitor_tokens=self.state.monitor_tokens,
            seconds=time.perf_counter() - t0,
        )
        self.metrics.log("update", self.state.step, **record)
        self.progress.update(record)
        self.done_updates.append(record)
        if self.on_update_done is not None:
            self.on_update_done()
        return LoggedUpdate(record)

    def update_joint(self, stage: int, roles: list[str], batch: RolloutBatch) -> list[LoggedUpdate]:
        """Joint baseline: every role updated from pi^0 on the same batch. A role's loss depends on its
        own adapter only, so updating them one after the other on this batch is updating them at once."""
        return [
            self.update(UpdateContext(stage, i, role, batch, batch, fresh=True, reweight=False))
            for i, role in enumerate(roles, start=1)
        ]


def heldout_certificate(
    step: StepResult, monitor: OutOfSampleKL, monitored: dict[str, Any]
) -> CertificateTerm:
    """The step's certificate term with its held-out forms (training/certificate.py) filled in from the
    out-of-sample monitor's episodes; the held-out episodes also count towards T and N_j."""
    heldout = monitor.heldout_surrogate()
    if heldout is None:
        return step.certificate
    value, se, episodes = heldout
    role_turns = max(step.certificate.role_turns, max(Counter(monitor.episode_of).values(), default=0))
    return dataclasses.replace(
        step.certificate,
        heldout_surrogate=value,
        heldout_se=se,
        heldout_episodes=episodes,
        kl_heldout=monitored["kl_out_of_sample"],
        role_turns=role_turns,
        form=certificate_form(role_turns),
    )


def update_record(
    ctx: UpdateContext[RolloutBatch],
    role: Role,
    step: StepResult,
    cfg: TrainConfig,
    diagnostics: dict[str, Any],
    versions_before: dict[str, int],
) -> dict[str, Any]:
    """The "update" record of metrics.jsonl (docs/training.md, "Run directory")."""
    region, kl = step.region, step.kl
    return {
        "stage": ctx.stage,
        "index": ctx.index,
        "role": ctx.role,
        "adapter": role.adapter,
        "fresh": ctx.fresh,
        "reward": float(ctx.batch.rewards.mean()),
        "messages": len(step.messages),
        "accepted": region.accepted,
        "left_region": region.left_region,
        "backtracks": region.backtracks,
        "attempts": [dataclasses.asdict(a) for a in region.attempts],
        "delta": cfg.trust_region.delta,
        "d_hat": step.d_hat,
        "kl_k1_message": float(kl.k1_message),
        "kl_k1_token": float(kl.k1_token),
        "kl_k3_message": float(kl.k3_message),
        "kl_k3_token": float(kl.k3_token),
        "beta": region.attempts[-1].beta,
        "beta_next": region.beta_next,
        **diagnostics,
        "batch_key": ctx.batch.key,
        "batch_versions": dict(ctx.batch.versions),
        "batch_turn_versions": turn_versions(ctx.batch),
        "versions_before": versions_before,
        "version_after": step.version,
    }
