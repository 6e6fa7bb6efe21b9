"""The span store read back: the one module that queries it (serving/trace_store.py writes it).

A store is a SQLite file or a postgresql:// URL (the replicas' shared store, serving/pg_store.py); both
hold the same `spans` table and are read with the same query text. Each function is named after what it
returns, in start order (start_ns, then span_id), as `StoredSpan`s with their attributes parsed:

    stored_spans     every span, or those of one operation, started at or after a time
    episode_spans    episode (`invoke_agent`) spans, by conversation prefix and start window
    turn_spans       the turn (`chat`) spans of some traces
    feedback_spans   feedback spans

What the spans mean (episodes, turns, rewards) is for the readers above this one: serving/tracing.py
(trajectories), serving/served_episodes.py (what `teamtr improve` reads), serving/trace_query.py
(`teamtr traces`). A store that does not exist raises FileNotFoundError.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teamtr.serving.pg_store import is_database_url, redacted
from teamtr.serving.trace_store import OP_AGENT, OP_CHAT, OP_FEEDBACK


@dataclass
class StoredSpan:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    status: str
    attributes: dict[str, Any]


_COLUMNS = "trace_id, span_id, parent_span_id, name, start_ns, end_ns, status, attributes"
_IN_START_ORDER = " ORDER BY start_ns, span_id"
_MAX_PARAMETERS = 500  # ids bound per query: under SQLite's limit on bound parameters


def stored_spans(store: str | Path, operation: str | None = None, since_ns: int = 0) -> Iterator[StoredSpan]:
    """Spans of a store, optionally only those of one `gen_ai.operation.name`, started at or after
    `since_ns`."""
    query = f"SELECT {_COLUMNS} FROM spans WHERE start_ns >= ?"
    args: list[Any] = [since_ns]
    if operation is not None:
        query += " AND operation = ?"
        args.append(operation)
    with _open(store) as db:
        yield from _spans(db.execute(query + _IN_START_ORDER, args))


def episode_spans(
    store: str | Path,
    *,
    conversation_prefix: str | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
) -> list[StoredSpan]:
    """Episode spans whose conversation id starts with `conversation_prefix`, started at or after
    `since_ns` and before `until_ns` (None: any)."""
    query = f"SELECT {_COLUMNS} FROM spans WHERE operation = ?"
    args: list[Any] = [OP_AGENT]
    if conversation_prefix is not None:
        query += " AND substr(conversation_id, 1, ?) = ?"
        args += [len(conversation_prefix), conversation_prefix]
    if since_ns is not None:
        query += " AND start_ns >= ?"
        args.append(since_ns)
    if until_ns is not None:
        query += " AND start_ns < ?"
        args.append(until_ns)
    with _open(store) as db:
        return list(_spans(db.execute(query + _IN_START_ORDER, args)))


def turn_spans(store: str | Path, trace_ids: Iterable[str]) -> list[StoredSpan]:
    """The turn spans of the traces `trace_ids` (each episode's turns are its children)."""
    ids = sorted(set(trace_ids))
    out: list[StoredSpan] = []
    if not ids:
        return out
    with _open(store) as db:
        for start in range(0, len(ids), _MAX_PARAMETERS):
            chunk = ids[start : start + _MAX_PARAMETERS]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT {_COLUMNS} FROM spans WHERE operation = ? AND trace_id IN ({marks})"
            out += _spans(db.execute(query + _IN_START_ORDER, [OP_CHAT, *chunk]))
    return out


def feedback_spans(store: str | Path) -> list[StoredSpan]:
    """Every feedback span (the latest of a conversation's is its reward)."""
    return list(stored_spans(store, OP_FEEDBACK))


def _spans(rows: Iterable[Sequence[Any]]) -> Iterator[StoredSpan]:
    for row in rows:
        *head, attributes = row
        yield StoredSpan(*head, attributes=json.loads(attributes))


class _QmarkConnection:
    """A PostgreSQL connection that takes SQLite's `?` parameter marks, so one query text reads both
    stores (the span queries hold no other `?` or `%`)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, query: str, args: Sequence[Any] = ()) -> Any:
        return self._conn.execute(query.replace("?", "%s"), tuple(args))


@contextmanager
def _open(store: str | Path) -> Iterator[Any]:
    """A read-only connection to a span store, queried with `?` marks; FileNotFoundError when there is
    none."""
    if is_database_url(store):
        import psycopg

        try:
            conn = psycopg.connect(str(store), autocommit=True)
        except psycopg.OperationalError as e:
            raise FileNotFoundError(f"no span store at {redacted(str(store))}: {e}") from None
        with conn:
            yield _QmarkConnection(conn)
        return
    if not Path(store).is_file():
        raise FileNotFoundError(f"no span store at {store}")
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        yield db
    finally:
        db.close()
