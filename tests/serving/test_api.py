"""The team chat API on a real uvicorn server: the openai client and LangChain's ChatOpenAI work unchanged,
bad input gets a 4xx in OpenAI's error shape and the server keeps serving."""

from __future__ import annotations

import json
import shutil

import httpx
import openai
import pytest
import yaml
from langchain_openai import ChatOpenAI

from teamtr.serving.adapter_checks import AdapterError
from teamtr.serving.server import ServeConfig
from tests.support.serve_process import serve_process
from tests.support.serving import make_run_dir, serve_in_background, write_versions

API_KEY, ADMIN_KEY = "sk-test-key", "admin-test-key"
TASK = "12+7+30+5"


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    run = make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=2)
    trajectories = []
    config = ServeConfig.from_run_dir(run, "chain", api_keys=[API_KEY], admin_key=ADMIN_KEY)
    with serve_in_background(config, on_trajectory=trajectories.append) as server:
        server.trajectories = trajectories
        yield server


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0)


def test_openai_client_gets_the_teams_final_message(served, client):
    before = len(served.trajectories)
    r = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": TASK}])
    trajectory = served.trajectories[before]
    assert [t.role for t in trajectory.turns] == ["adder1", "adder2", "adder3"]
    assert r.choices[0].message.content == trajectory.final_answer
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == sum(len(t.prompt_ids) for t in trajectory.turns)
    assert r.usage.completion_tokens == sum(len(t.completion_ids) for t in trajectory.turns)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extension = r.model_extra["teamtr"]
    assert extension["adapter_versions"] == {"adder1": 2, "adder2": 2, "adder3": 2}
    assert [t["text"] for t in extension["turns"]] == [t.text for t in trajectory.turns]
    assert trajectory.metadata["conversation_id"] == extension["conversation_id"] == r.id


def test_streaming_matches_the_non_streamed_answer(client):
    """Greedy roles: the same task gives the same answer, streamed or not."""
    whole = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": TASK}])
    chunks = list(
        client.chat.completions.create(
            model="chain",
            messages=[{"role": "user", "content": TASK}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_include_turns_streams_every_agent_turn_before_the_answer(served):
    body = {
        "model": "chain",
        "messages": [{"role": "user", "content": TASK}],
        "stream": True,
        "stream_options": {"include_turns": True},
    }
    events = []
    with httpx.stream(
        "POST",
        served.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    turns = [c["teamtr_turn"] for c in chunks if "teamtr_turn" in c]
    assert [t["role"] for t in turns] == ["adder1", "adder2", "adder3"]
    assert [t["index"] for t in turns] == [0, 1, 2]
    answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert answer == turns[-1]["text"].split("\n")[0]
    last_turn_at = max(i for i, c in enumerate(chunks) if "teamtr_turn" in c)
    finish_at = min(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0].get("finish_reason"))
    first_content_at = min(
        (i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")),
        default=finish_at,
    )
    assert last_turn_at < first_content_at <= finish_at  # every turn streams before the answer


def test_langchain_chat_openai_works_unchanged(served, client):
    expected = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": TASK}])
    model = ChatOpenAI(base_url=served.url + "/v1", api_key=API_KEY, model="chain", max_retries=0)
    reply = model.invoke(TASK)
    assert reply.content == expected.choices[0].message.content
    assert reply.usage_metadata["total_tokens"] == expected.usage.total_tokens
    assert "".join(str(c.content) for c in model.stream(TASK)) == expected.choices[0].message.content


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list().data] == ["chain"]
    assert client.models.retrieve("chain").id == "chain"
    health = httpx.get(served.url + "/health").json()
    assert health["status"] == "ok" and health["teams"] == ["chain"]
    assert health["adapters"] == {"adder1": 2, "adder2": 2, "adder3": 2}


def test_earlier_messages_are_context_for_the_task(served, client):
    before = len(served.trajectories)
    client.chat.completions.create(
        model="chain",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "1+1"},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": TASK},
        ],
    )
    tokenizer = served.server.engine.tokenizer()
    prompt = tokenizer.decode(served.trajectories[before].turns[0].prompt_ids)
    assert "system: be brief\nuser: 1+1\nassistant: 2\n" + TASK in prompt


# ---- bad input ----------------------------------------------------------------------------------------


def _post(served, body, key=API_KEY, path="/v1/chat/completions", **kwargs):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(kwargs.pop("headers", {}))
    return httpx.post(
        served.url + path,
        headers=headers,
        timeout=60,
        **({"json": body} if body is not None else {}),
        **kwargs,
    )


def _assert_openai_error(r, status, code=None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": [{"role": "user", "content": TASK}]}, 400, "model"),  # missing model
        ({"model": "chain"}, 400, "messages"),  # missing messages
        ({"model": "chain", "messages": []}, 400, "messages"),  # empty messages
        ({"model": "chain", "messages": [{"role": "user", "content": "   "}]}, 400, "messages"),
        ({"model": "chain", "messages": [{"role": "assistant", "content": TASK}]}, 400, "messages"),
        ({"model": "chain", "messages": [{"role": "wizard", "content": TASK}]}, 400, None),
        ({"model": "chain", "messages": [{"role": "user", "content": TASK}], "n": 9}, 400, "n"),  # over max_n
        (
            {"model": "chain", "messages": [{"role": "user", "content": TASK}], "temperature": -1},
            400,
            "temperature",
        ),
        ({"model": "nope", "messages": [{"role": "user", "content": TASK}]}, 404, "model"),
        (
            {"model": "chain", "messages": [{"role": "user", "content": TASK}], "max_tokens": 10**6},
            400,
            "max_tokens",
        ),
        ({"model": "chain", "messages": [{"role": "user", "content": "1+" * 5000}]}, 400, "messages"),
        ([1, 2, 3], 400, None),
    ],
)
def test_bad_requests_get_openai_shaped_4xx(served, body, status, param):
    error = _assert_openai_error(_post(served, body), status)
    if param is not None:
        assert error["param"].startswith(param)


