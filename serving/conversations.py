"""The conversation table: conversation id -> its team, episode count and messages, in SQLite.

`/v1/feedback` needs to know a conversation (serving/service.py `feedback`), and a thread (a request
naming a conversation id, docs/serving.md "Threads") continues from the conversation's stored messages;
with a file (`conversations.db` under the serve directory, cli/server.py) both survive a restart.
Without a path the table lives in memory, as a plain `create_app` server needs. Writes are committed
by a background thread, batched (serving/sqlite_writer.py): a request never waits for a commit, and a
read first waits for the writes submitted before it.

A file that is not a readable SQLite database is reported (`ConversationStoreError`, naming the file)
and never written to: the server refuses to start rather than lose conversations.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from teamtr.serving.sqlite_writer import BackgroundWriter

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    episodes INTEGER NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_by_age ON conversations (updated);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    name TEXT,
    content TEXT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
"""


class ConversationStoreError(RuntimeError):
    """The conversation store's file cannot be read; it is left exactly as it was."""


@dataclass(frozen=True)
class StoredMessage:
    role: str  # user | assistant | system | ... (the chat API's roles)
    content: str
    name: str | None = None


class Conversations:
    """Conversation id -> episodes and messages, for the most recent `capacity` ids (oldest dropped)."""

    def __init__(self, capacity: int, path: str | Path | None = None) -> None:
        self.capacity = capacity
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._check_readable(self.path)
        self._db = sqlite3.connect(str(self.path) if self.path else ":memory:", check_same_thread=False)
        try:
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:  # e.g. a file that turned corrupt between check and open
            self._db.close()
            raise ConversationStoreError(f"conversation store {self.path} cannot be read: {e}") from None
        if self.path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")  # commits append to the log: no rewrite, fewer fsyncs
        self._writer = BackgroundWriter(self._db, self._lock, name="conversations-writer")

    @staticmethod
    def _check_readable(path: Path) -> None:
        """Opened read-only first, so a corrupt file is reported without a byte of it changing."""
        if not path.exists():
            return
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
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

    def add_episode(self, conversation_id: str, team: str = "") -> None:
        updated = time.time()

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO conversations VALUES (?, ?, 1, ?) ON CONFLICT(id) DO UPDATE SET "
                "episodes = episodes + 1, updated = excluded.updated",
                (conversation_id, team, updated),
            )
            self._evict()

        self._writer.submit(write)

    def append(self, conversation_id: str, messages: list[StoredMessage]) -> None:
        """Add messages to the end of the conversation's thread."""

        def write(db: sqlite3.Connection) -> None:
            (start,) = db.execute(
                "SELECT count(*) FROM messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
            db.executemany(
                "INSERT INTO messages VALUES (?, ?, ?, ?, ?)",
                [(conversation_id, start + i, m.role, m.name, m.content) for i, m in enumerate(messages)],
            )

        self._writer.submit(write)

    def history(self, conversation_id: str) -> list[StoredMessage]:
        """The thread's messages so far, oldest first (empty for an unknown id)."""
        self._writer.settle()
        with self._lock:
            rows = self._db.execute(
                "SELECT role, content, name FROM messages WHERE conversation_id = ? ORDER BY seq",
                (conversation_id,),
            ).fetchall()
        return [StoredMessage(role, content, name) for role, content, name in rows]

    def _evict(self) -> None:
        (count,) = self._db.execute("SELECT count(*) FROM conversations").fetchone()
        if count <= self.capacity:
            return
        old = [
            row[0]
            for row in self._db.execute(
                "SELECT id FROM conversations ORDER BY updated LIMIT ?", (count - self.capacity,)
            )
        ]
        self._db.executemany("DELETE FROM conversations WHERE id = ?", [(i,) for i in old])
        self._db.executemany("DELETE FROM messages WHERE conversation_id = ?", [(i,) for i in old])

    def __contains__(self, conversation_id: object) -> bool:
        self._writer.settle()
        with self._lock:
            row = self._db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row is not None

    def episodes(self, conversation_id: str) -> int:
        self._writer.settle()
        with self._lock:
            row = self._db.execute(
                "SELECT episodes FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return int(row[0])

    def close(self) -> None:
        self._writer.close()  # what is queued is committed first
        with self._lock:
            self._db.close()
