"""A chat request's messages as the served team takes them: the task text a Team sees, LangChain messages
for a user graph's MessagesState, and the token usage of the episodes that answered (what a thread has
seen of them: serving/threads.py)."""

from __future__ import annotations

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from teamtr.client.protocol import ChatMessage, Usage
from teamtr.graphs.trajectory import Trajectory


def task_text(messages: list[ChatMessage]) -> str:
    """The user's last message, after the earlier messages folded in as `<role>: <content>` lines."""
    *context, last = messages
    lines = [f"{m.name or m.role}: {m.text()}" for m in context if m.text().strip()]
    return "\n".join([*lines, last.text()])


_MESSAGE_TYPES = {"system": SystemMessage, "developer": SystemMessage, "assistant": AIMessage}


def chat_messages(messages: list[ChatMessage]) -> list[BaseMessage]:
    """Chat messages as LangChain messages: a user graph's MessagesState input (tool results become
    human messages carrying the tool's name)."""
    return [
        _MESSAGE_TYPES.get(m.role, HumanMessage)(m.text(), **({"name": m.name} if m.name else {}))
        for m in messages
    ]


def usage_of(*trajectories: Trajectory) -> Usage:
    """Token usage summed over all the turns of the episodes."""
    turns = [t for trajectory in trajectories for t in trajectory.turns]
    prompt = sum(len(t.prompt_ids) for t in turns)
    completion = sum(len(t.completion_ids) for t in turns)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