def test_too_many_tokens_says_so(served):
    r = _post(served, {"model": "chain", "messages": [{"role": "user", "content": "1+" * 5000}]})
    assert _assert_openai_error(r, 400, "context_length_exceeded")["message"].startswith(
        "the conversation is"
    )


def test_malformed_json_and_oversized_payloads(served):
    _assert_openai_error(
        _post(
            served,
            None,
            content=b'{"model": "chain", "messages": [',
            headers={"content-type": "application/json"},
        ),
        400,
        "json_invalid",
    )
    big = {"model": "chain", "messages": [{"role": "user", "content": "x" * 2_000_000}]}
    _assert_openai_error(_post(served, big), 413, "payload_too_large")

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"model": "chain", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 50_000
        yield b'"}]}'

    r = _post(served, None, content=chunked(), headers={"content-type": "application/json"})
    _assert_openai_error(r, 413)


def test_wrong_keys_get_401_and_403(served, client):
    body = {"model": "chain", "messages": [{"role": "user", "content": TASK}]}
    _assert_openai_error(_post(served, body, key=None), 401, "invalid_api_key")
    _assert_openai_error(_post(served, body, key="sk-wrong"), 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-team", messages=[{"role": "user", "content": TASK}])
    admin = {"role": "adder1"}
    _assert_openai_error(
        _post(served, admin, key=API_KEY, path="/admin/adapters/rollback"), 403, "insufficient_permissions"
    )
    _assert_openai_error(_post(served, admin, key="wrong", path="/admin/adapters/rollback"), 401)
    _assert_openai_error(_post(served, admin, key=None, path="/admin/adapters/rollback"), 401)
    _assert_openai_error(httpx.get(served.url + "/v1/nothing-here"), 404)
    # and the server keeps serving
    assert client.chat.completions.create(model="chain", messages=[{"role": "user", "content": TASK}]).choices


def test_feedback_needs_a_known_conversation(served, client):
    r = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": TASK}])
    ok = _post(served, {"conversation_id": r.id, "reward": 1.0}, path="/v1/feedback")
    assert ok.status_code == 200 and ok.json() == {"conversation_id": r.id, "reward": 1.0, "episodes": 1}
    _assert_openai_error(_post(served, {"conversation_id": "nope", "reward": 1.0}, path="/v1/feedback"), 404)
    bad = _post(
        served,
        None,
        path="/v1/feedback",
        content=b'{"conversation_id": "x", "reward": NaN}',
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400


def test_teamtr_serve_command_serves_a_run_directory(tiny_model_dir, tmp_path):
    """The real command line: `teamtr serve RUN_DIR` in its own process, then a plain openai client."""
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    with serve_process(str(run), "--team-name", "chain", env={"TEAMTR_API_KEYS": "sk-cli"}) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-cli", max_retries=0)
        reply = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": TASK}])
        assert len(reply.model_extra["teamtr"]["turns"]) == 3
        assert (run / "traces.db").is_file()  # the span store is on by default, in the run directory


def test_a_config_file_serves_several_teams_on_one_engine(tiny_model_dir, tmp_path):
    make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    config_file = tmp_path / "serve.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "teams": {
                    "chain": {"roles": "teamtr.graphs.chain_team:chain_roles", "run_dir": "run"},
                    "duo": {
                        "roles": "teamtr.graphs.chain_team:chain_roles",
                        "options": {"steps": 2},
                        "run_dir": "run",
                    },
                },
                "tracing": {"sqlite_path": "spans/traces.db"},
            }
        )
    )
    config = ServeConfig.from_yaml(config_file)
    with serve_in_background(config) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["chain", "duo"]
        duo = client.chat.completions.create(model="duo", messages=[{"role": "user", "content": "1+2+3"}])
        assert [t["role"] for t in duo.model_extra["teamtr"]["turns"]] == ["adder1", "adder2"]
        assert server.server.registry.adapters() == ["adder1", "adder2", "adder3"]  # one version each, shared
    assert (tmp_path / "spans" / "traces.db").is_file()  # relative paths resolve beside the config file


