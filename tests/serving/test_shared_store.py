"""Two `teamtr serve` processes sharing one real PostgreSQL store (`--db`, serving/pg_store.py): a
conversation started on replica A continues on replica B with its whole history (nothing twice); a
promotion made through A is what B's next episode runs on, and a rollback through B is what A's next one
runs on; a candidate loaded through A is drawn by B's episodes too, and promoted through B serves A; every
replica's episodes, feedback and canary pairs are in the one span store `teamtr improve` and
`teamtr traces` read."""

from __future__ import annotations

import json
import time
import uuid
from contextlib import ExitStack

import httpx
import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from teamtr.cli.main import app
from teamtr.engines.vllm_server import free_port
from teamtr.serving.local_replicas import fresh_database
from teamtr.serving.pg_store import PgStore, StoreError
from teamtr.serving.served_episodes import served_episodes
from teamtr.serving.server import ServeConfig
from teamtr.serving.tracing import trajectories_from_store
from tests.support.serve_process import serve_process
from tests.support.serving import make_run_dir, write_versions

ADMIN = {"Authorization": "Bearer adm"}


@pytest.fixture
def db(postgres):
    return fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")


def ask(url: str, messages: list[dict[str, str]], thread: str) -> dict:
    body = {"model": "chain", "messages": messages, "max_tokens": 4}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": thread}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_two_replicas_share_threads_promotions_and_spans(tiny_model_dir, tmp_path, db):
    check_two_replicas(tiny_model_dir, tmp_path, db)


@pytest.mark.vllm
@pytest.mark.slow
def test_two_replicas_on_one_vllm_server_share_them_too(vllm_server, vllm_model_dir, tmp_path, db):
    """The same with vLLM as the engine: both replicas attach one vLLM server and load every version into
    it under the same name; a version one replica unloads (idle there) while the other still serves it
    is loaded again by the other on its 404 (engines/vllm_engine.py `restore_adapters`)."""
    check_two_replicas(vllm_model_dir, tmp_path, db, "--vllm-url", vllm_server.url)


def test_a_store_that_is_not_a_database_or_out_of_reach_is_refused_naming_it(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    with pytest.raises(ValueError, match=r"db must be a postgresql:// URL .*'conversations\.db'"):
        ServeConfig.from_run_dir(run, "chain", db="conversations.db")
    with pytest.raises(StoreError, match=r"cannot connect to the shared store postgresql://teamtr@127\.0\.0\.1:") as e:
        PgStore(f"postgresql://teamtr:secret@127.0.0.1:{free_port()}/postgres")  # nothing listens there
    assert "secret" not in str(e.value)  # the password is never in a message


def check_two_replicas(model_dir, tmp_path, db, *engine: str) -> None:
    run = make_run_dir(model_dir, tmp_path / "run", versions=2)
    later = write_versions(model_dir, tmp_path / "later", [3, 4], roles=("adder2",))
    args = (str(run), "--team-name", "chain", "--db", db, "--admin-key", "adm", *engine)
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
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
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

        # a candidate loaded through A (every episode, each answered again by the incumbent) is drawn on B
        # too; promoted through B, it serves A's next episode as the current version
        candidate = {"versions": {"adder2": {"path": str(later / "adapters" / "adder2" / "v4")}}}
        loaded = httpx.post(a + "/admin/candidate", json={**candidate, "share": 1.0, "shadow": True}, headers=ADMIN)
        assert loaded.status_code == 200, loaded.text
        canaries = [ask(url, [{"role": "user", "content": "echo 5+5"}], f"c-{url}") for url in (b, a)]
        assert [c["teamtr"]["adapter_versions"]["adder2"] for c in canaries] == [4, 4]
        promoted = httpx.post(b + "/admin/candidate/promote", headers=ADMIN, timeout=60)
        assert promoted.status_code == 200, promoted.text
        assert httpx.get(a + "/admin/candidate", headers=ADMIN).json() is None
        fourth = ask(a, [{"role": "user", "content": "foxtrot 3+3"}], "t4")
        assert fourth["teamtr"]["adapter_versions"]["adder2"] == 4

        # both replicas' traffic, the feedback given on B and the canary's pairs from both, in the one store
        answered = {first["id"], second["id"], third["id"], fourth["id"], *(c["id"] for c in canaries)}
        episodes = {e.completion_id: e for e in served_episodes(db)}
        assert answered <= set(episodes) and len(episodes) == 7  # with the episode of the push check
        assert episodes[second["id"]].reward == 1.0
        shared = httpx.get(a + "/admin/episodes", headers=ADMIN, timeout=30)
        assert shared.status_code == 200 and len(shared.json()["episodes"]) == 7
        pairs = {episodes[c["id"]].pair_id for c in canaries}
        assert None not in pairs and len(pairs) == 2
        deadline = time.monotonic() + 120  # a bound only: the shadows finish after their answers
        while len(shadows := [e for e in served_episodes(db, shadows=True) if e.shadow]) < 2:
            assert time.monotonic() < deadline, "the canary's shadow episodes never reached the store"
            time.sleep(0.2)
        assert {e.pair_id for e in shadows} == pairs
        assert {e.adapter_versions["adder2"] for e in shadows} == {2}  # the incumbent answered them again
    listed = CliRunner().invoke(app, ["traces", "list", db, "--json"])
    assert listed.exit_code == 0, listed.output
    assert answered <= {e["episode_id"] for e in json.loads(listed.stdout)}
