"""examples/tool_team.py end to end: TeamTR trains the tool-using team briefly on a tiny random Llama, then
`teamtr serve` (its own process) holds a three-request conversation on one thread with the `openai`
client; request 3's episode sees requests 1-2 from the LangGraph checkpoint, and after a restart of the
server the same thread goes on (docs/serving.md "Threads")."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import httpx
import pytest
from serve_process import serve_process
from test_user_graphs import ROOT, example_config, train
from transformers import AutoTokenizer

from teamtr.serving.conversations import thread_config
from teamtr.serving.tracing import trajectories_from_store

pytestmark = pytest.mark.slow  # a short training and two server processes

QUESTIONS = ["2+3+4+5", "6+1+1+7", "9+9+2+1", "4+4+4+4"]
THREAD = "tool-thread-1"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tests' tiny random Llama with room for the tool schema in its context (RoPE: no weights)."""
    from teamtr.training.warmstart import tiny_random_model

    path = Path(tiny_random_model(tmp_path_factory.mktemp("tiny") / "model"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    return path


def _ask(client, text: str):
    return client.chat.completions.create(
        model="tool_team",
        messages=[{"role": "user", "content": text}],
        extra_headers={"X-Conversation-Id": THREAD},
    )


def _thread_episodes(run_dir: Path) -> list:
    """The thread's episodes from the server's trace store, in the order they started."""
    episodes = trajectories_from_store(run_dir / "traces.db")
    return [t for t in episodes if t.metadata.get("conversation_id") == THREAD]


def test_the_tool_team_trains_and_serves_a_thread_across_a_restart(model_dir, tmp_path):
    import openai

    run_dir = tmp_path / "tool_team"
    overrides = {"eval.stage_episodes": 0, "team.recursion_limit": 12, "task.options": {"steps": 3}}
    updates = [r for r in train(example_config("tool_team", str(model_dir), run_dir, **overrides)) if r["kind"] == "update"]
    assert [u["role"] for u in updates] == ["solver", "reviewer"]

    # the config names `examples.tool_team`: importable from the repository root, as for a user there
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    answers = []
    with serve_process(str(run_dir), env=env) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for text in QUESTIONS[:3]:
            r = _ask(client, text)
            assert r.model_extra["teamtr"]["conversation_id"] == THREAD
            assert [t["role"] for t in r.model_extra["teamtr"]["turns"]][-1] == "reviewer"
            answers.append(r.choices[0].message.content)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    episodes = _thread_episodes(run_dir)
    assert len(episodes) == 3
    third = tokenizer.decode(episodes[2].turns[0].prompt_ids)
    # request 3's solver acts on the whole conversation, in order: the questions and the answers before it
    at = [third.index(q) for q in QUESTIONS[:3]]
    assert at == sorted(at)
    assert "calc" in third  # the tool's schema, through bind_tools
    for answer in answers[:2]:
        assert answer is None or answer.strip() == "" or answer in third
    first = tokenizer.decode(episodes[0].turns[0].prompt_ids)
    assert QUESTIONS[1] not in first and QUESTIONS[2] not in first

    # the conversation is the checkpointed graph state (MessagesState), not a folded string
    saved = _checkpoint_messages(run_dir / "conversations.db")
    assert [m.content for m in saved if m.type == "human"] == QUESTIONS[:3]
    assert [m.type for m in saved].count("ai") >= 6  # solver and reviewer, three times

    with serve_process(str(run_dir), env=env) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = _ask(client, QUESTIONS[3])
        assert r.model_extra["teamtr"]["conversation_id"] == THREAD
        feedback = httpx.post(url + "/v1/feedback", json={"conversation_id": THREAD, "reward": 1.0}, timeout=30)
        assert feedback.status_code == 200, feedback.text
        assert feedback.json()["episodes"] == 4
    fourth = tokenizer.decode(_thread_episodes(run_dir)[3].turns[0].prompt_ids)
    at = [fourth.index(q) for q in QUESTIONS]
    assert at == sorted(at)
    saved = _checkpoint_messages(run_dir / "conversations.db")
    assert [m.content for m in saved if m.type == "human"] == QUESTIONS


def _checkpoint_messages(path: Path) -> list:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with sqlite3.connect(path) as conn:
        found = SqliteSaver(conn).get_tuple(thread_config(THREAD))
    assert found is not None, f"no checkpoint of thread {THREAD} in {path}"
    return found.checkpoint["channel_values"]["messages"]
