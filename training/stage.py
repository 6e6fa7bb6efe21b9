"""One stage of Algorithm 1, written once for every team: the tabular exact teams of the theory lab and
the LLM teams of the trainer plug into the same loop through `StageTeam`.

    for stage k:
      choose order sigma
      for i in 1..n:  j = sigma(i)
        ROLLOUT   under the current intermediate team pi^(i-1)        (schedule decides: fresh or stale)
        OPTIMISE  agent j inside its trust region on that batch; swap j's accepted weights in
                  (one update: training/teamtr_step.py `teamtr_step` for LLM teams)
      LOG stage certificate C  (docs/training.md (C))                    (StageRecord.certificate)
          the held-out form that applies (training/certificate.py): speak_once = sum_i L_ho_i when every
          updated role spoke at most once per episode, else general; the proxy sum_i term_i without them

Stages are numbered from 1 wherever a person or a file sees them (progress lines, metrics.jsonl, `--stage K`
= after K stages, tables, plots; 0 is the start); `stage` here is the loop's 0-based index, which the
seeds derive from.

The schedule is a parameter, not a copy per variant:
  teamtr                resample after every update (intermediate occupancy)
  naive                 one batch per stage, reused by every update (stale occupancy)
  resample_every=k      resample after every k updates (teamtr is k=1; naive is k>=n)
  importance_weighting  stale batch, reweighted towards pi^(i-1) by the team (logs ESS/B)
  joint                 every agent updated at once from pi^0 on one batch: ONE objective over the team's
                        trajectory ratios (training/joint_step.py), not n per-agent steps
  resample=suffix       teamtr's resample keeps each episode of the previous batch up to the first
                        message of a role updated since, and samples only the rest from the current
                        team (`SuffixResampling.resample_suffix`): the kept prefix is already a sample of
                        the current team (exact check: theory/suffix.py). A team without it
                        resamples in full.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar, runtime_checkable

from teamtr.training.certificate import CertificateTerm, stage_headline

Batch = TypeVar("Batch")

ScheduleKind = Literal["teamtr", "naive", "joint", "importance_weighting"]
OrderKind = Literal["fixed", "reversed", "random"]
ResampleKind = Literal["full", "suffix"]


@dataclass
class ScheduleConfig:
    """Which rollouts each update of a stage is evaluated on."""

    kind: ScheduleKind = "teamtr"
    resample_every: int = 1  # teamtr only: resample after every k updates (1 = Algorithm 1)
    order: OrderKind = "fixed"  # sigma: fixed role order, reversed, or a random permutation per stage
    # Also sample a fresh batch of pi^(i-1) in stale schedules, only to measure the stale gap
    # (the surrogate on the stage-start batch vs on the fresh batch). Costs rollouts; off by default
    # for naive runs that are compared at equal token budgets.
    diagnose_stale_gap: bool = False
    # teamtr's resample: `full` samples every episode again; `suffix` re-samples each episode of the
    # previous batch from the first message of a role updated since: the same distribution (exact lab and
    # a two-sample test, docs/training.md) for fewer rollout tokens, hence the default.
    resample: ResampleKind = "suffix"

    def __post_init__(self) -> None:
        if self.kind not in ("teamtr", "naive", "joint", "importance_weighting"):
            raise ValueError(f"unknown schedule {self.kind!r}")
        if self.resample_every < 1:
            raise ValueError("resample_every must be >= 1")
        if self.order not in ("fixed", "reversed", "random"):
            raise ValueError(f"unknown order {self.order!r}")
        if self.resample not in ("full", "suffix"):
            raise ValueError(f"unknown resample {self.resample!r}")


@dataclass
class UpdateContext(Generic[Batch]):
    """What update i of a stage gets to see."""

    stage: int
    index: int  # i, 1-based position in sigma
    role: str  # j = sigma(i)
    batch: Batch  # the rollouts the update optimises on (fresh or stale, per the schedule)
    stage_start_batch: Batch  # rollouts of pi^0 (for the stale gap)
    fresh: bool  # batch was sampled from pi^(i-1) (intermediate occupancy)
    reweight: bool  # importance_weighting: reweight `batch` (from pi^0) towards pi^(i-1)
    fresh_batch: Batch | None = None  # rollouts of pi^(i-1), when available (stale-gap diagnostic)


class Update(Protocol):
    """What `StageTeam.update` returns: at least the update's term of the stage certificate."""

    @property
    def certificate(self) -> CertificateTerm | None:
        """term_i (docs/training.md, "Certificate and diagnostics"); None for a team that logs none."""
        ...


