"""Writes to a SQLite connection from one background thread, batched: concurrent requests share one
commit (a group commit), and none blocks the event loop on it (serving/conversations.py: its thread
messages).

`submit(write)` queues `write(db)` and returns a future that is done once the write is committed; the
writer thread runs every write queued by then in one transaction (one commit, however many requests).
A request that must not answer before its write is durable awaits that future. `settle()` waits until
every write submitted so far is committed: a reader calls it first, so it reads its own writes. A write
that fails is logged and does not stop the ones after it (its future carries the error).
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future

log = logging.getLogger(__name__)

Write = Callable[[sqlite3.Connection], None]


class BackgroundWriter:
    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, name: str = "sqlite-writer") -> None:
        """`db` must allow use from another thread (check_same_thread=False); `lock` guards it against the
        readers, which use it on their own threads."""
        self._db, self._lock = db, lock
        self._queue: queue.SimpleQueue[tuple[Write, Future[None]] | None] = queue.SimpleQueue()
        self._submitted = self._committed = 0
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, write: Write) -> Future[None]:
        done: Future[None] = Future()
        with self._progress:
            self._submitted += 1
        self._queue.put((write, done))
        return done

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
            errors = self._commit([w for w, _ in batch])
            for (_, done), error in zip(batch, errors, strict=True):
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)
            with self._progress:
                self._committed += len(batch)
                self._progress.notify_all()
            if stop:
                return

    def _commit(self, batch: list[Write]) -> list[Exception | None]:
        """Each write's error (None: committed)."""
        with self._lock:
            try:
                # one transaction, one commit for the batch; IMMEDIATE takes the write lock first (waiting up
                # to the connection's timeout): a deferred one that reads and then writes gets "database is
                # locked" at once when another connection to the file is writing
                self._db.execute("BEGIN IMMEDIATE")
                errors = [self._savepoint(write) for write in batch]
                self._db.commit()
                return errors
            except sqlite3.Error as e:
                self._db.rollback()
                log.exception("committing %d queued writes failed", len(batch))
                return [e] * len(batch)

    def _savepoint(self, write: Write) -> Exception | None:
        """One write inside the batch's transaction; a failing one is rolled back alone."""
        self._db.execute("SAVEPOINT one_write")
        try:
            write(self._db)
            return None
        except Exception as e:
            self._db.execute("ROLLBACK TO one_write")
            log.exception("a queued write failed")
            return e
        finally:
            self._db.execute("RELEASE one_write")
