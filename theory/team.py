"""A tabular team that plugs into the shared stage loop (`teamtr.training.stage.run_stage`).

For an exact team a "batch" is not a set of sampled episodes but the exact occupancy and advantages of
the team that would have produced them (`ExactBatch`). The schedule decides, as for the LLM team, which
batch an update sees: the intermediate team's (TeamTR), the stage-start team's (naive, stale), the
stage-start team's reweighted towards the intermediate team (importance weighting), or one batch for all
agents at once (joint). Every update logs the exact quantities the theorems talk about (`UpdateRecord`).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from teamtr.theory.env import TeamInstance
from teamtr.theory.exact import (
    Evaluation,
    Logits,
    agent_weights,
    evaluate,
    expected_gain,
    l1_distance,
    masked_sum,
    policies,
    surrogate,
    trajectory_ess_fraction,
    trust_region_step,
    weighted_kl,
)
from teamtr.training.stage import ScheduleConfig, StageRecord, UpdateContext, run_stage


@dataclass
class ExactBatch:
    """The exact "rollouts" of one team: its logits and its exact evaluation."""

    logits: Logits
    evaluation: Evaluation


@dataclass
class UpdateRecord:
    """Exact bookkeeping of one agent update (all KLs are rho-weighted KL(pi_cur || pi_new))."""

    stage: int
    index: int  # i, position in sigma (1-based)
    role: str
    data: str  # which occupancy/advantages the step used: fresh | stale | reweighted | joint
    delta: float  # the trust-region radius enforced on that data
    eta: float  # natural-gradient step size found by the line search
    kl_batch: float  # KL on the data the step used (<= delta)
    kl_intermediate: float  # delta_i of the theorems: KL on the contexts of pi^(i-1) (the team it acts in)
    kl_stage_start: float  # KL on the contexts of pi^0
    surrogate_used: float  # L on the data the step used
    surrogate_intermediate: float  # L_i: occupancy and advantages of pi^(i-1)
    surrogate_stale: float  # L_i^stale: occupancy and advantages of pi^0
    J_before: float  # J(pi^(i-1))
    J_after: float  # J(pi^i)
    improvement: float  # J(pi^i) - J(pi^(i-1)), exact
    eps: float  # max over the agent's contexts of |sum_m pi_new(m|s) A^(pi^(i-1))(s,m)|
    agent_mass_intermediate: float  # sum of d^(pi^(i-1)) over the agent's contexts
    agent_mass_stage_start: float  # sum of d^(pi^0) over the agent's contexts
    occupancy_shift_from_start: float  # ||d^(pi^(i-1)) - d^(pi^0)||_1 (unnormalised, discounted)
    occupancy_shift_of_update: float  # ||d^(pi^i) - d^(pi^(i-1))||_1
    context_divergence: float  # ||rho_j^(pi^i) - rho_j^(data)||_1: contexts acted on vs trained on
    ess_fraction: float  # ESS/B of episode weights from pi^0's batch towards pi^(i-1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def certificate(self) -> None:
        """No sampled certificate: the exact bounds are checked on these records instead (bounds.py)."""
        return None


def _copy(logits: Logits) -> Logits:
    return [z.copy() for z in logits]


class TabularTeam:
    """Implements `StageTeam[ExactBatch]` for a `TeamInstance` with tabular softmax policies."""

    def __init__(self, instance: TeamInstance, logits: Logits, delta: float = 0.01) -> None:
        if delta <= 0:
            raise ValueError(f"delta must be > 0, got {delta}")
        if [z.shape for z in logits] != [(k, instance.n_messages) for k in instance.layer_sizes]:
            raise ValueError("logits must have shape (K_t, M) for every layer")
        self.instance = instance
        self.logits = _copy(logits)
        self.delta = delta
        self.records: list[UpdateRecord] = []

    @property
    def roles(self) -> list[str]:
        return list(self.instance.agent_names)

    @property
    def logits(self) -> Logits:
        return self._logits

    @logits.setter
    def logits(self, value: Logits) -> None:
        self._logits = value
        self._evaluation: Evaluation | None = None  # the team changed: evaluate again when asked

    def evaluation(self) -> Evaluation:
        """Exact statistics of the current team (cached until its logits change)."""
        if self._evaluation is None:
            self._evaluation = evaluate(self.instance, self._logits)
        return self._evaluation

    # --- StageTeam protocol -------------------------------------------------------------------
    def rollout(self, stage: int, index: int, trains: bool = True) -> ExactBatch:
        return ExactBatch(logits=_copy(self.logits), evaluation=self.evaluation())

    def resample_suffix(self, stage: int, index: int, previous: ExactBatch, updated: list[str]) -> ExactBatch:
        """schedule.resample: suffix. Its episodes are distributed exactly as the current team's
        (theory/suffix.py, tests/theory/test_suffix.py), so its exact batch is the current team's."""
        return self.rollout(stage, index)

    def update(self, ctx: UpdateContext[ExactBatch]) -> UpdateRecord:
        agent = self.instance.agent_index(ctx.role)
        mask = self.instance.agent_mask(agent)
        current = self.evaluation()  # pi^(i-1), exact
        start = ctx.stage_start_batch.evaluation  # pi^0
        if ctx.reweight:
            # Exact importance weighting of pi^0's batch towards pi^(i-1) recovers pi^(i-1)'s occupancy
            # and advantages exactly; what it costs with finite batches is the ESS, logged below.
            data, data_kind = current, "reweighted"
        elif ctx.fresh:
            data, data_kind = ctx.batch.evaluation, "fresh"
        else:
            data, data_kind = ctx.batch.evaluation, "stale"
        shared = self.instance.shared_advantages(data.d, data.A)  # = data.A unless contexts share a policy
        step = trust_region_step(self.logits, mask, data.d, shared, self.delta)
        self.logits = step.logits
        after = self.evaluation()
        record = self._record(
            ctx.stage, ctx.index, ctx.role, mask, data, data_kind, step, current, after, start
        )
        record.ess_fraction = trajectory_ess_fraction(self.instance, start.policy, current.policy)
        self.records.append(record)
        return record

    def update_joint(self, stage: int, roles: list[str], batch: ExactBatch) -> list[UpdateRecord]:
        start = batch.evaluation
        steps = []
        for role in roles:
            mask = self.instance.agent_mask(self.instance.agent_index(role))
            shared = self.instance.shared_advantages(start.d, start.A)
            steps.append((role, mask, trust_region_step(batch.logits, mask, start.d, shared, self.delta)))
        new_logits = _copy(batch.logits)
        for _role, mask, step in steps:  # agents own disjoint contexts: swap every agent's part in
            new_logits = [
                np.where(m[:, None], z_new, z)
                for z, z_new, m in zip(new_logits, step.logits, mask, strict=True)
            ]
        self.logits = new_logits
        after = self.evaluation()
        records = []
        for i, (role, mask, step) in enumerate(steps, start=1):
            record = self._record(stage, i, role, mask, start, "joint", step, start, after, start)
            record.ess_fraction = 1.0
            records.append(record)
        self.records.extend(records)
        return records

    # --- exact bookkeeping ----------------------------------------------------------------------
    def _record(
        self,
        stage: int,
        index: int,
        role: str,
        mask: list[np.ndarray],
        data: Evaluation,
        data_kind: str,
        step: Any,
        current: Evaluation,
        after: Evaluation,
        start: Evaluation,
    ) -> UpdateRecord:
        new_policy = policies(step.logits)
        gain = expected_gain(current.A, new_policy)
        eps = max((float(np.abs(g[m]).max()) if m.any() else 0.0) for g, m in zip(gain, mask, strict=True))
        return UpdateRecord(
            stage=stage,
            index=index,
            role=role,
            data=data_kind,
            delta=self.delta,
            eta=step.eta,
            kl_batch=step.kl,
            kl_intermediate=weighted_kl(agent_weights(current, mask), current.policy, new_policy),
            kl_stage_start=weighted_kl(agent_weights(start, mask), current.policy, new_policy),
            surrogate_used=step.surrogate,
            surrogate_intermediate=surrogate(current.d, current.A, new_policy, mask),
            surrogate_stale=surrogate(start.d, start.A, new_policy, mask),
            J_before=current.J,
            J_after=after.J,
            improvement=after.J - current.J,
            eps=eps,
            agent_mass_intermediate=masked_sum(current.d, mask),
            agent_mass_stage_start=masked_sum(start.d, mask),
            occupancy_shift_from_start=l1_distance(current.d, start.d),
            occupancy_shift_of_update=l1_distance(after.d, current.d),
            context_divergence=l1_distance(agent_weights(after, mask), agent_weights(data, mask)),
            ess_fraction=1.0,
        )


def train(team: TabularTeam, schedule: ScheduleConfig, stages: int, seed: int = 0) -> list[StageRecord]:
    """Run `stages` stages of Algorithm 1 (the shared loop) on an exact team."""
    rng = random.Random(seed)
    return [run_stage(team, team.roles, schedule, stage, rng) for stage in range(stages)]
