"""Nothing answered is lost (issue 27): the server is SIGKILLed at random moments while clients continue
their threads, and after every restart each answered episode is in the span store with all its turns,
each thread's seen-message digests are exactly what its client was answered (at most one unanswered
exchange beyond), so resent histories are recognised and never appended twice, and the SQLite files
pass their integrity check. The server runs as `teamtr serve` does (cli/serve.py `_serve_forever`), in a
process forked from a forkserver that imported teamtr once (tests/support/killable_server.py)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from teamtr.engines.vllm_server import free_port
from teamtr.serving.conversations import threads_path
from teamtr.serving.server import ServeConfig
from teamtr.serving.span_reader import stored_spans
from teamtr.serving.threads import message_digest
from teamtr.serving.tracing import OP_AGENT, OP_CHAT, TASK_ID
from tests.support import killable_server
from tests.support.chat_load import ThreadLoad
from tests.support.serving import make_run_dir

KILLS = int(os.environ.get("TEAMTR_TEST_KILLS", "20"))
CLIENTS = 4
EXCHANGES_PER_THREAD = 3  # then a client starts a new thread (prompts stay small)


class Load(ThreadLoad):
    """The clients: each stops at the first request the kill cut off (the thread resends it next round)."""

    def __init__(self) -> None:
        super().__init__(CLIENTS, EXCHANGES_PER_THREAD)

    def client(self, url: str, stop: threading.Event, slot: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                thread, question, body = self.next_request(slot)
                try:
                    r = http.post("/v1/chat/completions", json=body, headers={"X-Conversation-Id": thread})
                except httpx.TransportError:
                    return  # killed: this request was never answered; the thread resends it next round
                assert r.status_code == 200, r.text
                self.record(thread, question, r.json())


def start(ctx, config: ServeConfig, url: str):
    process = ctx.Process(target=killable_server.serve, args=(config.model_dump_json(),), daemon=True)
    process.start()
    deadline = time.monotonic() + 300
    while True:
        assert process.is_alive(), "the server died while starting"
        assert time.monotonic() < deadline, "the server did not become healthy"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)


def check_durable(run: Path, load: Load) -> None:
    spans = list(stored_spans(run / "traces.db"))
    episodes = {
        s.attributes[TASK_ID]: s for s in spans if s.attributes.get("gen_ai.operation.name") == OP_AGENT
    }
    turns = Counter(
        (s.trace_id, s.parent_span_id) for s in spans if s.attributes.get("gen_ai.operation.name") == OP_CHAT
    )
    for completion, n_turns in load.answered.items():
        assert completion in episodes, f"answered episode {completion} is not in the span store"
        episode = episodes[completion]
        assert episode.status == "OK" and turns[(episode.trace_id, episode.span_id)] == n_turns
    db = sqlite3.connect(f"file:{run / 'conversations.db'}?mode=ro", uri=True)
    for thread, history in load.histories.items():
        seen = [
            d
            for (d,) in db.execute(
                "SELECT digest FROM seen_messages WHERE conversation_id = ? ORDER BY seq", (thread,)
            )
        ]
        answered = [message_digest(m["role"], None, m["content"]) for m in history]
        assert seen[: len(answered)] == answered, thread  # every answered exchange, in order, once
        assert len(seen) - len(answered) in (0, 2), thread  # at most the one exchange it was never answered
    db.close()
    for path in (run / "traces.db", run / "conversations.db", threads_path(run / "conversations.db")):
        if not path.exists():  # the threads' file opens with the first thread
            assert not load.answered
            continue
        check = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",), path
        check.close()


@pytest.mark.slow
def test_a_killed_server_loses_nothing_it_answered(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    port = free_port()
    config = ServeConfig.from_run_dir(run, "chain", port=port)
    url = f"http://127.0.0.1:{port}"
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(killable_server.PRELOAD)
    rng = random.Random(27)
    load = Load()
    for _ in range(KILLS):
        process = start(ctx, config, url)
        check_durable(run, load)
        stop = threading.Event()
        workers = [threading.Thread(target=load.client, args=(url, stop, k)) for k in range(CLIENTS)]
        for w in workers:
            w.start()
        time.sleep(rng.uniform(0.3, 2.5))
        os.kill(process.pid, signal.SIGKILL)
        stop.set()
        for w in workers:
            w.join(60)
        process.join(30)
    process = start(ctx, config, url)
    try:
        check_durable(run, load)
        assert len(load.answered) >= KILLS  # the kills came under load
        # every thread continues from what its client saw: one exchange added, nothing appended twice
        db = sqlite3.connect(f"file:{run / 'conversations.db'}?mode=ro", uri=True)
        for thread in load.current:
            history = load.histories[thread]
            question = {"role": "user", "content": "and then?"}
            r = httpx.post(
                url + "/v1/chat/completions",
                json={"model": "chain", "messages": [*history, question], "max_tokens": 3},
                headers={"X-Conversation-Id": thread},
                timeout=60,
            )
            assert r.status_code == 200
            answer = {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
            seen = [
                d
                for (d,) in db.execute(
                    "SELECT digest FROM seen_messages WHERE conversation_id = ? ORDER BY seq", (thread,)
                )
            ]
            assert seen == [
                message_digest(m["role"], None, m["content"]) for m in [*history, question, answer]
            ]
        db.close()
    finally:
        process.kill()
        process.join(30)
