"""Conversations and their threads: a LangGraph checkpointer holds each thread's graph state; a table
holds each conversation's team, episode count and what its client has seen, in one SQLite file.

A conversation id is the LangGraph `thread_id` of the served graph: an episode of a thread runs on the
state the thread's last episode left (graphs/capture.py `run_episode`, docs/serving.md "Threads"), so the
team sees the real conversation. The state is the only copy of the messages: the `conversations` table
keeps, besides the team and episode count `/v1/feedback` needs (serving/service.py `feedback`), only a
digest of each chat message the client has sent or received, so a client that resends the whole
conversation is recognised and its old messages are not added twice.

With a file (`conversations.db` under the serve directory, serving/server.py) the table lives in it and the
checkpoints (`AsyncSqliteSaver`, langgraph-checkpoint-sqlite) beside it in `conversations-threads.db`
(`threads_path`): one connection per file, because a checkpointer read left open across an episode's
awaits held a lock that made the table's writes fail with "database is locked". Both survive a restart;
without a file both live in memory (`InMemorySaver`), as a plain `create_app` server needs. A file that is
not a readable SQLite database is reported (`ConversationStoreError`, naming the file) and never written
to: the server refuses to start rather than lose conversations. The seen-message digests are committed
by a background thread, batched across requests (serving/sqlite_writer.py), and a request's answer
waits for its commit: what a client was answered survives a kill, so its resent history is recognised.

Each conversation records its owner (serving/auth.py `key_owner`, a digest of the key that created it;
None on an open chat API). What a request reads from and records in its thread (owner checks, seen
digests, copies of the state): serving/threads.py, the one owner of a request's thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from teamtr.serving.sqlite_writer import BackgroundWriter

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    episodes INTEGER NOT NULL,
    updated REAL NOT NULL,
    owner TEXT
);
CREATE INDEX IF NOT EXISTS conversations_by_age ON conversations (updated);
CREATE TABLE IF NOT EXISTS seen_messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
"""


# how long a connection waits for a lock on its file (sqlite's default of 5 s is short on a loaded machine)
BUSY_TIMEOUT_S = 30.0


def threads_path(path: str | Path) -> Path:
    """The checkpointer's file beside the conversation table's: conversations.db -> conversations-threads.db."""
    path = Path(path)
    return path.with_name(f"{path.stem}-threads{path.suffix}")


class ConversationStoreError(RuntimeError):
    """The conversation store's file cannot be read; it is left exactly as it was."""


class ConversationStore:
    """What the service and the episode runner need of a conversation store, whatever holds it: this
    module's SQLite `Conversations` (one server), or serving/pg_conversations.py's PostgreSQL one (several
    replicas sharing the conversations). A backend gives the checkpointer (`saver`) and the table
    (`add_episode`, `owner`, `add_seen`, `seen`, `episodes`, `in`); the thread lock and eviction of thread
    state are the same for both, here. What a request does with its thread: serving/threads.py."""

    capacity: int

    def __init__(self) -> None:
        self._threads: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def saver(self) -> BaseCheckpointSaver:
        raise NotImplementedError

    def add_episode(self, conversation_id: str, team: str = "", owner: str | None = None) -> list[str]:
        raise NotImplementedError

    def owner(self, conversation_id: str) -> str | None:
        raise NotImplementedError

    async def add_seen(self, conversation_id: str, digests: Sequence[str], start: int | None = None) -> None:
        raise NotImplementedError

    def seen(self, conversation_id: str) -> list[str]:
        raise NotImplementedError

    def episodes(self, conversation_id: str) -> int:
        raise NotImplementedError

    def __contains__(self, conversation_id: object) -> bool:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    def thread_lock(self, thread_id: str) -> AbstractAsyncContextManager[Any]:
        """Held while an episode runs on the thread: requests on one thread take turns (in this
        process; a shared store's backend makes them take turns across replicas too)."""
        lock = self._threads.get(thread_id)
        if lock is None:
            lock = self._threads[thread_id] = asyncio.Lock()
        return lock

    async def forget(self, conversation_ids: Sequence[str]) -> None:
        """Drop evicted conversations' thread state."""
        if conversation_ids:
            saver = await self.saver()
            for conversation_id in conversation_ids:
                await saver.adelete_thread(conversation_id)


