"""What one update of an LLM team logs (training/llm_team.py `LLMStageTeam.log_update`): the "update"
record of metrics.jsonl (docs/training.md, "Run directory"), its certificate term with the held-out
forms, and what was measured before the step for it (`AroundStep`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from teamtr.graphs.roles import Role
from teamtr.training.certificate import CertificateTerm, with_heldout
from teamtr.training.config import TrainConfig
from teamtr.training.diagnostics import OutOfSampleKL, StaleGap, turn_versions
from teamtr.training.policy import AdapterPolicy
from teamtr.training.rollouts import RolloutBatch
from teamtr.training.stage import UpdateContext
from teamtr.training.teamtr_step import StepResult


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


@dataclass
class AroundStep:
    """What `LLMStageTeam.before_step` measured before a step, for its record."""

    t0: float
    policy: AdapterPolicy
    versions_before: dict[str, int]
    weights: np.ndarray | None  # importance weights of the batch's episodes (None: all 1)
    stale_gap: StaleGap
    heldout_kl: OutOfSampleKL
    rollout_gaps: dict[str, dict[str, float]] | None


def unseen_share(heldout_prompts: list[list[int]], batch_prompts: list[list[int]]) -> float | None:
    """Share of held-out contexts (a role's prompt token ids) that no message of the batch had."""
    if not heldout_prompts:
        return None
    seen = {tuple(p) for p in batch_prompts}
    return sum(tuple(p) not in seen for p in heldout_prompts) / len(heldout_prompts)


def heldout_certificate(
    step: StepResult, heldout_kl: OutOfSampleKL, measured: dict[str, Any]
) -> CertificateTerm:
    """The step's certificate term with its held-out forms from the held-out KL check's episodes."""
    return with_heldout(
        step.certificate,
        heldout_kl.heldout_surrogate(),
        measured["kl_out_of_sample"],
        max(Counter(heldout_kl.episode_of).values(), default=0),
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
        "stage": ctx.stage + 1,  # numbered from 1, as everywhere a stage is shown
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
