"""ROLLOUT and CACHE steps: a batch of team episodes, and the updated agent's messages in it as tensors.

A `RolloutBatch` is B prompts x G episodes of one team (the intermediate team pi^(i-1) when fresh),
with the adapter versions every role had when it was sampled. `RoleMessages` collects agent j's
messages of a batch (only the updated agent's tokens enter its loss) with the episode's advantage
broadcast to each of them, padded to [M, T] tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from teamtr.graphs.trajectory import Trajectory
from teamtr.training.advantages import Advantages


@dataclass
class RolloutBatch:
    key: str  # "s<stage>-k<k>": rollouts of pi^k in stage <stage>
    stage: int
    team_index: int  # k: the team pi^k it was sampled from (0 = stage start)
    trajectories: list[Trajectory]
    versions: dict[str, int] = field(default_factory=dict)  # adapter -> version when sampled
    diagnostic: bool = False  # sampled only to measure the stale gap (not in the training budget)

    @property
    def rewards(self) -> np.ndarray:
        return np.array([t.reward for t in self.trajectories], dtype=np.float64)

    @property
    def groups(self) -> list[str]:
        return [t.group_id for t in self.trajectories]

    @property
    def completion_tokens(self) -> int:
        return sum(t.num_tokens for t in self.trajectories)


@dataclass
class RoleMessages:
    """Agent j's M messages of one batch, padded: what its surrogate and KL estimates are computed on."""

    prompts: list[list[int]]
    completions: list[list[int]]
    episode: torch.Tensor  # [M] index of the episode each message belongs to
    adv: torch.Tensor  # [M] the episode's advantage A_g, broadcast to the message
    weight: torch.Tensor  # [M] per-message sample weight (importance weights, else 1)
    mask: torch.Tensor  # [M, T] 1 on completion tokens
    behaviour_logp: torch.Tensor  # [M, T] log-probs the engine sampled with

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, idx: torch.Tensor) -> RoleMessages:
        ids = idx.tolist()
        return RoleMessages(
            prompts=[self.prompts[i] for i in ids],
            completions=[self.completions[i] for i in ids],
            episode=self.episode[idx],
            adv=self.adv[idx],
            weight=self.weight[idx],
            mask=self.mask[idx],
            behaviour_logp=self.behaviour_logp[idx],
        )


# whose turns an update trains on: one role, or the roles that speak with one shared adapter
# (team.shared_adapter: every role of the team)
Speakers = str | tuple[str, ...]


def messages_of_role(
    batch: RolloutBatch,
    role: Speakers,
    advantages: Advantages,
    episode_weights: np.ndarray | None = None,
) -> RoleMessages:
    """Every message of `role` (of any of the roles, for a tuple) in the kept episodes, in episode order,
    with its episode's advantage and weight."""
    prompts, completions, episodes, behaviour = [], [], [], []
    for g, traj in enumerate(batch.trajectories):
        if not advantages.keep[g]:
            continue
        for turn in traj.turns_of(role):
            if not turn.completion_ids:
                continue
            prompts.append(turn.prompt_ids)
            completions.append(turn.completion_ids)
            episodes.append(g)
            behaviour.append(turn.logprobs)
    episode = torch.tensor(episodes, dtype=torch.long)
    adv = torch.as_tensor(advantages.values, dtype=torch.float32)[episode] if episodes else torch.zeros(0)
    w = np.ones(len(batch.trajectories)) if episode_weights is None else episode_weights
    weight = torch.as_tensor(w, dtype=torch.float32)[episode] if episodes else torch.zeros(0)
    behaviour_logp, mask = pad([torch.tensor(b, dtype=torch.float32) for b in behaviour])
    return RoleMessages(prompts, completions, episode, adv, weight, mask, behaviour_logp)


def pad(rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D tensors to [M, T]; returns (values, mask)."""
    width = max((len(r) for r in rows), default=0)
    values = torch.zeros((len(rows), width), dtype=rows[0].dtype if rows else torch.float32)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        values[i, : len(r)] = r
        mask[i, : len(r)] = 1.0
    return values, mask


LogProbFn = Callable[[list[list[int]], list[list[int]]], list[torch.Tensor]]


def padded_logprobs(fn: LogProbFn, msgs: RoleMessages, chunk: int) -> torch.Tensor:
    """[M, T] log pi(x_u | s, x_<u) of msgs' completion tokens, computed `chunk` messages at a time.

    The chunking is fixed by message order, so pi_cur's log-probs and pi_new's (at unchanged weights)
    come out bit-identical: the ratio is exactly 1 before the first step."""
    rows: list[torch.Tensor] = []
    for start in range(0, len(msgs), chunk):
        rows += fn(msgs.prompts[start : start + chunk], msgs.completions[start : start + chunk])
    values = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # keeps the autograd graph
    # on the messages' device (the CPU): the model's may be a GPU, and the losses meet masks and advantages
    padded = torch.nn.functional.pad(values, (0, msgs.mask.shape[1] - values.shape[1]))
    return padded.to(msgs.mask.device)