U = TypeVar("U", bound=Update)


@dataclass
class StageRecord(Generic[U]):
    stage: int
    order: list[str]
    updates: list[U] = field(default_factory=list)  # what StageTeam.update returned, in order
    rollouts: int = 0  # rollout batches sampled this stage
    # C_stage: the held-out form that applies (speak_once or general), else the proxy sum_i term_i;
    # None when the team logs no terms (the exact teams, whose bounds are checked exactly instead)
    certificate: float | None = None
    certificate_form: str | None = None  # "speak_once", "general" or "proxy": which C_stage is


def _stage_certificate(updates: list[U]) -> tuple[float | None, str | None]:
    return stage_headline([u.certificate for u in updates])  # training/certificate.py


class StageTeam(Protocol[Batch, U]):
    """A team that Algorithm 1 can train: tabular (exact) or LLM (sampled)."""

    def rollout(self, stage: int, index: int, trains: bool = True) -> Batch:
        """A batch of episodes of the current (intermediate) team; `trains`: an update will optimise on it
        (False: sampled only to measure the stale gap), as `run_stage` decides."""
        ...

    def update(self, ctx: UpdateContext[Batch]) -> U:
        """Optimise ctx.role on ctx.batch inside its trust region; swap the accepted weights in."""
        ...

    def update_joint(self, stage: int, roles: list[str], batch: Batch) -> list[U]:
        """Update all roles at once from the same pi^0 batch; swap all accepted weights in."""
        ...


@runtime_checkable
class SuffixResampling(Protocol[Batch]):
    """A team that can resample only the part of a batch's episodes a role update can change."""

    def resample_suffix(self, stage: int, index: int, previous: Batch, updated: list[str]) -> Batch:
        """Episodes of pi^index: each episode of `previous` kept up to the first message of a role in
        `updated` (the roles updated since `previous` was sampled), the rest sampled from the team now."""
        ...


def stage_order(roles: list[str], order: OrderKind, rng: random.Random) -> list[str]:
    if order == "fixed":
        return list(roles)
    if order == "reversed":
        return list(reversed(roles))
    perm = list(roles)
    rng.shuffle(perm)
    return perm


def run_stage(
    team: StageTeam[Batch, U], roles: list[str], cfg: ScheduleConfig, stage: int, rng: random.Random
) -> StageRecord[U]:
    """Algorithm 1, one stage. The schedule only decides which batch each update sees."""
    sigma = stage_order(roles, cfg.order, rng)
    record = StageRecord(stage=stage, order=sigma)

    stage_start_batch = team.rollout(stage, 0, trains=True)  # rollouts of pi^0
    record.rollouts += 1
    if cfg.kind == "joint":
        record.updates = team.update_joint(stage, sigma, stage_start_batch)
        record.certificate, record.certificate_form = _stage_certificate(record.updates)
        return record

    batch, fresh = stage_start_batch, True
    sampled_at = 1  # the batch is of pi^(sampled_at - 1): roles sigma[sampled_at - 1 : i - 1] changed since
    suffix = cfg.resample == "suffix" and isinstance(team, SuffixResampling)
    for i, role in enumerate(sigma, start=1):
        fresh_batch = stage_start_batch if i == 1 else None
        if i > 1:
            resample = cfg.kind == "teamtr" and (i - 1) % cfg.resample_every == 0
            if resample and suffix:  # rollouts of pi^(i-1), re-sampled from the updated roles' turns on
                updated = sigma[sampled_at - 1 : i - 1]
                fresh_batch = team.resample_suffix(stage, i - 1, batch, updated)
                record.rollouts += 1
            elif resample or cfg.diagnose_stale_gap:
                fresh_batch = team.rollout(stage, i - 1, trains=resample)  # rollouts of pi^(i-1)
                record.rollouts += 1
            if resample:
                sampled_at = i
            # without a resample the batch comes from a team older than pi^(i-1): stale
            batch, fresh = (fresh_batch, True) if resample else (batch, False)
        ctx = UpdateContext(
            stage=stage,
            index=i,
            role=role,
            batch=batch,
            stage_start_batch=stage_start_batch,
            fresh=fresh,
            reweight=cfg.kind == "importance_weighting" and i > 1,
            fresh_batch=fresh_batch,
        )
        record.updates.append(team.update(ctx))
    record.certificate, record.certificate_form = _stage_certificate(record.updates)  # LOG (C)
    return record
