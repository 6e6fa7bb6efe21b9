"""Conversations in the shared PostgreSQL store (serving/pg_store.py): what serving/conversations.py keeps
in SQLite, readable and writable by every replica, so a conversation started on one replica continues on
another with its whole history.

- Threads: LangGraph's `AsyncPostgresSaver` over an async connection pool (its tables are created once by
  `PgStore`).
- The table: the same `conversations` and `seen_messages` rows as the SQLite store, written through the
  store's synchronous pool. `add_seen` commits before the request is answered, as the SQLite store's group
  commit does: what a client was answered survives the replica that answered it.
- Requests on one thread take turns across replicas: `thread_lock` holds the thread's advisory lock
  (pg_advisory_lock on a hash of its id) for the episode, after the process's own lock (so requests
  queued in one process wait without holding a connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from teamtr.serving.conversations import ConversationStore
from teamtr.serving.pg_store import PgStore

# connections that hold thread locks at once (an episode on a thread holds one while it runs); more
# episodes on distinct threads wait for one
THREAD_LOCK_CONNECTIONS = 32


class PgConversations(ConversationStore):
    """Conversation id -> thread state, episodes and seen messages in PostgreSQL, for the most recent
    `capacity` ids (as serving/conversations.py `Conversations`)."""

    def __init__(self, capacity: int, store: PgStore) -> None:
        super().__init__()
        self.capacity, self.store = capacity, store
        self._saver: BaseCheckpointSaver | None = None
        self._pools: list[Any] = []  # async pools, bound to the loop that opened them
        self._lock_pool: Any = None
        self._opening = asyncio.Lock()

    async def _async_pool(self, max_size: int, row_factory: Any = None) -> Any:
        from psycopg_pool import AsyncConnectionPool

        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0}
        if row_factory is not None:
            kwargs["row_factory"] = row_factory
        pool = AsyncConnectionPool(self.store.url, min_size=1, max_size=max_size, kwargs=kwargs, open=False)
        await pool.open(wait=True, timeout=30)
        self._pools.append(pool)
        return pool

    async def saver(self) -> BaseCheckpointSaver:
        """LangGraph's PostgreSQL checkpointer, opened on first use (its pool binds to the running loop)."""
        async with self._opening:
            if self._saver is None:
                from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
                from psycopg.rows import dict_row

                self._saver = AsyncPostgresSaver(await self._async_pool(16, dict_row))
        return self._saver

    def thread_lock(self, thread_id: str) -> AbstractAsyncContextManager[Any]:
        return self._thread_lock(thread_id)

    @asynccontextmanager
    async def _thread_lock(self, thread_id: str) -> AsyncIterator[None]:
        async with super().thread_lock(thread_id):
            async with self._opening:
                if self._lock_pool is None:
                    self._lock_pool = await self._async_pool(THREAD_LOCK_CONNECTIONS)
            async with self._lock_pool.connection() as conn:
                await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (thread_id,))
                try:
                    yield
                finally:
                    await conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (thread_id,))

    # ---- the table ------------------------------------------------------------------------------------

    def add_episode(self, conversation_id: str, team: str = "", owner: str | None = None) -> list[str]:
        import time

        with self.store.transaction() as db:
            (created,) = db.execute(
                "INSERT INTO conversations VALUES (%s, %s, 1, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "episodes = conversations.episodes + 1, updated = excluded.updated RETURNING (xmax = 0)",
                (conversation_id, team, time.time(), owner),
            ).fetchone()
            # only a new conversation can take the table over capacity: the count (a scan in PostgreSQL)
            # is not paid by every episode of a continuing one
            return self._evict(db) if created else []

    def _evict(self, db: Any) -> list[str]:
        (count,) = db.execute("SELECT count(*) FROM conversations").fetchone()
        if count <= self.capacity:
            return []
        old = [
            row[0]
            for row in db.execute(
                "DELETE FROM conversations WHERE id IN (SELECT id FROM conversations ORDER BY updated "
                "LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id",
                (count - self.capacity,),
            )
        ]
        db.execute("DELETE FROM seen_messages WHERE conversation_id = ANY(%s)", (old,))
        return old

    def owner(self, conversation_id: str) -> str | None:
        with self.store.connection() as db:
            row = db.execute("SELECT owner FROM conversations WHERE id = %s", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return row[0]

    async def add_seen(self, conversation_id: str, digests: Sequence[str], start: int | None = None) -> None:
        """As `Conversations.add_seen`: committed before this returns (on a worker thread, off the loop)."""
        digests = list(digests)

        def write() -> None:
            with self.store.transaction() as db:
                found = db.execute(
                    "SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,)
                ).fetchone()
                if found is None:  # evicted meanwhile
                    return
                (count,) = db.execute(
                    "SELECT count(*) FROM seen_messages WHERE conversation_id = %s", (conversation_id,)
                ).fetchone()
                at = count if start is None else min(start, count)
                db.execute(
                    "DELETE FROM seen_messages WHERE conversation_id = %s AND seq >= %s", (conversation_id, at)
                )
                with db.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO seen_messages VALUES (%s, %s, %s)",
                        [(conversation_id, at + i, d) for i, d in enumerate(digests)],
                    )

        await asyncio.to_thread(write)

    def seen(self, conversation_id: str) -> list[str]:
        with self.store.connection() as db:
            rows = db.execute(
                "SELECT digest FROM seen_messages WHERE conversation_id = %s ORDER BY seq", (conversation_id,)
            ).fetchall()
        return [d for (d,) in rows]

    def episodes(self, conversation_id: str) -> int:
        with self.store.connection() as db:
            row = db.execute("SELECT episodes FROM conversations WHERE id = %s", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return int(row[0])

    def __contains__(self, conversation_id: object) -> bool:
        with self.store.connection() as db:
            row = db.execute("SELECT 1 FROM conversations WHERE id = %s", (conversation_id,)).fetchone()
        return row is not None

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.close()
        self._pools.clear()
        self.close()

    def close(self) -> None:
        """The store's pool is the server's (closed with it); nothing of this object's own is left."""
