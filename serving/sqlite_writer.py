"""Writes to a SQLite connection from one background thread, batched, so that a request never waits for
a commit (serving/conversations.py: its episode counts and thread messages).

`submit(write)` queues `write(db)` and returns at once; the writer thread runs every write queued by then
in one transaction (one commit, however many requests). `settle()` waits until every write submitted so
far is committed: a reader calls it first, so it reads its own writes. A write that fails is logged and
does not stop the ones after it. A process killed between a submit and its commit loses that write.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Write = Callable[[sqlite3.Connection], None]


class BackgroundWriter:
    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, name: str = "sqlite-writer") -> None:
        """`db` must allow use from another thread (check_same_thread=False); `lock` guards it against the
        readers, which use it on their own threads."""
        self._db, self._lock = db, lock
        self._queue: queue.SimpleQueue[Write | None] = queue.SimpleQueue()
        self._submitted = self._committed = 0
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, write: Write) -> None:
        with self._progress:
            self._submitted += 1
        self._queue.put(write)

    def settle(self, timeout_s: float = 60.0) -> None:
        """Return once every write submitted before this call is committed (or failed)."""
        with self._progress:
            target = self._submitted
            self._progress.wait_for(lambda: self._committed >= target, timeout=timeout_s)

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            writes = [self._queue.get()]
            while not self._queue.empty():  # everything queued meanwhile goes into the same commit
                writes.append(self._queue.get())
            stop = None in writes
            batch = [w for w in writes if w is not None]
            self._commit(batch)
            with self._progress:
                self._committed += len(batch)
                self._progress.notify_all()
            if stop:
                return

    def _commit(self, batch: list[Write]) -> None:
        with self._lock:
            try:
                # one transaction, one commit for the batch; IMMEDIATE takes the write lock first (waiting up
                # to the connection's timeout): a deferred one that reads and then writes gets "database is
                # locked" at once when another connection to the file is writing
                self._db.execute("BEGIN IMMEDIATE")
                for write in batch:
                    self._savepoint(write)
                self._db.commit()
            except sqlite3.Error:
                self._db.rollback()
                log.exception("committing %d queued writes failed", len(batch))

    def _savepoint(self, write: Write) -> None:
        """One write inside the batch's transaction; a failing one is rolled back alone."""
        self._db.execute("SAVEPOINT one_write")
        try:
            write(self._db)
        except Exception:
            self._db.execute("ROLLBACK TO one_write")
            log.exception("a queued write failed")
        finally:
            self._db.execute("RELEASE one_write")
