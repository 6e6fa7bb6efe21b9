"""Threads on a real server: a conversation id continues its stored messages, across a restart on the
same directory; an unknown id starts a fresh thread; a corrupt conversation store stops the server and is
left byte for byte as it was (serving/conversations.py, docs/serving.md "Threads")."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from teamtr.graphs.chat_model import strip_stop
from teamtr.serving.conversations import ConversationStoreError, threads_path
from teamtr.serving.server import ServeConfig
from tests.support.serving import make_run_dir, serve_in_background

MESSAGES = ["alpha 12+7", "bravo 30+5", "charlie 1+1", "delta 2+2"]


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    return make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=1)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _config(run_dir, tmp_path, traces: str | None = None) -> ServeConfig:
    return ServeConfig.from_run_dir(
        run_dir,
        "chain",
        conversations_path=str(tmp_path / "conversations.db"),
        tracing={"sqlite_path": traces},
        max_prompt_tokens=300,
    )


def _ask(server, text: str, thread: str | None = None) -> httpx.Response:
    headers = {"X-Conversation-Id": thread} if thread else {}
    body = {"model": "chain", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_a_thread_continues_across_requests_and_a_restart(run_dir, tmp_path, tokenizer):
    config = _config(run_dir, tmp_path, traces=str(tmp_path / "traces.db"))
    seen = []
    with serve_in_background(config, on_trajectory=seen.append) as server:
        first = _ask(server, MESSAGES[0])
        thread = first.headers["X-Conversation-Id"]
        assert thread == first.json()["teamtr"]["conversation_id"] == first.json()["id"]
        answers = [first.json()["choices"][0]["message"]["content"]]
        for text in MESSAGES[1:3]:
            r = _ask(server, text, thread)
            assert r.headers["X-Conversation-Id"] == r.json()["teamtr"]["conversation_id"] == thread
            answers.append(r.json()["choices"][0]["message"]["content"])
        prompt = tokenizer.decode(seen[-1].turns[0].prompt_ids)
        assert MESSAGES[0] in prompt and MESSAGES[1] in prompt and MESSAGES[2] in prompt
        assert MESSAGES[1] not in tokenizer.decode(seen[0].turns[0].prompt_ids)
    with serve_in_background(config, on_trajectory=seen.append) as server:
        r = _ask(server, MESSAGES[3], thread)
        assert r.headers["X-Conversation-Id"] == thread
        prompt = tokenizer.decode(seen[-1].turns[0].prompt_ids)
        assert all(m in prompt for m in MESSAGES)
        assert prompt.index(MESSAGES[0]) < prompt.index(MESSAGES[2]) < prompt.index(MESSAGES[3])
        feedback = httpx.post(
            server.url + "/v1/feedback", json={"conversation_id": thread, "reward": 1.0}, timeout=30
        )
        assert feedback.status_code == 200, feedback.text
        assert feedback.json()["episodes"] == 4
        fresh = _ask(server, MESSAGES[3], "never-seen-before")
        assert fresh.headers["X-Conversation-Id"] == "never-seen-before"
        prompt = tokenizer.decode(seen[-1].turns[0].prompt_ids)
        assert MESSAGES[3] in prompt and MESSAGES[0] not in prompt
        by_metadata = httpx.post(
            server.url + "/v1/chat/completions",
            json={
                "model": "chain",
                "messages": [{"role": "user", "content": "echo 9+9"}],
                "max_tokens": 4,
                "metadata": {"conversation_id": thread},
            },
            timeout=120,
        )
        assert by_metadata.headers["X-Conversation-Id"] == thread
        assert MESSAGES[3] in tokenizer.decode(seen[-1].turns[0].prompt_ids)


def test_a_client_resending_the_whole_conversation_is_not_doubled(run_dir, tmp_path, tokenizer):
    seen = []
    with serve_in_background(_config(run_dir, tmp_path), on_trajectory=seen.append) as server:
        first = _ask(server, MESSAGES[0], "t1")
        answer = first.json()["choices"][0]["message"]["content"]
        body = {
            "model": "chain",
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": MESSAGES[0]},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": MESSAGES[1]},
            ],
        }
        r = httpx.post(
            server.url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": "t1"}, timeout=120
        )
        assert r.status_code == 200
        assert tokenizer.decode(seen[-1].turns[0].prompt_ids).count(MESSAGES[0]) == 1


def _corrupt_file_stops_the_server_untouched(run_dir: Path, tmp_path: Path, path: Path) -> None:
    garbage = b"SQLite format 3\x00" + bytes(range(256)) * 20
    path.write_bytes(garbage)
    with pytest.raises(RuntimeError, match=re.escape(str(path))) as failed:
        with serve_in_background(_config(run_dir, tmp_path)):
            pass
    assert isinstance(failed.value.__cause__, ConversationStoreError)
    assert path.read_bytes() == garbage


def test_a_corrupt_conversation_store_stops_the_server_and_is_left_as_it_was(run_dir, tmp_path):
    _corrupt_file_stops_the_server_untouched(run_dir, tmp_path, tmp_path / "conversations.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conversations.db"]


def test_a_corrupt_checkpoint_file_stops_the_server_and_is_left_as_it_was(run_dir, tmp_path):
    _corrupt_file_stops_the_server_untouched(run_dir, tmp_path, threads_path(tmp_path / "conversations.db"))


def _checkpoint(path, thread: str) -> dict:
    """The thread's saved graph state, read from the file as LangGraph reads it."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    from teamtr.serving.threads import thread_config

    with sqlite3.connect(path) as conn:
        found = SqliteSaver(conn).get_tuple(thread_config(thread))
    assert found is not None, f"no checkpoint of {thread} in {path}"
    return found.checkpoint["channel_values"]


