"""The probe set of a swap: contexts at the swapped role's turns, from episodes of the current team.

Stage-0 (training/swap/stage0.py) aligns the newcomer on these contexts; the new run directory keeps
them in `swap/probes.jsonl` for inspection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from langchain_core.messages import BaseMessage

from teamtr.graphs.chat_format import to_chat_dicts
from teamtr.graphs.roles import Role, role_messages
from teamtr.graphs.task import TaskFamily
from teamtr.graphs.team import Team, derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.training.swap.config import SwapProgress


@dataclass
class Probe:
    """One context at the swapped role's turn: the messages it acts on (each model renders them)."""

    messages: list[BaseMessage]
    incumbent_text: str  # what the incumbent said there (kept for inspection)
    incumbent_ids: list[int] = field(default_factory=list)  # ... as the incumbent's tokens (to unify on)


def build_probes(
    team: Team, role: Role, task: TaskFamily, n: int, seed: int, progress: SwapProgress | None = None
) -> list[Probe]:
    """>= n contexts at `role`'s turns from episodes of the current team (rollout temperature)."""
    progress = progress or SwapProgress()
    probes: list[Probe] = []
    batch = 0
    while len(probes) < n:
        tasks = task.generate(n, seed=derive_seed(seed, "swap-probes", batch))
        prompts = {t.id: t.prompt for t in tasks}
        trajectories = team.run(
            tasks, group_size=1, verifier=task, seed=derive_seed(seed, "swap-rollout", batch)
        )
        probes += probes_from(trajectories, role, prompts)
        batch += 1
        progress.probes(min(len(probes), n), n)
        if batch > 20 and not probes:
            raise ValueError(f"role {role.name!r} never spoke in {batch} batches of episodes")
    return probes[:n]


def probes_from(trajectories: Sequence[Trajectory], role: Role, prompts: dict[str, str]) -> list[Probe]:
    out = []
    for traj in trajectories:
        for k, turn in enumerate(traj.turns):
            if turn.role == role.name:
                transcript = [(t.role, t.text) for t in traj.turns[:k]]
                messages = role_messages(role, prompts[traj.task_id], transcript)
                out.append(Probe(messages, turn.text, list(turn.completion_ids)))
    return out


def write_probes(out: Path, probes: list[Probe]) -> None:
    """`out/swap/probes.jsonl`: each probe's context (chat dicts) and the incumbent's message there."""
    (out / "swap").mkdir(exist_ok=True)
    with open(out / "swap" / "probes.jsonl", "w") as f:
        for p in probes:
            f.write(json.dumps({"messages": to_chat_dicts(p.messages), "incumbent": p.incumbent_text}) + "\n")
