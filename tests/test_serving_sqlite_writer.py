"""Conversation writes leave the request path (issue 16, item 5; serving/sqlite_writer.py): a submit
returns before its commit, queued writes share one commit, a reader sees every write submitted before it,
a failing write is rolled back alone, and closing commits what is queued."""

from __future__ import annotations

import sqlite3
import threading

from teamtr.serving.conversations import Conversations, message_digest
from teamtr.serving.sqlite_writer import BackgroundWriter


def test_queued_writes_share_a_commit_and_readers_see_them(tmp_path):
    db = sqlite3.connect(str(tmp_path / "t.db"), check_same_thread=False)
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    db.commit()
    commits: list[str] = []
    db.set_trace_callback(lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
    lock, gate = threading.Lock(), threading.Event()
    writer = BackgroundWriter(db, lock)
    writer.submit(lambda d: gate.wait(10))  # holds the writer thread while the next writes queue up
    for k in range(50):
        writer.submit(lambda d, k=k: d.execute("INSERT INTO t VALUES (?)", (k,)))
    writer.submit(lambda d: d.execute("INSERT INTO t VALUES (0)"))  # a duplicate key: fails alone
    writer.submit(lambda d: d.execute("INSERT INTO t VALUES (50)"))
    reader = sqlite3.connect(str(tmp_path / "t.db"))  # another connection sees committed rows only
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (0,)  # submitted, not yet committed
    gate.set()
    writer.settle()
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (51,)
    assert 1 <= len(commits) <= 2  # the gate's batch, then everything queued behind it
    writer.close()


def test_conversations_read_their_own_writes_and_survive_a_close(tmp_path):
    path = tmp_path / "conversations.db"
    store = Conversations(capacity=10, path=path)
    for k in range(20):
        store.add_episode("c1", "team")
        store.add_seen(
            "c1", [message_digest("user", None, f"q{k}"), message_digest("assistant", None, f"a{k}")]
        )
    assert store.episodes("c1") == 20
    assert store.seen("c1")[-2:] == [
        message_digest("user", None, "q19"),
        message_digest("assistant", None, "a19"),
    ]
    store.add_episode("c2", "team")
    store.add_seen("c2", ["d"])
    store.close()  # the queued write is committed before the file closes
    reopened = Conversations(capacity=10, path=path)
    assert "c2" in reopened and reopened.seen("c2") == ["d"]
    assert reopened.episodes("c1") == 20 and len(reopened.seen("c1")) == 40
    reopened.close()