def test_a_heterogeneous_run_serves_each_role_on_its_own_base(tiny_model_dir, tmp_path):
    """A run whose config puts adder2 on a second base model (team.bases / team.role_bases)."""
    from tests.support.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "other-model", seed=1)
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    shutil.rmtree(run / "adapters" / "adder2")
    write_versions(other, run, range(1, 2), roles=("adder2",))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["team"].update(bases={"other": str(other)}, role_bases={"adder2": "other"})
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    recorded = []
    with serve_in_background(ServeConfig.from_run_dir(run, "chain"), on_trajectory=recorded.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        client.chat.completions.create(model="chain", messages=[{"role": "user", "content": TASK}])
        engine = server.server.engine
        assert [t.base_model for t in recorded[0].turns] == ["base", "other", "base"]
        turn = recorded[0].turns[1]
        on_other = engine.score([turn.prompt_ids], [turn.completion_ids], "adder2@v1", base="other")[0]
        assert on_other == pytest.approx(turn.logprobs, abs=1e-4)
        # an adapter trained on the other base is refused for a role served on "base"
        with pytest.raises(AdapterError, match="base model"):
            server.call(server.server.registry.push, "adder1", run / "adapters" / "adder2" / "v1", 9)
        assert server.server.registry.current_versions()["adder1"] == 1


async def test_a_team_of_plain_chat_models_records_text_only_turns(served):
    """A team whose role speaks through a plain LangChain chat model (ChatOpenAI on this very server):
    its turn is the reply's text, attributed to the role's declared adapter and base at version 0, with
    no tokens to train on (graphs/chat_model.py::turn_from_reply); the served episode has full turns."""
    from teamtr.graphs.roles import Role
    from teamtr.graphs.team import Team

    role = Role("outer", "Add the numbers.", adapter="outer-adapter", base_model="other")
    model = ChatOpenAI(base_url=served.url + "/v1", api_key=API_KEY, model="chain", max_retries=0)
    before = len(served.trajectories)
    trajectory = await Team([role], {"outer": model}).arun(TASK)
    [inner] = served.trajectories[before:]
    [turn] = trajectory.turns
    assert turn.text == trajectory.final_answer == inner.final_answer
    assert (turn.role, turn.adapter, turn.adapter_version, turn.base_model) == (
        "outer",
        "outer-adapter",
        0,
        "other",
    )
    assert turn.prompt_ids == turn.completion_ids == turn.logprobs == []
    assert [t.role for t in inner.turns] == ["adder1", "adder2", "adder3"]
    assert all(t.completion_ids and len(t.logprobs) == len(t.completion_ids) for t in inner.turns)
