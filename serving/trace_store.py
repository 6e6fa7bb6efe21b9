"""The span store: an OpenTelemetry `SpanExporter` that needs no collector, in a local SQLite file or, for
several replicas, in the shared PostgreSQL store (serving/pg_store.py, same table and columns).

One row per finished span, attributes as JSON. `teamtr traces`, `teamtr improve` and GET /admin/episodes
read it back (`read_spans`), given a file path or a postgresql:// URL.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from teamtr.serving.pg_store import PgStore, is_database_url, redacted

SCHEMA = """
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT,
    name TEXT NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status TEXT NOT NULL,
    conversation_id TEXT,
    operation TEXT,
    attributes TEXT NOT NULL,
    resource TEXT NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_by_conversation ON spans (conversation_id);
CREATE INDEX IF NOT EXISTS spans_by_operation ON spans (operation, start_ns);
"""


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


def _attributes_to_json(attributes: Any) -> str:
    # OTel attribute values are str/bool/int/float or tuples of them; JSON keeps floats exactly (repr).
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()})


def _row(s: ReadableSpan) -> tuple[Any, ...]:
    """A finished span as a row of the `spans` table (both stores)."""
    ctx = s.get_span_context()
    attrs = dict(s.attributes or {})
    return (
        format(ctx.trace_id, "032x"),
        format(ctx.span_id, "016x"),
        format(s.parent.span_id, "016x") if s.parent else None,
        s.name,
        s.start_time or 0,
        s.end_time or 0,
        s.status.status_code.name,
        attrs.get("gen_ai.conversation.id"),
        attrs.get("gen_ai.operation.name"),
        _attributes_to_json(attrs),
        _attributes_to_json(s.resource.attributes if s.resource else {}),
    )


class SQLiteSpanExporter(SpanExporter):
    """Writes finished spans to a SQLite file; safe to call from the batch processor's thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # a commit is in the WAL file before export returns: a killed process loses nothing committed
        # (NORMAL skips the fsync per commit, so only an OS crash could lose the last commits)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        rows = [_row(s) for s in spans]
        with self._lock:
            if self._closed:
                return SpanExportResult.FAILURE
            self._db.executemany("INSERT OR REPLACE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
            self._db.commit()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class PostgresSpanExporter(SpanExporter):
    """Writes finished spans to the shared store's `spans` table: every replica's spans in one place, so
    `teamtr improve` and `teamtr traces` read all the traffic. Committed before export returns."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        rows = [_row(s) for s in spans]
        with self.store.connection() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO spans VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (trace_id, span_id) DO NOTHING",
                rows,
            )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._closed = True  # the store's pool belongs to the server, which closes it

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_COLUMNS = "trace_id, span_id, parent_span_id, name, start_ns, end_ns, status, attributes"


def read_spans(
    path: str | Path, operation: str | None = None, since_ns: int = 0
) -> Iterator[StoredSpan]:
    """Spans of a store (a SQLite file, or a postgresql:// URL) in start order, optionally only those of
    one `gen_ai.operation.name`, started at or after `since_ns`."""
    with open_store(path) as db:
        query = f"SELECT {_COLUMNS} FROM spans WHERE start_ns >= ?"
        args: tuple = (since_ns,)
        if operation is not None:
            query += " AND operation = ?"
            args += (operation,)
        for row in db.execute(query + " ORDER BY start_ns, span_id", args):
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
def open_store(path: str | Path) -> Iterator[Any]:
    """A read-only connection to a span store (a SQLite file, or a postgresql:// URL), queried with `?`
    marks; FileNotFoundError when there is none."""
    if is_database_url(path):
        import psycopg

        try:
            conn = psycopg.connect(str(path), autocommit=True)
        except psycopg.OperationalError as e:
            raise FileNotFoundError(f"no span store at {redacted(str(path))}: {e}") from None
        with conn:
            yield _QmarkConnection(conn)
        return
    if not Path(path).is_file():
        raise FileNotFoundError(f"no span store at {path}")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        yield db
    finally:
        db.close()
