"""A chat request's messages as the served team takes them: the task text a Team sees, LangChain messages
for a user graph's MessagesState, the digests by which a thread recognises what its client has seen,
and the token usage of the episodes that answered."""

from __future__ import annotations

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from teamtr.client.protocol import ChatMessage, Usage
from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.conversations import message_digest


def task_text(messages: list[ChatMessage]) -> str:
    """The user's last message, after the earlier messages folded in as `<role>: <content>` lines."""
    *context, last = messages
    lines = [f"{m.name or m.role}: {m.text()}" for m in context if m.text().strip()]
    return "\n".join([*lines, last.text()])


_MESSAGE_TYPES = {"system": SystemMessage, "developer": SystemMessage, "assistant": AIMessage}


def digests(messages: list[ChatMessage]) -> list[str]:
    return [message_digest(m.role, m.name, m.text()) for m in messages]


def known_in_thread(messages: list[ChatMessage], seen: list[str]) -> int:
    """How many of a request's messages its thread has already, given the digests `seen` of what its
    client has seen: a client that resends the whole conversation (its messages start with the seen ones)
    sends only what follows; a client whose history is older than the thread's (it resends a request
    whose answer it never got: the server died after committing the episode, before answering) adds only
    its last message; any other history is new in full."""
    if not seen:
        return 0
    sent = digests(messages)
    if len(sent) > len(seen) and sent[: len(seen)] == seen:
        return len(seen)
    if 1 < len(sent) <= len(seen) + 1 and sent[:-1] == seen[: len(sent) - 1]:
        return len(sent) - 1
    return 0


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
