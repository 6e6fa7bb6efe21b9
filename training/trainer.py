"""TeamTR for LLM teams: Algorithm 1 of TEAMTR.md on any team from graphs/, through training/stage.py.

    for stage k:                                                         Trainer.train
      draw prompt batch B; choose order sigma                            run_stage (training/stage.py)
      for i in 1..n:  j = sigma(i)
        ROLLOUT  G episodes per prompt of the intermediate team pi^(i-1) LLMStageTeam.rollout
        ADV      bounded group-normalised advantages                     advantages.py
        CACHE    log pi_cur of j's tokens                                 LLMStageTeam.update
        OPTIMISE clipped message-ratio surrogate - beta * d_hat           losses.py
        MONITOR  d_hat <= delta (adaptive beta, early stop, backtrack)    trust_region.py
        LOG      L_hat, d_hat, zeta_hat, certificate term; swap j's weights in (version bump)
      LOG stage certificate, realised improvement on held-out tasks       certificate.py

`LLMStageTeam` is the `StageTeam` of an LLM team: one `EmbeddedEngine` (one base + one LoRA adapter per
role), one AdamW per adapter, rollouts through the team's LangGraph graph. The schedule (teamtr / naive /
joint / resample_every / importance_weighting) only changes which batch `update` receives.

Everything random is seeded from (seed, stage, update): a run killed at any point and resumed from its
last checkpoint ends with the same adapters, bit for bit, as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.graphs.team import Team, derive_seed
from teamtr.serving.embedded import EmbeddedEngine
from teamtr.training.advantages import Advantages, batch_normalised_advantages, group_normalised_advantages
from teamtr.training.certificate import (
    CertificateTerm,
    certificate_constant,
    rank_correlation,
    stage_certificate,
)
from teamtr.training.checkpoint import (
    Checkpoint,
    adapter_dir,
    load_latest_checkpoint,
    rng_state,
    save_checkpoint,
    save_peft_adapter,
    set_rng_state,
)
from teamtr.training.config import TrainConfig
from teamtr.training.losses import clipped_surrogate, kl_estimates, monitored_kl, penalised_loss
from teamtr.training.metrics import METRICS_FILE, MetricsLog, read_metrics
from teamtr.training.rollouts import RoleMessages, RolloutBatch, padded_logprobs, role_messages
from teamtr.training.run_dir import RunDir, model_path, with_temperature
from teamtr.training.stage import UpdateContext, run_stage
from teamtr.training.trust_region import AdapterState, AttemptResult, enforce_trust_region

SCORE_CHUNK = 64  # messages per forward pass when computing log-probs


class Callbacks:
    """Progress hooks (the CLI draws rich progress bars with them). All no-ops by default."""

    def stage_start(self, stage: int, stages: int, order: list[str]) -> None: ...
    def rollout(self, stage: int, team_index: int, episodes: int) -> None: ...
    def epoch(self, role: str, epoch: int, epochs: int, d_hat: float) -> None: ...
    def update(self, record: dict[str, Any]) -> None: ...
    def evaluation(self, label: str, result: dict[str, Any]) -> None: ...


# ------------------------------------------------------------------------------------------------------
# The StageTeam of an LLM team


@dataclass
class RunState:
    """Counters that a checkpoint carries."""

    step: int = 0  # updates completed in the whole run
    train_tokens: int = 0  # completion tokens of rollouts used for training
    diagnostic_tokens: int = 0  # completion tokens sampled only for the stale-gap diagnostic
    betas: dict[str, float] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)  # held-out return before stage 0, after each
    stage_certificates: list[float] = field(default_factory=list)


class LLMStageTeam:
    """`StageTeam[RolloutBatch]` for a LangGraph team of LLM roles on an embedded engine."""

    def __init__(
        self,
        cfg: TrainConfig,
        engine: EmbeddedEngine,
        roles: list[Role],
        task: TaskFamily,
        metrics: MetricsLog,
        state: RunState,
        run_dir: Path,
        callbacks: Callbacks,
    ) -> None:
        self.cfg, self.engine, self.task, self.metrics, self.state = cfg, engine, task, metrics, state
        self.run_dir, self.callbacks = run_dir, callbacks
        self.roles = {r.name: r for r in roles}
        self.base_of = {r.adapter: r.base_model for r in roles}  # adapter -> its base model in the engine
        self.team = Team.from_engine(with_temperature(roles, cfg.rollout.temperature), engine, name="train")
        # one optimizer per adapter: a shared AdamW would move inactive adapters through their momentum
        self.params = {r.adapter: engine.adapter_parameters(r.adapter, r.base_model) for r in roles}
        self.optimizers = {
            a: torch.optim.AdamW(list(p.values()), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
            for a, p in self.params.items()
        }
        for r in roles:
            self.state.betas.setdefault(r.name, cfg.trust_region.beta_init)
        self.stage_start_weights: dict[str, dict[str, torch.Tensor]] = {}
        self.stage_batches: dict[str, RolloutBatch] = {}  # this stage's batches (checkpointed)
        self.replay_updates: dict[tuple[int, int, str], dict[str, Any]] = {}  # resumed: already done
        self.done_updates: list[dict[str, Any]] = []  # this stage's completed updates (checkpointed)
        self.on_update_done: Callable[[], None] | None = None  # the trainer checkpoints here
        self.c = certificate_constant(cfg.certificate.gamma, cfg.loss.adv_clip)
        self._last_new_logp = torch.zeros(0)

    # ---- ROLLOUT --------------------------------------------------------------------------------------
    def stage_prompts(self, stage: int) -> list[TaskInstance]:
        """The stage's prompt batch B (the same prompts for every update of the stage)."""
        return self.task.generate(
            self.cfg.rollout.prompts_per_update, seed=derive_seed(self.cfg.task.train_seed, stage)
        )

    def versions(self) -> dict[str, int]:
        return {a: self.engine.adapter_version(a, self.base_of[a]) for a in self.params}

    def rollout(self, stage: int, index: int) -> RolloutBatch:
        """G episodes per prompt of the current intermediate team pi^index, through the team's graph."""
        key = f"s{stage}-k{index}"
        if key in self.stage_batches:  # resumed mid-stage: this batch was sampled before the interruption
            return self.stage_batches[key]
        if index == 0:  # stage start: remember pi^0 (occupancy divergence is measured against it)
            self.stage_start_weights = {
                a: self.engine.snapshot_adapter(a, self.base_of[a]) for a in self.params
            }
        trajectories = self.team.run(
            self.stage_prompts(stage),
            group_size=self.cfg.rollout.group_size,
            verifier=self.task,
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
        self.callbacks.rollout(stage, index, len(trajectories))
        return batch

    # ---- ADV ------------------------------------------------------------------------------------------
    def advantages(self, batch: RolloutBatch) -> Advantages:
        lc = self.cfg.loss
        if lc.kind == "ppo":  # no groups: the batch mean is the baseline
            return batch_normalised_advantages(batch.rewards, adv_clip=lc.adv_clip, eps=lc.adv_eps)
        return group_normalised_advantages(
            batch.rewards,
            batch.groups,
            adv_clip=lc.adv_clip,
            eps=lc.adv_eps,
            normalise=lc.group_normalise,
            clip=lc.clip_advantages,
            drop_zero_spread=bool(lc.dynamic_sampling),
        )

    def importance_weights(self, batch: RolloutBatch) -> np.ndarray:
        """Stale episodes of pi^0 reweighted towards pi^(i-1): prod over turns of roles updated since the
        batch was sampled of pi_now / pi_behaviour (self-normalised to mean 1)."""
        log_w = np.zeros(len(batch.trajectories))
        for adapter in self.params:
            if self.engine.adapter_version(adapter, self.base_of[adapter]) == batch.versions.get(adapter):
                continue
            turns = [
                (g, t)
                for g, traj in enumerate(batch.trajectories)
                for t in traj.turns
                if t.adapter == adapter
            ]
            now = self._score([t.prompt_ids for _, t in turns], [t.completion_ids for _, t in turns], adapter)
            for (g, t), lp in zip(turns, now, strict=True):
                log_w[g] += float(lp.sum()) - t.logprob_sum
        w = np.exp(log_w - log_w.max())
        return w / w.mean()

    # ---- one update of Algorithm 1 --------------------------------------------------------------------
    def update(self, ctx: UpdateContext[RolloutBatch]) -> dict[str, Any]:
        done = self.replay_updates.get((ctx.stage, ctx.index, ctx.role))
        if done is not None:  # resumed: this update completed before the interruption
            return done
        t0 = time.perf_counter()
        cfg, tr = self.cfg, self.cfg.trust_region
        role = self.roles[ctx.role]
        adapter = role.adapter
        versions_before = self.versions()

        # ADV: bounded group-normalised advantages of the update's batch
        adv = self.advantages(ctx.batch)
        ess = None
        weights = None
        if ctx.reweight:  # importance_weighting schedule: stale batch reweighted towards pi^(i-1)
            weights = self.importance_weights(ctx.batch)
            ess = float(weights.sum() ** 2 / (len(weights) * (weights**2).sum()))  # ESS / B
        msgs = role_messages(ctx.batch, ctx.role, adv, weights)

        # CACHE: log pi_cur of j's sampled tokens (the trainer's own exact forward pass)
        old_logp = self._logp(msgs, adapter, grad=False)
        logprob_gap = float(
            ((old_logp - msgs.behaviour_logp).abs() * msgs.mask).sum() / msgs.mask.sum().clamp_min(1)
        )
        # the two batches of the stale-gap diagnostic (i >= 2): stage start pi^0 and fresh pi^(i-1)
        diag = self._stale_gap_batches(ctx)
        diag_old = {
            k: old_logp if self._is_update_batch(ctx, k) else self._logp(m, adapter, grad=False)
            for k, (m, _) in diag.items()
        }

        # OPTIMISE + MONITOR: epochs of the penalised clipped surrogate inside the trust region
        optimizer = self.optimizers[adapter]
        attempt_no = [0]

        def attempt(lr: float, beta: float) -> AttemptResult:
            attempt_no[0] += 1
            return self._optimise(ctx, msgs, old_logp, adapter, optimizer, lr, beta, attempt_no[0])

        def snapshot() -> Callable[[], None]:
            return AdapterState(self.params[adapter], optimizer).save().restore

        outcome = enforce_trust_region(attempt, snapshot, tr, cfg.optim.lr, self.state.betas[ctx.role])
        self.state.betas[ctx.role] = outcome.beta_next

        # LOG: surrogate, KL estimates and certificate term at the accepted (or restored) weights
        with torch.no_grad():
            # a rejected update restored the weights bit for bit: pi_new = pi_cur exactly
            new_logp = self._last_new_logp if outcome.accepted else old_logp
            sur = self._surrogate(new_logp, old_logp, msgs)
            kl = kl_estimates(new_logp, old_logp, msgs.mask, msgs.weight)
        d_hat = float(monitored_kl(kl, tr.estimator, tr.per_token))
        term = CertificateTerm(
            surrogate=float(sur.improvement),
            d_hat=d_hat,
            zeta_clip=adv.zeta_clip,
            zeta_ratio=float(sur.zeta_ratio),
            zeta_norm=adv.zeta_norm,
            c=certificate_constant(cfg.certificate.gamma, adv.a_max),
            gamma=cfg.certificate.gamma,
        )
        stale = self._stale_gap(ctx, diag, diag_old, adapter, new_logp)
        occupancy = (
            self._occupancy_divergence(ctx.fresh_batch) if ctx.index >= 2 and ctx.fresh_batch else None
        )

        # swap j's accepted weights in: the next rollouts record the new version
        base = self.base_of[adapter]
        version = self.engine.adapter_version(adapter, base)
        if outcome.accepted:
            version = self.engine.commit_adapter_update(adapter, base)
            save_peft_adapter(self.engine.model(base), adapter, adapter_dir(self.run_dir, adapter, version))
        self.state.step += 1
        record = {
            "stage": ctx.stage,
            "index": ctx.index,
            "role": ctx.role,
            "adapter": adapter,
            "fresh": ctx.fresh,
            "reward": float(ctx.batch.rewards.mean()),
            "messages": len(msgs),
            "accepted": outcome.accepted,
            "left_region": outcome.left_region,
            "backtracks": outcome.backtracks,
            "attempts": [dataclasses.asdict(a) for a in outcome.attempts],
            "delta": tr.delta,
            "d_hat": d_hat,
            "kl_k1_message": float(kl.k1_message),
            "kl_k1_token": float(kl.k1_token),
            "kl_k3_message": float(kl.k3_message),
            "kl_k3_token": float(kl.k3_token),
            "beta": outcome.attempts[-1].beta,
            "beta_next": outcome.beta_next,
            "clip_fraction": float(sur.clip_fraction),
            "logprob_gap": logprob_gap,
            "certificate": term.to_dict(),
            "ess": ess,
            **stale,
            "occupancy_divergence": occupancy,
            "batch_key": ctx.batch.key,
            "batch_versions": dict(ctx.batch.versions),
            "batch_turn_versions": turn_versions(ctx.batch),
            "versions_before": versions_before,
            "version_after": version,
            "train_tokens": self.state.train_tokens,
            "diagnostic_tokens": self.state.diagnostic_tokens,
            "seconds": time.perf_counter() - t0,
        }
        self.metrics.log("update", self.state.step, **record)
        self.callbacks.update(record)
        self.done_updates.append(record)
        if self.on_update_done is not None:
            self.on_update_done()
        return record

    def update_joint(self, stage: int, roles: list[str], batch: RolloutBatch) -> list[dict[str, Any]]:
        """Joint baseline: every role updated from pi^0 on the same batch. A role's loss depends on its
        own adapter only, so updating them one after the other on this batch is updating them at once."""
        return [
            self.update(UpdateContext(stage, i, role, batch, batch, fresh=True, reweight=False))
            for i, role in enumerate(roles, start=1)
        ]

    # ---- pieces of the update -------------------------------------------------------------------------
    def _optimise(
        self,
        ctx: UpdateContext[RolloutBatch],
        msgs: RoleMessages,
        old_logp: torch.Tensor,
        adapter: str,
        optimizer: torch.optim.Optimizer,
        lr: float,
        beta: float,
        attempt_no: int,
    ) -> AttemptResult:
        """Inner epochs over minibatches of j's messages; early stop once the running d_hat exceeds delta.

        The running d_hat of an epoch is the weighted mean of its minibatches' estimates (each taken just
        before that minibatch's step); the d_hat that decides acceptance is measured on the whole batch
        after the last step."""
        cfg, tr = self.cfg, self.cfg.trust_region
        for group in optimizer.param_groups:
            group["lr"] = lr
        gen = torch.Generator().manual_seed(
            derive_seed(cfg.seed, "minibatch", ctx.stage, ctx.index, attempt_no)
        )
        epochs_run, early_stopped = 0, False
        for epoch in range(1, cfg.optim.epochs + 1):
            running, seen = 0.0, 0.0
            for idx in torch.randperm(len(msgs), generator=gen).split(cfg.optim.minibatch_messages):
                mb = msgs.subset(idx)
                new_logp = self._logp(mb, adapter, grad=True)
                sur = self._surrogate(new_logp, old_logp[idx], mb)
                kl = kl_estimates(new_logp, old_logp[idx], mb.mask, mb.weight)
                loss = penalised_loss(sur, kl, beta, tr.estimator, tr.per_token)  # -(eq. 10)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(list(self.params[adapter].values()), cfg.optim.max_grad_norm)
                optimizer.step()
                w = float(mb.weight.sum())
                running, seen = (
                    running + w * float(monitored_kl(kl, tr.estimator, tr.per_token).detach()),
                    seen + w,
                )
            epochs_run = epoch
            d_running = running / max(seen, 1e-12)
            self.callbacks.epoch(ctx.role, epoch, cfg.optim.epochs, d_running)
            if tr.enabled and tr.early_stop and d_running > tr.delta:
                early_stopped = True
                break
        with torch.no_grad():  # MONITOR on the whole batch (eq. 11)
            self._last_new_logp = self._logp(msgs, adapter, grad=False)
            kl_all = kl_estimates(self._last_new_logp, old_logp, msgs.mask, msgs.weight)
        d_hat = float(monitored_kl(kl_all, tr.estimator, tr.per_token))
        return AttemptResult(d_hat=d_hat, epochs_run=epochs_run, early_stopped=early_stopped)

    def _surrogate(self, new_logp: torch.Tensor, old_logp: torch.Tensor, msgs: RoleMessages):
        lc = self.cfg.loss
        return clipped_surrogate(
            new_logp,
            old_logp,
            msgs.mask,
            msgs.adv,
            clip_eps=lc.clip_eps,
            clip_eps_high=float(lc.clip_eps_high),
            message_ratio=lc.message_ratio,
            token_level_aggregation=lc.token_level_aggregation,
            weight=msgs.weight,
        )

    def _score(
        self, prompts: list[list[int]], completions: list[list[int]], adapter: str
    ) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        with torch.no_grad():
            for s in range(0, len(prompts), SCORE_CHUNK):
                out += self.engine.token_logprobs(
                    prompts[s : s + SCORE_CHUNK],
                    completions[s : s + SCORE_CHUNK],
                    adapter,
                    self.base_of[adapter],
                )
        return out

    def _logp(self, msgs: RoleMessages, adapter: str, grad: bool) -> torch.Tensor:
        if len(msgs) == 0:
            return torch.zeros_like(msgs.mask)

        def fn(p: list[list[int]], c: list[list[int]]) -> list[torch.Tensor]:
            return self.engine.token_logprobs(p, c, adapter, self.base_of[adapter])

        with torch.set_grad_enabled(grad):
            return padded_logprobs(fn, msgs, SCORE_CHUNK)

    def _stale_gap_batches(
        self, ctx: UpdateContext[RolloutBatch]
    ) -> dict[str, tuple[RoleMessages, Advantages]]:
        """For i >= 2 with a fresh batch of pi^(i-1): j's messages in the stage-start and fresh batches."""
        if ctx.index < 2 or ctx.fresh_batch is None:
            return {}
        out = {}
        for name, batch in (("stale", ctx.stage_start_batch), ("fresh", ctx.fresh_batch)):
            adv = self.advantages(batch)
            out[name] = (role_messages(batch, ctx.role, adv), adv)
        return out

    @staticmethod
    def _is_update_batch(ctx: UpdateContext[RolloutBatch], name: str) -> bool:
        batch = ctx.stage_start_batch if name == "stale" else ctx.fresh_batch
        return batch is ctx.batch and not ctx.reweight

    def _stale_gap(
        self,
        ctx: UpdateContext[RolloutBatch],
        diag: dict,
        diag_old: dict,
        adapter: str,
        update_new_logp: torch.Tensor,
    ) -> dict[str, float | None]:
        """Stale gap = |L_hat on the stage-start batch - L_hat on the fresh batch| for the accepted update."""
        if not diag:
            return {"surrogate_stale": None, "surrogate_fresh": None, "stale_gap": None}
        values = {}
        with torch.no_grad():
            for name, (msgs, _) in diag.items():
                same = self._is_update_batch(ctx, name)
                new_logp = update_new_logp if same else self._logp(msgs, adapter, grad=False)
                values[name] = float(self._surrogate(new_logp, diag_old[name], msgs).improvement)
        return {
            "surrogate_stale": values["stale"],
            "surrogate_fresh": values["fresh"],
            "stale_gap": abs(values["stale"] - values["fresh"]),
        }

    def _occupancy_divergence(self, fresh: RolloutBatch) -> float:
        """KL(P_{pi^(i-1)} || P_{pi^0}) over episodes, estimated on the fresh rollouts of pi^(i-1):
        mean over episodes of the summed log-ratio of every turn of a role updated this stage (k1)."""
        total = np.zeros(len(fresh.trajectories))
        for adapter, start in self.stage_start_weights.items():
            if fresh.versions.get(adapter) == self._stage_start_version(adapter):
                continue
            turns = [
                (g, t)
                for g, traj in enumerate(fresh.trajectories)
                for t in traj.turns
                if t.adapter == adapter
            ]
            base = self.base_of[adapter]
            now = self.engine.snapshot_adapter(adapter, base)
            self.engine.restore_adapter(adapter, start, base)
            try:
                old = self._score(
                    [t.prompt_ids for _, t in turns], [t.completion_ids for _, t in turns], adapter
                )
            finally:
                self.engine.restore_adapter(adapter, now, base)
            for (g, t), lp in zip(turns, old, strict=True):
                total[g] += t.logprob_sum - float(lp.sum())
        return float(total.mean())

    def _stage_start_version(self, adapter: str) -> int | None:
        starts = [b for b in self.stage_batches.values() if b.team_index == 0]
        return starts[0].versions.get(adapter) if starts else None


# ------------------------------------------------------------------------------------------------------
# The run: evaluation, stages, checkpoints


def evaluate(team: Team, task: TaskFamily, tasks: list[TaskInstance], seed: int) -> dict[str, Any]:
    """Held-out team return: mean verifier reward over one episode per task."""
    trajectories = team.run(tasks, group_size=1, verifier=task, seed=seed)
    rewards = [t.reward for t in trajectories]
    return {
        "accuracy": float(np.mean(rewards)) if rewards else 0.0,
        "episodes": len(rewards),
        "tokens": sum(t.num_tokens for t in trajectories),
    }


class Trainer:
    """`Trainer(cfg).train()`: a whole run in cfg.run_dir, resumed from its checkpoint if there is one."""

    def __init__(
        self, cfg: TrainConfig, callbacks: Callbacks | None = None, engine: EmbeddedEngine | None = None
    ):
        self.cfg = cfg
        self.callbacks = callbacks or Callbacks()
        self.run_dir = Path(cfg.run_dir)
        self._engine = engine

    def model_path(self) -> str:
        return model_path(self.cfg)  # team.model, else the task's own warm-started model

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(cfg.torch_threads)
        run = RunDir.create(cfg)  # a new run directory, or the same config as the run it resumes
        roles = run.roles
        task = run.task()
        torch.manual_seed(cfg.seed)  # LoRA A-matrix initialisation
        engine = self._engine or run.engine("fresh", threads=cfg.torch_threads)
        ckpt = load_latest_checkpoint(self.run_dir)
        state = RunState()
        metrics = MetricsLog(self.run_dir)
        if ckpt is not None:
            metrics.truncate_to_bytes(ckpt.state["metrics_bytes"])  # drop what followed the checkpoint
            state = RunState(**ckpt.state["run"])
        team = LLMStageTeam(cfg, engine, roles, task, metrics, state, self.run_dir, self.callbacks)
        start_stage = 0
        if ckpt is not None:
            start_stage = self._restore(team, ckpt)
        else:
            for r in roles:  # v0: the adapters the run starts from
                save_peft_adapter(engine.model(r.base_model), r.adapter, run.adapter_dir(r.adapter, 0))

        eval_team = Team.from_engine(with_temperature(roles, cfg.eval.temperature), engine, name="eval")
        stage_eval_tasks = (
            task.generate(cfg.eval.stage_episodes, seed=cfg.task.eval_seed) if cfg.eval.stage_episodes else []
        )

        def stage_eval(label: str) -> dict[str, Any]:
            if not stage_eval_tasks:
                return {"accuracy": None, "episodes": 0, "tokens": 0}  # per-stage evaluation switched off
            result = evaluate(eval_team, task, stage_eval_tasks, seed=derive_seed(cfg.seed, "eval"))
            self.callbacks.evaluation(label, result)
            return result

        if not state.evals:
            state.evals.append(stage_eval("before stage 0"))
            metrics.log("eval", state.step, stage=-1, **state.evals[-1])
        role_names = [r.name for r in roles]
        for stage in range(start_stage, cfg.stages):
            if cfg.max_rollout_tokens is not None and state.train_tokens >= cfg.max_rollout_tokens:
                break
            order_rng = random.Random(derive_seed(cfg.seed, "order", stage))
            self.callbacks.stage_start(stage, cfg.stages, role_names)
            team.on_update_done = lambda stage=stage: self._checkpoint(team, stage)
            record = run_stage(team, role_names, cfg.schedule, stage, order_rng)
            certificate = stage_certificate(
                [CertificateTerm(**_term_fields(u["certificate"])) for u in record.updates]
            )
            state.stage_certificates.append(certificate)
            state.evals.append(stage_eval(f"after stage {stage}"))
            improvement = _difference(state.evals[-1]["accuracy"], state.evals[-2]["accuracy"])
            metrics.log(
                "stage",
                state.step,
                stage=stage,
                order=record.order,
                rollouts=record.rollouts,
                certificate=certificate,
                realised_improvement=improvement,
                eval_before=state.evals[-2]["accuracy"],
                eval_after=state.evals[-1]["accuracy"],
                train_tokens=state.train_tokens,
                diagnostic_tokens=state.diagnostic_tokens,
                accepted=sum(u["accepted"] for u in record.updates),
                updates=len(record.updates),
            )
            team.stage_batches.clear()
            team.replay_updates.clear()
            team.done_updates.clear()
            self._checkpoint(team, stage + 1)
        improvements = [
            _difference(b["accuracy"], a["accuracy"])
            for a, b in zip(state.evals, state.evals[1:], strict=False)
        ]
        measured = [
            (c, d) for c, d in zip(state.stage_certificates, improvements, strict=False) if d is not None
        ]
        updates = read_metrics(self.run_dir, kind="update")
        summary = {
            "stages": len(state.stage_certificates),
            "updates": state.step,
            "train_tokens": state.train_tokens,
            "diagnostic_tokens": state.diagnostic_tokens,
            "eval_accuracy": [e["accuracy"] for e in state.evals],
            "certificate_rank_correlation": rank_correlation(
                [c for c, _ in measured], [d for _, d in measured]
            ),
            # the paper's "fraction of updates that left the region": first attempt ended with d_hat > delta
            "left_region_fraction": float(np.mean([u["left_region"] for u in updates])) if updates else 0.0,
            "rejected_fraction": float(np.mean([not u["accepted"] for u in updates])) if updates else 0.0,
        }
        metrics.log("run", state.step, **summary)
        metrics.close()
        self.engine, self.roles, self.task = engine, roles, task
        return summary

    # ---- resume ---------------------------------------------------------------------------------------
    def _checkpoint(self, team: LLMStageTeam, next_stage: int) -> None:
        """After every completed update (mid-stage) and every completed stage (next_stage = stage + 1)."""
        state = {
            "next_stage": next_stage,
            "run": dataclasses.asdict(team.state),
            "updates_done": list(team.done_updates),
            "batches": {
                k: {
                    "stage": b.stage,
                    "team_index": b.team_index,
                    "versions": b.versions,
                    "diagnostic": b.diagnostic,
                }
                for k, b in team.stage_batches.items()
            },
            "versions": team.versions(),
            "metrics_bytes": (self.run_dir / METRICS_FILE).stat().st_size,
        }
        adapters = {a: {k: p.detach() for k, p in ps.items()} for a, ps in team.params.items()}
        adapters.update({f"stage0/{a}": w for a, w in team.stage_start_weights.items()})
        save_checkpoint(
            self.run_dir,
            team.state.step,
            Checkpoint(
                state=state,
                adapters=adapters,
                optimizers={a: o.state_dict() for a, o in team.optimizers.items()},
                rng=rng_state(),
                batches={k: b.trajectories for k, b in team.stage_batches.items()},
            ),
        )

    def _restore(self, team: LLMStageTeam, ckpt: Checkpoint) -> int:
        engine = team.engine
        for adapter, weights in ckpt.adapters.items():
            if adapter.startswith("stage0/"):
                team.stage_start_weights[adapter.split("/", 1)[1]] = weights
                continue
            base = team.base_of[adapter]
            engine.restore_adapter(adapter, {k: v.clone() for k, v in weights.items()}, base)
            while engine.adapter_version(adapter, base) < ckpt.state["versions"][adapter]:
                engine.commit_adapter_update(adapter, base)
        for adapter, opt_state in ckpt.optimizers.items():
            team.optimizers[adapter].load_state_dict(opt_state)
        set_rng_state(ckpt.rng)
        team.stage_batches = {
            k: RolloutBatch(key=k, trajectories=ckpt.batches[k], **meta)
            for k, meta in ckpt.state["batches"].items()
        }
        team.done_updates = list(ckpt.state["updates_done"])
        team.replay_updates = {(u["stage"], u["index"], u["role"]): u for u in team.done_updates}
        return int(ckpt.state["next_stage"])


def turn_versions(batch: RolloutBatch) -> dict[str, list[int]]:
    """adapter -> the adapter versions recorded in the batch's turns (what the episodes were sampled with)."""
    seen: dict[str, set[int]] = {}
    for traj in batch.trajectories:
        for t in traj.turns:
            if t.adapter is not None:
                seen.setdefault(t.adapter, set()).add(t.adapter_version)
    return {a: sorted(v) for a, v in seen.items()}


def _difference(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def _term_fields(d: dict[str, Any]) -> dict[str, float]:
    return {k: d[k] for k in ("surrogate", "d_hat", "zeta_clip", "zeta_ratio", "zeta_norm", "c", "gamma")}


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
