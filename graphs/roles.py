"""A role: one agent of the team, declared in graph code."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from teamtr.graphs.engine import DEFAULT_BASE, SamplingParams


@dataclass(frozen=True)
class Role:
    """One agent: its name, its system prompt, the LoRA adapter it speaks with, and its base model.

    `adapter=None` means the role speaks with the base model itself (no LoRA). `base_model` names a base
    model in the engine, so a team can mix base models role by role.
    """

    name: str
    system_prompt: str
    adapter: str | None = None
    base_model: str = DEFAULT_BASE
    # No stop string by default: a chat model ends its message with an EOS token (the engine stops on
    # every EOS id of the model's generation config). The demo's character model ends a message with a
    # newline instead: its roles set stop=("\n",) themselves (graphs/chain_team.py).
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"role name {self.name!r}: use letters, digits, '-' and '_'")


def role_messages(role: Role, task: str, transcript: list[tuple[str | None, str]]) -> list[BaseMessage]:
    """The context role `role` acts on: its system prompt, the task, then every message so far.

    All roles share one transcript, seen from the acting role's side: its own earlier messages are
    assistant turns (what it said), every other role's message is a user turn carrying the author's
    `name` (what it was told, and by whom). Where a chat template drops `name`, graphs/chat_format.py
    writes the author into the text instead, so authorship survives any template. An entry without an
    author (None) is the user's own message in a thread (graphs/team.py): a plain user turn, like the task.
    """
    messages: list[BaseMessage] = [SystemMessage(role.system_prompt), HumanMessage(task)]
    for author, text in transcript:
        if author is None:
            messages.append(HumanMessage(text))
            continue
        own = author == role.name
        messages.append(AIMessage(text, name=author) if own else HumanMessage(text, name=author))
    return messages


def with_view(role: Role, view: str | None) -> Role:
    """The role with its private view of one task (a split-information family's table, the relay's
    value) appended to its system prompt; the same role without one."""
    if not view:
        return role
    return dataclasses.replace(role, system_prompt=f"{role.system_prompt}\n{view}".strip())


def with_temperature(roles: list[Role], temperature: float) -> list[Role]:
    """The same roles, each sampling at `temperature` (training rollouts, evaluation, serving)."""
    return [
        dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, temperature=temperature))
        for r in roles
    ]
