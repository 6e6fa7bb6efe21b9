"""A local SQLite span store: an OpenTelemetry `SpanExporter` that needs no collector.

One row per finished span, attributes as JSON. `teamtr traces to-trajectories` reads it back.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_SCHEMA = """
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
        self._db.executescript(_SCHEMA)
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        rows = []
        for s in spans:
            ctx = s.get_span_context()
            attrs = dict(s.attributes or {})
            rows.append(
                (
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
            )
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


def read_spans(path: str | Path, operation: str | None = None) -> Iterator[StoredSpan]:
    """Spans of a store in start order, optionally only those of one `gen_ai.operation.name`."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no span store at {path}")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        query = (
            "SELECT trace_id, span_id, parent_span_id, name, start_ns, end_ns, status, attributes FROM spans"
        )
        args: tuple = ()
        if operation is not None:
            query += " WHERE operation = ?"
            args = (operation,)
        for row in db.execute(query + " ORDER BY start_ns, span_id", args):
            *head, attributes = row
            yield StoredSpan(*head, attributes=json.loads(attributes))
    finally:
        db.close()
