"""The shared store of several `teamtr serve` replicas: one PostgreSQL database (`--db postgresql://...`).

What one server keeps in local files (SQLite, JSONL) lives here in tables, so any replica behind a load
balancer can serve any request (docs/scale.md "Several API replicas"):

    conversations, seen_messages   serving/pg_conversations.py (the SQLite schema, same columns)
    checkpoint_*                   LangGraph's PostgreSQL checkpointer (langgraph-checkpoint-postgres)
    spans                          serving/trace_store.py `PostgresSpanExporter` (the SQLite schema)
    promotion_events               serving/promotion_log.py `SharedPromotionLog` (one row per event)

`PgStore` owns the synchronous connection pool the tables are written through and creates the schema
once per database: the first replica to start creates it under an advisory lock, so two replicas starting
together do not race on `CREATE TABLE` or on the checkpointer's migrations.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

SCHEMES = ("postgresql://", "postgres://")

# advisory lock keys (pg_advisory_lock's one-bigint form); thread locks hash the thread id instead
SCHEMA_LOCK = 7_350_001
ADMIN_LOCK = 7_350_002

def _schema() -> str:
    """The SQLite stores' tables (the same columns, so both backends read and write the same rows) in
    PostgreSQL's types, and the promotion log's table."""
    from teamtr.serving.conversations import SCHEMA as CONVERSATIONS
    from teamtr.serving.trace_store import SCHEMA as SPANS

    shared = (CONVERSATIONS + SPANS).replace("INTEGER", "BIGINT").replace("REAL", "DOUBLE PRECISION")
    return shared + "CREATE TABLE IF NOT EXISTS promotion_events (seq BIGSERIAL PRIMARY KEY, record TEXT NOT NULL);"


class StoreError(RuntimeError):
    """The shared database cannot be reached or set up; the message names it (without its password)."""


def is_database_url(store: object) -> bool:
    """A PostgreSQL URL (the shared store) rather than a SQLite file path."""
    return isinstance(store, str) and store.startswith(SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(url)
    except Exception:
        return url.split("@")[-1]
    return f"postgresql://{parts.get('user', '')}@{parts.get('host', '')}:{parts.get('port', '')}/" + str(
        parts.get("dbname", "")
    )


class PgStore:
    """A pool of synchronous connections to the shared database, the schema created on first open.

    Connections are autocommit: each statement is its own transaction unless `transaction()` groups
    them. Safe to use from any thread (the pool hands each caller its own connection)."""

    def __init__(self, url: str, max_size: int = 8) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        if not is_database_url(url):
            raise StoreError(f"--db must be a postgresql:// URL, got {url!r}")
        self.url = url
        try:  # one plain connection first: a refused or rejected one is reported now, with the reason
            psycopg.connect(url, connect_timeout=10).close()
        except psycopg.Error as e:
            raise StoreError(f"cannot connect to the shared store {redacted(url)}: {e}") from None
        self._pool = ConnectionPool(
            url, min_size=1, max_size=max_size, kwargs={"autocommit": True}, open=False, name="teamtr-store"
        )
        try:
            self._pool.open(wait=True, timeout=30)
        except Exception as e:
            raise StoreError(f"cannot connect to the shared store {redacted(url)}: {e}") from None
        self._closed = threading.Event()
        self._create_schema()

    def _create_schema(self) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row, tuple_row

        with self.connection() as conn:
            # tried, not waited for: a session blocked in pg_advisory_lock is a transaction in progress,
            # which the checkpointer's CREATE INDEX CONCURRENTLY in the holder waits for (a deadlock)
            deadline = time.monotonic() + 120
            while not conn.execute("SELECT pg_try_advisory_lock(%s)", (SCHEMA_LOCK,)).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise StoreError(f"{redacted(self.url)}: another server held the schema lock for 120 s")
                time.sleep(0.1)
            try:
                conn.execute(_schema())
                conn.row_factory = dict_row  # what the checkpointer's own setup reads rows as
                PostgresSaver(conn).setup()  # type: ignore[arg-type]
            finally:
                conn.row_factory = tuple_row  # the pool's default, for the next user
                conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK,))

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self._pool.connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A connection inside one transaction (committed at the end, rolled back on an error)."""
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    def getconn(self) -> Any:
        """A connection of the pool held until `putconn` (what a lock held across awaits needs)."""
        return self._pool.getconn()

    def putconn(self, conn: Any) -> None:
        self._pool.putconn(conn)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._pool.close()


@asynccontextmanager
async def shared_admin_lock(store: PgStore) -> AsyncIterator[None]:
    """The replicas' one admin lock (a session-level advisory lock), held for the block: one promotion,
    rollback or candidate change at a time across replicas. Taken on a worker thread: waiting for it
    must not stop the event loop."""
    conn = await asyncio.to_thread(store.getconn)
    try:
        await asyncio.to_thread(conn.execute, "SELECT pg_advisory_lock(%s)", (ADMIN_LOCK,))
        try:
            yield
        finally:
            await asyncio.to_thread(conn.execute, "SELECT pg_advisory_unlock(%s)", (ADMIN_LOCK,))
    finally:
        store.putconn(conn)
