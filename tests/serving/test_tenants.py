"""Tenants, bounded admin input and the production preset (issue 27), on a real server over a tiny model:
a conversation and its feedback belong to the key that created it, rewards have a declared range, the
production preset keys /docs, /openapi.json, /health and /metrics (not liveness and readiness), every
admin parameter is bounded (4xx, never 5xx), pushed adapter paths stay inside the adapter roots
with errors that tell nothing of the file system; OPTIONS and 405 name every method of a path, and
Retry-After stays under the keep-alive."""

from __future__ import annotations

import httpx
import pytest

from teamtr.serving.served_episodes import served_episodes
from teamtr.serving.server import ServeConfig
from tests.support.serving import make_run_dir, serve_in_background, write_versions

KEY_A, KEY_B, ADMIN = "sk-a", "sk-b", "adm"


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    run = make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=1)
    config = ServeConfig.from_run_dir(
        run, "chain", api_keys=[KEY_A, KEY_B], admin_key=ADMIN, preset="production", reward_range=(-1, 1)
    )
    with serve_in_background(config) as server:
        yield server, run


def chat(url: str, key: str | None, conversation: str | None = None) -> httpx.Response:
    headers = {**bearer(key), **({"X-Conversation-Id": conversation} if conversation else {})}
    body = {"model": "chain", "messages": [{"role": "user", "content": "1+2"}], "max_tokens": 3}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def feedback(url: str, key: str | None, conversation: str, reward: float) -> httpx.Response:
    body = {"conversation_id": conversation, "reward": reward}
    return httpx.post(url + "/v1/feedback", json=body, headers=bearer(key), timeout=30)


def test_a_conversation_and_its_feedback_belong_to_the_key_that_created_it(served):
    server, _ = served
    assert chat(server.url, KEY_A, "thread-a").status_code == 200
    unknown = feedback(server.url, KEY_B, "no-such-thread", 0.5)
    for other in (chat(server.url, KEY_B, "thread-a"), feedback(server.url, KEY_B, "thread-a", -1.0)):
        assert other.status_code == 404, other.text  # as if it did not exist
        assert other.json()["error"]["code"] == unknown.json()["error"]["code"] == "conversation_not_found"
    assert chat(server.url, ADMIN, "thread-a").status_code == 404  # the admin key is a tenant too
    ok = feedback(server.url, KEY_A, "thread-a", 0.5)
    assert ok.status_code == 200 and ok.json()["episodes"] == 1  # B's attempt added nothing
    second = chat(server.url, KEY_A, "thread-a")
    assert second.status_code == 200 and second.json()["teamtr"]["conversation_id"] == "thread-a"
    assert chat(server.url, KEY_B, "thread-b").status_code == 200  # B's own threads are B's


def test_rewards_outside_the_declared_range_are_refused(served):
    server, _ = served
    assert chat(server.url, KEY_A, "thread-r").status_code == 200
    for reward, code in (
        (2.0, "reward_out_of_range"),
        (1e308, "less_than_equal"),
        (-1e6, "greater_than_equal"),
    ):
        r = feedback(server.url, KEY_A, "thread-r", reward)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    assert feedback(server.url, KEY_A, "thread-r", -1.0).status_code == 200


def test_the_production_preset_keys_everything_but_liveness_and_readiness(served):
    server, _ = served
    for path in ("/docs", "/redoc", "/openapi.json", "/health", "/metrics", "/v1/models"):
        refused = httpx.get(server.url + path, timeout=30)
        assert refused.status_code == 401, path
        assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
        assert httpx.get(server.url + path, headers=bearer("wrong"), timeout=30).status_code == 401
        assert httpx.get(server.url + path, headers=bearer(KEY_B), timeout=30).status_code == 200, path
    assert "/admin/adapters" in httpx.get(server.url + "/openapi.json", headers=bearer(ADMIN)).json()["paths"]
    for path in ("/health/live", "/health/ready"):
        assert httpx.get(server.url + path, timeout=60).status_code == 200
    assert chat(server.url, None).status_code == 401