class Conversations(ConversationStore):
    """Conversation id -> thread state, episodes and seen messages, for the most recent `capacity` ids
    (the oldest dropped, their checkpoints with them)."""

    def __init__(self, capacity: int, path: str | Path | None = None) -> None:
        self.capacity = capacity
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._check_readable(self.path)
            self._check_readable(threads_path(self.path))
        self._db = sqlite3.connect(
            str(self.path) if self.path else ":memory:", check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        try:
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError as e:  # e.g. a file that turned corrupt between check and open
            self._db.close()
            raise ConversationStoreError(f"conversation store {self.path} cannot be read: {e}") from None
        self._writer = BackgroundWriter(self._db, self._lock, name="conversations-writer")
        self._saver: BaseCheckpointSaver | None = None
        super().__init__()

    @staticmethod
    def _check_readable(path: Path) -> None:
        """Opened read-only first, so a corrupt file is reported without a byte of it changing."""
        if not path.exists():
            return
        journal = path.with_name(path.name + "-journal")
        # a hot journal (a process killed mid-transaction) is rolled back by the first writable connection:
        # SQLite's own recovery of a sound file, which a read-only one cannot do
        uri = f"file:{path}" if journal.exists() else f"file:{path}?mode=ro"
        try:
            db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
            try:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
                (ok,) = db.execute("PRAGMA quick_check").fetchone()
            finally:
                db.close()
        except sqlite3.DatabaseError as e:
            ok = str(e)
        if ok != "ok":
            raise ConversationStoreError(
                f"conversation store {path} is corrupt ({ok}); it was left untouched: move it away to "
                "start with no stored conversations"
            )

    # ---- thread state (the LangGraph checkpointer) ---------------------------------------------------

    async def saver(self) -> BaseCheckpointSaver:
        """The checkpointer of every thread, opened on first use (aiosqlite binds to the running loop)."""
        if self._saver is None:
            if self.path is None:
                self._saver = InMemorySaver()
            else:
                import aiosqlite
                from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

                db = await aiosqlite.connect(str(threads_path(self.path)), timeout=BUSY_TIMEOUT_S)
                saver = AsyncSqliteSaver(db)
                await saver.setup()
                if self._saver is None:  # another request opened it meanwhile: keep that one
                    self._saver = saver
                else:
                    await saver.conn.close()
        return self._saver

    # ---- the table ------------------------------------------------------------------------------------

    def add_episode(self, conversation_id: str, team: str = "", owner: str | None = None) -> list[str]:
        """Count an episode of the conversation (created owned by `owner`); returns the ids evicted to stay
        within `capacity` (their thread state is for `forget`)."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO conversations VALUES (?, ?, 1, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                "episodes = episodes + 1, updated = excluded.updated",
                (conversation_id, team, time.time(), owner),
            )
            return self._evict()

    def owner(self, conversation_id: str) -> str | None:
        """Who created the conversation (KeyError for an unknown id); add_episode writes it at once."""
        with self._lock:
            row = self._db.execute("SELECT owner FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return row[0]

    async def add_seen(self, conversation_id: str, digests: Sequence[str], start: int | None = None) -> None:
        """Record messages the client has now seen in the conversation (its own and the answer), from
        position `start` on (default: after the last; what was recorded from there on is replaced: the
        client never saw it); returns once committed, batched with other requests' writes (a
        conversation evicted meanwhile gets none)."""
        digests = list(digests)

        def write(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
                return
            (count,) = db.execute(
                "SELECT count(*) FROM seen_messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
            at = count if start is None else min(start, count)
            db.execute("DELETE FROM seen_messages WHERE conversation_id = ? AND seq >= ?", (conversation_id, at))
            db.executemany(
                "INSERT INTO seen_messages VALUES (?, ?, ?)",
                [(conversation_id, at + i, d) for i, d in enumerate(digests)],
            )

        await asyncio.wrap_future(self._writer.submit(write))

    def seen(self, conversation_id: str) -> list[str]:
        """The digests of the conversation's messages so far, oldest first (empty for an unknown id)."""
        self._writer.settle()
        with self._lock:
            rows = self._db.execute(
                "SELECT digest FROM seen_messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,)
            ).fetchall()
        return [d for (d,) in rows]

    def _evict(self) -> list[str]:
        (count,) = self._db.execute("SELECT count(*) FROM conversations").fetchone()
        if count <= self.capacity:
            return []
        old = [
            row[0]
            for row in self._db.execute(
                "SELECT id FROM conversations ORDER BY updated LIMIT ?", (count - self.capacity,)
            )
        ]
        self._db.executemany("DELETE FROM conversations WHERE id = ?", [(i,) for i in old])
        self._db.executemany("DELETE FROM seen_messages WHERE conversation_id = ?", [(i,) for i in old])
        return old

    def __contains__(self, conversation_id: object) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row is not None

    def episodes(self, conversation_id: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT episodes FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return int(row[0])

    async def aclose(self) -> None:
        """Close the checkpointer's connection (on the loop that used it), then the table."""
        conn = getattr(self._saver, "conn", None)
        if conn is not None:
            await conn.close()
        self.close()

    def close(self) -> None:
        self._writer.close()  # what is queued is committed first
        with self._lock:
            self._db.close()
