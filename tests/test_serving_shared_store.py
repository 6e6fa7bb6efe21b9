"""Two `teamtr serve` processes sharing one real PostgreSQL store (`--db`, serving/pg_store.py): a
conversation started on replica A continues on replica B with its whole history (nothing twice); a
promotion made through A is what B's next episode runs on, and a rollback through B is what A's next one
runs on; every replica's episodes and feedback are in the one span store `teamtr improve` reads."""

from __future__ import annotations

import uuid
from contextlib import ExitStack

import httpx
import pytest
from pg_fixtures import fresh_database, postgres_server
from serve_process import serve_process
from serving_fixtures import make_run_dir, write_versions
from transformers import AutoTokenizer

from teamtr.serving.served_episodes import served_episodes
from teamtr.serving.tracing import trajectories_from_store

ADMIN = {"Authorization": "Bearer adm"}


@pytest.fixture(scope="module")
def postgres():
    with postgres_server() as url:
        yield url


@pytest.fixture
def db(postgres):
    return fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")


def ask(url: str, messages: list[dict[str, str]], thread: str) -> dict:
    body = {"model": "chain", "messages": messages, "max_tokens": 4}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": thread}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_two_replicas_share_threads_promotions_and_spans(tiny_model_dir, tmp_path, db):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=2)
    later = write_versions(tiny_model_dir, tmp_path / "later", [3], roles=("adder2",))
    args = (str(run), "--team-name", "chain", "--db", db, "--admin-key", "adm")
    with ExitStack() as stack:
        a = stack.enter_context(serve_process(*args))
        b = stack.enter_context(serve_process(*args))

        # a conversation started on A continues on B, with its history, nothing twice
        question = {"role": "user", "content": "alpha 12+7"}
        first = ask(a, [question], "t1")
        answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
        second = ask(b, [question, answer, {"role": "user", "content": "bravo 30+5"}], "t1")
        feedback = httpx.post(b + "/v1/feedback", json={"conversation_id": "t1", "reward": 1.0}, timeout=30)
        assert feedback.status_code == 200 and feedback.json()["episodes"] == 2, feedback.text
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        trajectories = {t.task_id: t for t in trajectories_from_store(db)}
        prompt = tokenizer.decode(trajectories[second["id"]].turns[0].prompt_ids)
        assert prompt.count("alpha 12+7") == 1 and "bravo 30+5" in prompt
        assert prompt.index("alpha 12+7") < prompt.index("bravo 30+5")

        # a promotion through A serves B's next episode; a rollback through B serves A's next one
        assert first["teamtr"]["adapter_versions"]["adder2"] == 2
        pushed = httpx.post(
            a + "/admin/adapters",
            json={"role": "adder2", "path": str(later / "adapters" / "adder2" / "v3")},
            headers=ADMIN,
            timeout=60,
        )
        assert pushed.status_code == 200, pushed.text
        assert ask(b, [{"role": "user", "content": "charlie 1+1"}], "t2")["teamtr"]["adapter_versions"] == {
            "adder1": 2,
            "adder2": 3,
            "adder3": 2,
        }
        listed = httpx.get(b + "/admin/adapters", headers=ADMIN, timeout=30).json()
        assert listed["current"]["adder2"] == 3
        rolled = httpx.post(b + "/admin/adapters/rollback", json={"role": "adder2"}, headers=ADMIN, timeout=60)
        assert rolled.status_code == 200 and rolled.json()["version"] == 2, rolled.text
        third = ask(a, [{"role": "user", "content": "delta 2+2"}], "t3")
        assert third["teamtr"]["adapter_versions"]["adder2"] == 2

        # both replicas' traffic, and the feedback given on B, in the one store
        episodes = {e.completion_id: e for e in served_episodes(db)}
        assert {first["id"], second["id"], third["id"]} <= set(episodes)
        assert episodes[second["id"]].reward == 1.0
        shared = httpx.get(a + "/admin/episodes", headers=ADMIN, timeout=30)
        assert shared.status_code == 200
        assert len(shared.json()["episodes"]) == len(episodes) == 4