def test_the_production_preset_needs_keys():
    with pytest.raises(ValueError, match="production needs api_keys and an admin_key"):
        ServeConfig(teams={"chain": {}}, preset="production", api_keys=["k"])


@pytest.mark.parametrize(
    "query",
    [
        "since_ns=9223372036854775808",
        "since_ns=-1",
        "since_ns=1e3",
        "limit=0",
        "limit=-5",
        "limit=100000001",
        "team=",
        "team=" + "x" * 200,
    ],
)
def test_admin_episode_queries_are_bounded(served, query):
    server, _ = served
    r = httpx.get(f"{server.url}/admin/episodes?{query}", headers=bearer(ADMIN), timeout=30)
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_admin_episode_queries_in_bounds_answer(served):
    server, _ = served
    assert chat(server.url, KEY_A).status_code == 200
    everything = httpx.get(f"{server.url}/admin/episodes?since_ns=0", headers=bearer(ADMIN)).json()[
        "episodes"
    ]
    last = httpx.get(f"{server.url}/admin/episodes?limit=1", headers=bearer(ADMIN)).json()["episodes"]
    assert everything and last == everything[-1:]
    latest = f"{server.url}/admin/episodes?since_ns=9223372036854775807"
    assert httpx.get(latest, headers=bearer(ADMIN)).json()["episodes"] == []
    assert httpx.get(server.url + "/v1/models/" + "m" * 300, headers=bearer(KEY_A)).status_code == 400
    with pytest.raises(ValueError, match="limit must be at least 1"):
        served_episodes(served[1] / "traces.db", limit=0)


def test_pushed_adapter_paths_stay_inside_the_roots(served, tiny_model_dir, tmp_path):
    server, run = served

    def push(path: str) -> httpx.Response:
        body = {"role": "adder1", "path": path}
        return httpx.post(server.url + "/admin/adapters", json=body, headers=bearer(ADMIN), timeout=120)

    (run / "escape").symlink_to(tmp_path)
    outside = [push(p) for p in ("../../../../etc", "/etc", "/no/such/dir", str(tmp_path), "escape")]
    for r in outside:
        assert r.status_code == 400 and r.json()["error"]["code"] == "adapter_path_refused", r.text
    # the same words whether the path exists or not, naming no directory
    assert len({r.json()["error"]["message"] for r in outside}) == 1
    assert "/" not in outside[0].json()["error"]["message"].split("(")[0]
    missing = push("adapters/adder1/v9")  # inside the root: the registry's reason, relative to the root
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "adapter_rejected"
    assert str(run) not in missing.json()["error"]["message"]
    write_versions(tiny_model_dir, run, range(2, 3), roles=("adder1",))
    pushed = push("adapters/adder1/v2")  # relative to the root, not to the server's working directory
    assert pushed.status_code == 200 and pushed.json()["version"] == 2, pushed.text


def test_options_and_405_name_every_method_of_the_path(served):
    server, _ = served
    options = httpx.options(server.url + "/admin/candidate", timeout=30)
    assert options.status_code == 204 and options.headers["allow"] == "GET, OPTIONS, POST"
    wrong = httpx.put(server.url + "/v1/feedback", headers=bearer(KEY_A), timeout=30)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "OPTIONS, POST"
    assert set(wrong.json()["error"]) == {"message", "type", "param", "code"}


def test_retry_after_is_capped_below_the_keep_alive():
    from teamtr.serving.errors import MAX_RETRY_AFTER_S, too_many_requests

    assert too_many_requests("busy", 1e6, "queue_full").headers == {"Retry-After": str(MAX_RETRY_AFTER_S)}
    assert ServeConfig(teams={"chain": {}}).keep_alive_s > MAX_RETRY_AFTER_S
