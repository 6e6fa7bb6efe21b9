"""The stage team of an improve run that learns from feedback (improve/feedback.py).

`FeedbackStageTeam` is training/llm_team.py's `LLMStageTeam` whose batches hold the served feedback
episodes, weighted towards the current intermediate team:

- feedback only (no verifier, no reward function): every update's batch is the feedback episodes
  (nothing is sampled: there is no reward for a new episode); rho_g = 1 until a role has moved;
- mixed (a reward exists): the fresh rollouts of pi^(i-1) as in any run (weight 1, scored by the
  reward), plus every feedback episode (weight w_g). Each source is normalised in its own groups (a
  feedback episode's group is `feedback:` + its prompt's), so a feedback reward is compared only with the
  feedback rewards of the same prompt, never with the reward function's scale.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from teamtr.graphs.trajectory import Trajectory
from teamtr.improve.feedback import (
    FEEDBACK_KEY,
    BehaviourLogProbs,
    episode_log_ratios,
    truncated_weights,
)
from teamtr.training.llm_team import LLMStageTeam
from teamtr.training.rollouts import RolloutBatch
from teamtr.training.stage import UpdateContext


class FeedbackStageTeam(LLMStageTeam):
    def __init__(
        self, *args: Any, feedback: list[Trajectory], cap: float = 1.0, mix: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.mix, self.cap = mix, cap
        self.feedback = [_marked(t, mix) for t in feedback]
        # constructed on the incumbent's weights (a resumed run restores its checkpoint only after this),
        # so these are log mu, and these versions are mu's
        self.behaviour = BehaviourLogProbs.of(self.feedback, self.policies)
        self.start_versions = self.versions()

    def moved(self) -> list[str]:
        return [a for a, v in self.versions().items() if v != self.start_versions[a]]

    def _with_feedback(self, batch: RolloutBatch | None, stage: int, index: int) -> RolloutBatch:
        if batch is None:
            return RolloutBatch(f"s{stage}-k{index}", stage, index, list(self.feedback), self.start_versions)
        return dataclasses.replace(batch, trajectories=[*batch.trajectories, *self.feedback])

    def rollout(self, stage: int, index: int, trains: bool = True) -> RolloutBatch:
        if self.mix:
            return self._with_feedback(super().rollout(stage, index, trains), stage, index)
        if index == 0:  # stage start: pi^0 (occupancy divergence is measured against it)
            self.stage_start_weights = {a: p.weights() for a, p in self.policies.items()}
        return self._with_feedback(None, stage, index)

    def resample_suffix(
        self, stage: int, index: int, previous: RolloutBatch, updated: list[str]
    ) -> RolloutBatch:
        if not self.mix:  # nothing is sampled: the same episodes, weighted towards pi^index
            return self._with_feedback(None, stage, index)
        fresh = [t for t in previous.trajectories if not t.metadata.get(FEEDBACK_KEY)]
        previous = dataclasses.replace(previous, trajectories=fresh)
        return self._with_feedback(super().resample_suffix(stage, index, previous, updated), stage, index)

    def episode_weights(self, ctx: UpdateContext[RolloutBatch]) -> np.ndarray:
        """1 for a fresh rollout; w_g = min(rho_g, cap) for a feedback episode."""
        moved = self.moved()
        log_rho = episode_log_ratios(self.feedback, self.behaviour, self.policies, moved)
        w_feedback = truncated_weights(log_rho, self.cap)
        at = {id(t): g for g, t in enumerate(self.feedback)}
        weights = np.array([w_feedback[at[id(t)]] if id(t) in at else 1.0 for t in ctx.batch.trajectories])
        self.metrics.log(
            "feedback_weights",
            self.state.step,
            stage=ctx.stage + 1,
            index=ctx.index,
            role=ctx.role,
            moved=moved,
            episodes=len(self.feedback),
            mean=float(w_feedback.mean()) if len(w_feedback) else None,
            min=float(w_feedback.min()) if len(w_feedback) else None,
            truncated=int((log_rho > np.log(self.cap)).sum()),
        )
        return weights


def _marked(t: Trajectory, mix: bool) -> Trajectory:
    """The episode flagged as feedback; in a mixed batch, in a group of its own source."""
    group = f"feedback:{t.group_id}" if mix else t.group_id
    return dataclasses.replace(t, group_id=group, metadata={**t.metadata, FEEDBACK_KEY: True})