def test_each_request_of_a_thread_is_a_whole_episode_on_the_checkpointed_transcript(run_dir, tmp_path, tokenizer):
    """The chain team takes three turns per request (its turn count is per episode, not over the thread's
    transcript), and the thread's LangGraph state holds every turn and the user's later messages."""
    seen = []
    with serve_in_background(_config(run_dir, tmp_path), on_trajectory=seen.append) as server:
        for text in MESSAGES[:3]:
            _ask(server, text, "whole")
    assert [[t.role for t in e.turns] for e in seen] == [["adder1", "adder2", "adder3"]] * 3
    state = _checkpoint(threads_path(tmp_path / "conversations.db"), "whole")
    assert state["task"] == MESSAGES[0] and state["turns"] == 3
    users = [e["text"] for e in state["transcript"] if e.get("user")]
    assert users == MESSAGES[1:3]
    roles = [e["role"] for e in state["transcript"] if not e.get("user")]
    assert roles == ["adder1", "adder2", "adder3"] * 3
    # the turns as the engine sampled them (without the stop string) are the thread's messages
    assert [strip_stop(t.text, ("\n",)) for e in seen for t in e.turns] == [
        e["text"] for e in state["transcript"] if not e.get("user")
    ]


def test_extra_choices_see_the_thread_but_only_the_first_continues_it(run_dir, tmp_path, tokenizer):
    seen = []
    with serve_in_background(_config(run_dir, tmp_path), on_trajectory=seen.append) as server:
        _ask(server, MESSAGES[0], "forked")
        body = {"model": "chain", "messages": [{"role": "user", "content": MESSAGES[1]}], "max_tokens": 4,
                "n": 2, "seed": 3, "temperature": 1.0}  # fmt: skip
        r = httpx.post(
            server.url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": "forked"}, timeout=120
        )
        assert r.status_code == 200, r.text
        streamed = httpx.post(
            server.url + "/v1/chat/completions",
            json={**body, "n": 1, "stream": True, "messages": [{"role": "user", "content": MESSAGES[2]}]},
            headers={"X-Conversation-Id": "forked"},
            timeout=120,
        )
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
    both = seen[1:3]
    for episode in both:  # each choice acted on the thread so far
        assert MESSAGES[0] in tokenizer.decode(episode.turns[0].prompt_ids)
    state = _checkpoint(threads_path(tmp_path / "conversations.db"), "forked")
    assert [e["text"] for e in state["transcript"] if e.get("user")] == MESSAGES[1:3]
    assert len(state["transcript"]) == 3 * 3 + 2  # three episodes' turns (one per request) + two user messages
    # the thread goes on from choice 0 (the request's seed; choice 1 has a seed derived from it)
    (choice0,) = [e for e in both if e.metadata["seed"] == 3]
    assert [e["text"] for e in state["transcript"][4:7]] == [strip_stop(t.text, ("\n",)) for t in choice0.turns]
    # the streamed request (a thread's third) saw both earlier requests
    assert MESSAGES[1] in tokenizer.decode(seen[-1].turns[0].prompt_ids)


async def test_an_evicted_conversation_takes_its_checkpoints_with_it(tmp_path):
    from langgraph.graph import START, MessagesState, StateGraph

    from teamtr.serving.conversations import Conversations
    from teamtr.serving.threads import thread_config

    g = StateGraph(MessagesState)
    g.add_node("echo", lambda state: {"messages": [("ai", "ok")]})
    g.add_edge(START, "echo")
    conversations = Conversations(1, tmp_path / "conversations.db")
    saver = await conversations.saver()
    graph = g.compile(checkpointer=saver)
    for thread in ("old", "new"):
        await graph.ainvoke({"messages": [("user", thread)]}, thread_config(thread))
    assert conversations.add_episode("old") == []
    assert conversations.add_episode("new") == ["old"]  # capacity 1: the oldest goes
    await conversations.forget(["old"])
    assert await saver.aget_tuple(thread_config("old")) is None
    assert await saver.aget_tuple(thread_config("new")) is not None
    assert "old" not in conversations and conversations.episodes("new") == 1
    await conversations.aclose()
