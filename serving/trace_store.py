"""The span store: an OpenTelemetry `SpanExporter` that needs no collector, in a local SQLite file or, for
several replicas, in the shared PostgreSQL store (serving/pg_store.py, same table and columns).

One row per finished span, attributes as JSON. `teamtr traces`, `teamtr improve` and GET /admin/episodes
read it back through serving/span_reader.py, the one module that queries it, given a file path or a
postgresql:// URL.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from teamtr.serving.pg_store import PgStore

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

# what the `operation` column holds (`gen_ai.operation.name`): an episode, one of its turns, a feedback
OP_AGENT, OP_CHAT, OP_FEEDBACK = "invoke_agent", "chat", "feedback"


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
