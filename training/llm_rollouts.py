"""ROLLOUT of Algorithm 1 for an LLM team: the sampling half of training/llm_team.py `LLMStageTeam`.

`TeamSampler` draws each update's batch B x G through the team's LangGraph graph (sampled by the trainer's
embedded engine or by vLLM, whose adapters it keeps at the trainer's versions), re-runs only the episodes'
suffixes after an update (`resample_suffix`), and samples the held-out KL check's held-out episodes.
Whether a batch trains is `run_stage`'s decision (training/stage.py), passed in; the token counts it
keeps are the run's (train, diagnostic, held-out tokens of `RunState`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from teamtr.graphs.capture import EpisodeError, describe_error
from teamtr.graphs.role_models import UnknownRoleError
from teamtr.graphs.run_layout import RunDirError, adapter_dir
from teamtr.graphs.task import TaskFamily, TaskInstance, balanced_prompts
from teamtr.graphs.team import Team, derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.training.config import TrainConfig
from teamtr.training.distributed import DataParallel
from teamtr.training.dynamic_sampling import REFILL_ROUNDS, refill_prompts, refilled_episodes
from teamtr.training.metrics import MetricsLog
from teamtr.training.policy import AdapterPolicy
from teamtr.training.progress import TrainingProgress
from teamtr.training.rollouts import RolloutBatch
from teamtr.training.token_counts import PrefixCache
from teamtr.training.vllm_rollouts import VLLMRollouts

T = TypeVar("T")


class TeamSampler:
    """The episodes an LLM team's stage trains and monitors on (checkpointed in `batches`)."""

    def __init__(
        self,
        cfg: TrainConfig,
        team: Any,
        task: TaskFamily,
        policies: dict[str, AdapterPolicy],
        state: Any,
        metrics: MetricsLog,
        progress: TrainingProgress,
        run_dir: Path,
        vllm: VLLMRollouts | None,
        data_parallel: DataParallel | None,
    ) -> None:
        self.cfg, self.team, self.task, self.policies, self.state = cfg, team, task, policies, state
        self.metrics, self.progress, self.run_dir = metrics, progress, run_dir
        self.vllm, self.data_parallel = vllm, data_parallel
        self.batches: dict[str, RolloutBatch] = {}  # this stage's batches (checkpointed)
        self.prefix_cache = PrefixCache()  # the training rollouts' uncached prefill (token_counts.py)

    def stage_prompts(self, stage: int) -> list[TaskInstance]:
        """The stage's prompt batch B (the same prompts for every update of the stage), balanced over the
        task's strata unless rollout.stratify is off."""
        n, seed = self.cfg.rollout.prompts_per_update, derive_seed(self.cfg.task.train_seed, stage)
        return balanced_prompts(self.task, n, seed) if self.cfg.rollout.stratify else self.task.generate(n, seed=seed)

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

    def rollout(self, stage: int, index: int, trains: bool) -> RolloutBatch:
        """G episodes per prompt of the current intermediate team pi^index, through the team's graph;
        `trains` (run_stage's decision): an update optimises on them, else they count as diagnostic tokens."""
        key = f"s{stage}-k{index}"
        if key in self.batches:  # resumed mid-stage: this batch was sampled before the interruption
            return self.batches[key]
        self.sync_rollout_adapters()
        trajectories = self._episodes(
            f"stage {stage + 1} rollout {index}",
            self.stage_prompts(stage),
            group_size=self.cfg.rollout.group_size,
            seed=derive_seed(self.cfg.seed, "rollout", stage, index),
        )
        sampled = list(trajectories)  # every episode sampled, dropped refill groups too (DAPO)
        if self.cfg.loss.dynamic_sampling:  # DAPO: zero-spread groups replaced by refill prompts' groups
            trajectories = self._refilled(stage, index, trajectories, sampled)
        batch = RolloutBatch(key, stage, index, trajectories, self.versions(), diagnostic=not trains)
        tokens = sum(t.num_tokens for t in sampled)
        if trains:
            self.state.train_tokens += tokens
            self.state.train_prefill_tokens += self.prefix_cache.sampled(t for traj in sampled for t in traj.turns)
        else:
            self.state.diagnostic_tokens += tokens
        self.batches[key] = batch
        self.progress.rollout(stage, index, len(trajectories))
        return batch

    def _refilled(
        self, stage: int, index: int, trajectories: list[Trajectory], sampled: list[Trajectory]
    ) -> list[Trajectory]:
        """DAPO's dynamic sampling: groups with no reward spread replaced by groups of refill prompts (at
        most REFILL_ROUNDS more rounds); every refill episode is appended to `sampled` (the dropped
        groups' tokens count as the batch's tokens)."""

        def sample(round_: int) -> list[Trajectory]:
            episodes = self._episodes(
                f"stage {stage + 1} rollout {index} refill {round_}",
                refill_prompts(self.task, self.cfg.task.train_seed, stage, round_, len(self.stage_prompts(stage))),
                group_size=self.cfg.rollout.group_size,
                seed=derive_seed(self.cfg.seed, "refill", stage, index, round_),
            )
            sampled.extend(episodes)
            return episodes

        kept, rounds = refilled_episodes(trajectories, self.cfg.rollout.prompts_per_update, sample)
        self.metrics.log("refill", self.state.step, batch_key=f"s{stage}-k{index}", rounds=rounds,
                         groups=len({t.group_id for t in kept}))  # fmt: skip
        return kept

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
        if key in self.batches:  # resumed mid-stage
            return self.batches[key]
        if not (isinstance(self.team, Team) and self.team.resumable):
            self.metrics.log(
                "resample",
                self.state.step,
                batch_key=key,
                mode="full",
                reason="the team cannot restart from a prefix (user graph or custom router)",
            )
            return self.rollout(stage, index, trains=True)
        self.sync_rollout_adapters()
        prompts = self._prompts_by_id(stage)
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
            raise RunDirError(f"stage {stage + 1} suffix resample {index} failed: {e}") from e
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
        self.state.train_prefill_tokens += self.prefix_cache.sampled(
            t for traj, c in zip(trajectories, cuts, strict=True) if c is not None for t in traj.turns[c:]
        )
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
        self.batches[key] = batch
        self.progress.rollout(stage, index, len(trajectories))
        return batch

    def _prompts_by_id(self, stage: int) -> dict[str, TaskInstance]:
        """The stage's training prompts by id (and, with dynamic sampling, its refill prompts')."""
        prompts = {p.id: p for p in self.stage_prompts(stage)}
        if self.cfg.loss.dynamic_sampling:  # the batch may hold refill prompts' groups
            n = len(prompts)
            for r in range(1, REFILL_ROUNDS + 1):
                prompts.update({p.id: p for p in refill_prompts(self.task, self.cfg.task.train_seed, stage, r, n)})
        return prompts

    def prefix_baselines(
        self, stage: int, index: int, batch: RolloutBatch, role: str, samples: int
    ) -> np.ndarray:
        """loss.credit = prefix: per episode of `batch`, the mean return of `samples` continuations of the
        current team from the episode's turns before `role`'s first turn (NaN where `role` did not speak).
        The earlier turns are in the baseline, so the role's advantage holds only what followed its own
        prefix. The continuations' tokens count as train_tokens: they are the update's evidence."""
        where = f"stage {stage + 1} update {index} credit continuations ({role})"
        if not (isinstance(self.team, Team) and self.team.resumable):
            raise RunDirError(
                f"{where}: loss.credit 'prefix' needs a team that restarts from a prefix (a Team with its "
                "default router); this graph cannot: use loss.credit 'episode'"
            )
        self.sync_rollout_adapters()
        prompts = self._prompts_by_id(stage)
        seed = derive_seed(self.cfg.seed, "credit", stage, index, role)
        cuts = [next((k for k, t in enumerate(traj.turns) if t.role == role), None) for traj in batch.trajectories]
        jobs = [(n, k) for n, c in enumerate(cuts) if c is not None for k in range(samples)]

        async def continuation(n: int, k: int) -> Trajectory:
            traj = batch.trajectories[n]
            return await self.team.arun_from(
                prompts[traj.task_id], traj.turns[: cuts[n]], verifier=self.task,
                seed=derive_seed(seed, n, k), group_id=traj.group_id,
            )  # fmt: skip

        async def continuations() -> list[Trajectory]:
            return list(await asyncio.gather(*(continuation(n, k) for n, k in jobs)))

        try:
            done = self._on_main(lambda: asyncio.run(continuations()))
        except EpisodeError as e:
            self.metrics.log("failed", self.state.step, where=where, error=f"{type(e).__name__}: {e}")
            raise RunDirError(f"{where} failed: {e}") from e
        totals = np.zeros(len(cuts))
        for (n, _), traj in zip(jobs, done, strict=True):
            totals[n] += float(traj.reward)
            self.state.train_tokens += sum(len(t.completion_ids) for t in traj.turns[cuts[n] :])
        return np.where([c is not None for c in cuts], totals / samples, np.nan)

    def heldout_episodes(self, stage: int, index: int, purpose: str = "kl-monitor") -> list[Trajectory]:
        """Held-out episodes of the current team, never trained on, with their own prompts and seeds
        (derived from (purpose, stage, index), so no training random state is consumed). purpose
        "kl-monitor": the held-out KL check that measures delta_eff (trust_region.heldout_episodes);
        "kl-probe": the contexts the probe check holds the region on (trust_region.probe_episodes), an
        independent set, so that delta_eff is measured on contexts the enforcement never saw."""
        tr = self.cfg.trust_region
        n = tr.heldout_episodes if purpose == "kl-monitor" else tr.probe_episodes
        if n == 0:
            return []
        prompts = self.task.generate(n, seed=derive_seed(self.cfg.task.train_seed, purpose, stage, index))
        self.sync_rollout_adapters()
        trajectories = self._episodes(
            f"stage {stage + 1} held-out episodes ({purpose}) before update {index}",
            prompts,
            group_size=1,
            seed=derive_seed(self.cfg.seed, purpose, stage, index),
        )
        tokens = sum(t.num_tokens for t in trajectories)
        if purpose == "kl-monitor":
            self.state.heldout_tokens += tokens
        else:
            self.state.probe_tokens += tokens
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
            self.metrics.log("failed", self.state.step, where=where, error=describe_error(e))
            raise RunDirError(
                f"{where} failed: {describe_error(e)} (the run resumes from its last checkpoint)"
            ) from e

    def _on_main(self, fn: Callable[[], T]) -> T:
        """fn() here; data parallel: on rank 0 only, its episodes broadcast to every rank."""
        return fn() if self.data_parallel is None else self.data_parallel.on_main(fn)

