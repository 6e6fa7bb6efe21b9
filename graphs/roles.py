"""A role: one agent of the team, declared in graph code."""

from __future__ import annotations

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
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"role name {self.name!r}: use letters, digits, '-' and '_'")


def role_messages(role: Role, task: str, transcript: list[tuple[str, str]]) -> list[BaseMessage]:
    """The context role `role` acts on: its system prompt, the task, then every message so far.

    All roles share one transcript; each message keeps its author's name. Messages of every role are
    assistant messages (the team speaks), so a standard chat template renders them.
    """
    messages: list[BaseMessage] = [SystemMessage(role.system_prompt), HumanMessage(task)]
    messages += [AIMessage(text, name=author) for author, text in transcript]
    return messages
