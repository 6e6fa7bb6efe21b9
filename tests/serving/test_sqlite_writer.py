"""Conversation writes leave the event loop (serving/sqlite_writer.py): a submit
returns before its commit with a future done at the commit, queued writes share one commit, a reader sees
every write submitted before it, a failing write is rolled back alone (its future carries the error),
closing commits what is queued, and a request's digests are committed once `add_seen` returns."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from teamtr.serving.conversations import Conversations
from teamtr.serving.sqlite_writer import BackgroundWriter
from teamtr.serving.threads import message_digest


def test_queued_writes_share_a_commit_and_readers_see_them(tmp_path):
    db = sqlite3.connect(str(tmp_path / "t.db"), check_same_thread=False)
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    db.commit()
    commits: list[str] = []
    db.set_trace_callback(lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
    lock, gate = threading.Lock(), threading.Event()
    writer = BackgroundWriter(db, lock)
    writer.submit(lambda d: gate.wait(10))  # holds the writer thread while the next writes queue up
    futures = [writer.submit(lambda d, k=k: d.execute("INSERT INTO t VALUES (?)", (k,))) for k in range(50)]
    duplicate = writer.submit(lambda d: d.execute("INSERT INTO t VALUES (0)"))  # a duplicate key: fails alone
    writer.submit(lambda d: d.execute("INSERT INTO t VALUES (50)"))
    assert not any(f.done() for f in futures)
    reader = sqlite3.connect(str(tmp_path / "t.db"))  # another connection sees committed rows only
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (0,)  # submitted, not yet committed
    gate.set()
    writer.settle()
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (51,)
    assert 1 <= len(commits) <= 2  # the gate's batch, then everything queued behind it
    assert all(f.result(0) is None for f in futures)
    with pytest.raises(sqlite3.IntegrityError):
        duplicate.result(0)
    writer.close()


def test_conversations_read_their_own_writes_and_survive_a_close(tmp_path):
    path = tmp_path / "conversations.db"
    store = Conversations(capacity=10, path=path)
    other = sqlite3.connect(str(path))  # another process's view: only what is committed

    async def episodes() -> None:
        for k in range(20):
            store.add_episode("c1", "team")
            await store.add_seen(
                "c1", [message_digest("user", None, f"q{k}"), message_digest("assistant", None, f"a{k}")]
            )
            committed = other.execute("SELECT count(*) FROM seen_messages WHERE conversation_id = 'c1'")
            assert committed.fetchone() == (2 * (k + 1),)  # durable once add_seen returns

    asyncio.run(episodes())
    other.close()
    assert store.episodes("c1") == 20
    assert store.seen("c1")[-2:] == [
        message_digest("user", None, "q19"),
        message_digest("assistant", None, "a19"),
    ]
    store.add_episode("c2", "team", owner="k1")
    asyncio.run(store.add_seen("c2", ["d"]))
    store.close()
    reopened = Conversations(capacity=10, path=path)
    assert "c2" in reopened and reopened.seen("c2") == ["d"] and reopened.owner("c2") == "k1"
    assert reopened.episodes("c1") == 20 and len(reopened.seen("c1")) == 40
    reopened.close()
