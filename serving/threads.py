"""A request's thread: the one place that reads, continues and records a conversation's thread.

A conversation id is the LangGraph `thread_id` of the served graph (docs/serving.md "Threads"). For a
request, `ConversationThreads`:

- reads the thread: whose it is (`check_owner`: a conversation is shown to its owner only, serving/auth.py
  `key_owner`) and how many of the request's messages it has already (`known_messages`, from the digests
  of what its client has seen), so only the new ones go in;
- continues it: the episodes run under the thread's lock (requests on one thread take turns), choice 0 on
  the thread's own checkpointer, the others and a canary's shadow on a copy (`copy_thread`) that adds
  nothing to it;
- records it: the episode count (`count_episode`, which evicts the oldest conversations past capacity) and
  the messages the client has now seen (`record_answer`, committed before the request is answered).

The stores behind it (serving/conversations.py SQLite, serving/pg_conversations.py PostgreSQL) only keep
the rows and the checkpoints; the service (serving/service.py) and the episode runner
(serving/episodes.py) call this module for everything about a thread.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from teamtr.client.protocol import ChatMessage
from teamtr.serving.conversations import ConversationStore
from teamtr.serving.errors import APIError


def message_digest(role: str, name: str | None, content: str) -> str:
    """A chat message's fingerprint: the same message resent gives the same digest."""
    return hashlib.blake2b(repr((role, name, content)).encode(), digest_size=16).hexdigest()


def digests(messages: Sequence[ChatMessage]) -> list[str]:
    return [message_digest(m.role, m.name, m.text()) for m in messages]


def thread_config(thread_id: str) -> dict[str, Any]:
    """The run config that names a thread's latest checkpoint."""
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


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


async def copy_thread(saver: BaseCheckpointSaver, thread_id: str) -> InMemorySaver:
    """The thread's latest state in an in-memory saver of its own: an episode that sees the conversation
    without adding to it (a request's choices after the first, a canary's shadow)."""
    copy = InMemorySaver()
    found = await saver.aget_tuple(thread_config(thread_id))
    if found is not None:
        checkpoint = found.checkpoint
        await copy.aput(thread_config(thread_id), checkpoint, found.metadata, checkpoint["channel_versions"])
    return copy


class ConversationThreads:
    """Reads, continues and records the threads of a conversation store (the module's doc)."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    def check_owner(self, conversation_id: str, owner: str | None, must_exist: bool = False) -> None:
        """404, as for an unknown id, when the conversation is another key's (or unknown, if it
        `must_exist`: feedback; a chat request with an unknown id starts that thread)."""
        try:
            theirs = self.store.owner(conversation_id)
        except KeyError:
            if not must_exist:
                return
            theirs = None if owner else ""  # differs from any owner
        if theirs != owner:
            raise APIError(
                404,
                f"unknown conversation id {conversation_id!r}",
                param="conversation_id",
                code="conversation_not_found",
            )

    def known_messages(self, conversation_id: str, messages: list[ChatMessage], owner: str | None) -> int:
        """How many of the request's messages the thread (`owner`'s, or unknown) has already."""
        self.check_owner(conversation_id, owner)
        return known_in_thread(messages, self.store.seen(conversation_id))

    @asynccontextmanager
    async def continued(
        self, conversation_id: str, owner: str | None, n: int = 1
    ) -> AsyncIterator[list[BaseCheckpointSaver]]:
        """The checkpointers of a request's `n` episodes, held under the thread's lock for the block:
        choice 0 continues the thread; the others see it from a copy and add nothing to it."""
        async with self.store.thread_lock(conversation_id):
            self.check_owner(conversation_id, owner)  # a request of another key may have created it
            saver = await self.store.saver()
            yield [saver, *[await copy_thread(saver, conversation_id) for _ in range(1, n)]]

    async def record_answer(
        self, conversation_id: str, new_messages: Sequence[ChatMessage], answer: str, known: int
    ) -> None:
        """The thread continues from this answer: what the client sent new and the answer are what it has
        now seen (after the `known` messages it had); committed before this returns."""
        seen = [*digests(new_messages), message_digest("assistant", None, answer)]
        await self.store.add_seen(conversation_id, seen, known)

    async def count_episode(self, conversation_id: str, team: str, owner: str | None) -> None:
        """Count an episode of the conversation (created owned by `owner`), dropping the thread state of
        the conversations evicted to stay within the store's capacity."""
        await self.store.forget(self.store.add_episode(conversation_id, team, owner))

    def episodes(self, conversation_id: str) -> int:
        return self.store.episodes(conversation_id)
