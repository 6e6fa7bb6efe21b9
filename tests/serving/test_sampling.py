"""Sampling as asked, on a real server and the real embedded engine: every honoured request field changes
the result as it should, a team's pinned settings win, and every field the team does not honour is a 400
in OpenAI's shape that names it (docs/serving.md, "Sampling" and "API support")."""

from __future__ import annotations

import httpx
import openai
import pytest

from teamtr.serving.server import ServeConfig, ServedTeamConfig
from tests.support.serving import make_run_dir, serve_in_background

TASK = "12+7+30+5"
PINS = {
    "adder1": {"temperature": 0, "max_tokens": 2},
    "adder2": {"temperature": 0},
    "adder3": {"temperature": 0},
}


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    run = make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=1)
    config = ServeConfig(
        model=str(tiny_model_dir),
        teams={"chain": ServedTeamConfig(run_dir=str(run)), "pinned": ServedTeamConfig(run_dir=str(run), pinned=PINS)},
        tracing={"sqlite_path": None},
    )
    with serve_in_background(config) as server:
        yield server


def ask(served, **fields):
    body = {"model": "chain", "messages": [{"role": "user", "content": TASK}], **fields}
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60)
    return r


def ok(served, **fields) -> dict:
    r = ask(served, **fields)
    assert r.status_code == 200, r.text
    return r.json()


def turn_texts(body: dict) -> list[str]:
    return [t["text"] for t in body["teamtr"]["turns"]]


def test_max_tokens_caps_every_turn(served):
    free = ok(served)
    assert max(t["completion_tokens"] for t in free["teamtr"]["turns"]) > 3  # the cap below bites
    for field in ("max_tokens", "max_completion_tokens"):
        capped = ok(served, **{field: 3})
        assert all(t["completion_tokens"] <= 3 for t in capped["teamtr"]["turns"])
        assert capped["usage"]["completion_tokens"] <= 3 * len(capped["teamtr"]["turns"])
        assert {s["max_tokens"] for s in capped["teamtr"]["sampling"].values()} == {3}
    assert ask(served, max_tokens=3, max_completion_tokens=4).status_code == 400


def test_stop_cuts_every_turn(served):
    free = ok(served)
    longest = max(free["teamtr"]["turns"], key=lambda t: t["completion_tokens"])
    stop = longest["text"][1]  # a character the greedy team writes after the first token of a turn
    cut = ok(served, stop=[stop])
    assert all(stop not in text[:-1] for text in turn_texts(cut))  # a turn ends at it (tokens keep it)
    assert any(text.endswith(stop) for text in turn_texts(cut))
    assert stop not in cut["choices"][0]["message"]["content"]
    assert cut["usage"]["completion_tokens"] < free["usage"]["completion_tokens"]
    assert all(stop in s["stop"] and "\n" in s["stop"] for s in cut["teamtr"]["sampling"].values())
    assert (
        ok(served, stop=stop)["choices"][0]["message"]["content"] == cut["choices"][0]["message"]["content"]
    )


def test_temperature_zero_is_deterministic_and_one_samples(served):
    greedy = [ok(served, temperature=0)["choices"][0]["message"]["content"] for _ in range(2)]
    assert greedy[0] == greedy[1]
    sampled = {tuple(turn_texts(ok(served, temperature=1, seed=s))) for s in range(4)}
    assert len(sampled) > 1  # the request's temperature reached the engine


def test_seed_makes_a_sampled_request_reproducible(served):
    a, b = (ok(served, temperature=1, seed=1234) for _ in range(2))
    assert turn_texts(a) == turn_texts(b)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    others = {tuple(turn_texts(ok(served, temperature=1, seed=s))) for s in (1, 2, 3)}
    assert others != {tuple(turn_texts(a))}


def test_top_p_near_zero_is_greedy(served):
    greedy = turn_texts(ok(served, temperature=0))
    for seed in (1, 2):
        assert turn_texts(ok(served, temperature=1.5, top_p=1e-6, seed=seed)) == greedy


def test_n_runs_n_episodes_one_choice_each(served):
    one = ok(served, temperature=1, seed=99)
    three = ok(served, temperature=1, seed=99, n=3)
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    episodes = three["teamtr"]["choices"]
    assert [e["index"] for e in episodes] == [0, 1, 2]
    assert [[t["text"] for t in e["turns"]] for e in episodes][0] == turn_texts(one)  # choice 0 = n=1's
    assert len({tuple(t["text"] for t in e["turns"]) for e in episodes}) > 1  # the others differ
    tokens = sum(t["completion_tokens"] for e in episodes for t in e["turns"])
    assert three["usage"]["completion_tokens"] == tokens
    for i, e in enumerate(episodes):
        assert three["choices"][i]["message"]["content"] == e["turns"][-1]["text"].split("\n")[0]


def test_the_openai_client_gets_n_choices(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(
        model="chain", messages=[{"role": "user", "content": TASK}], n=2, temperature=1, seed=3
    )
    assert len(r.choices) == 2


def test_pinned_settings_win_over_the_request(served):
    r = ok(served, model="pinned", max_tokens=5)
    sampling = r["teamtr"]["sampling"]
    assert sampling["adder1"]["max_tokens"] == 2 and sampling["adder2"]["max_tokens"] == 5
    turns = {t["role"]: t["completion_tokens"] for t in r["teamtr"]["turns"]}
    assert turns["adder1"] <= 2
    assert all(s["temperature"] == 0 for s in sampling.values())
    # temperature is pinned for every role of this team: asking for it would change nothing, so: 400
    refused = ask(served, model="pinned", temperature=1)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "temperature"
    assert refused.json()["error"]["code"] == "pinned_by_team"


USER = {"role": "user", "content": TASK}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"store": True}, "store"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"verbosity": "low"}, "verbosity"),
        ({"best_of": 2}, "best_of"),
        ({"metadata": {"project": "x"}}, "metadata.project"),
        (
            {"stream_options": {"include_obfuscation": True}, "stream": True},
            "stream_options.include_obfuscation",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}, USER]},
            "messages.0",
        ),
        ({"messages": [{"role": "tool", "content": "4", "tool_call_id": "1"}, USER]}, "messages.0"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content",
        ),
    ],
)
def test_fields_the_team_does_not_honour_are_refused_by_name(served, fields, param):
    r = ask(served, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"].startswith(param)
    name = param.split(".")[-1]
    if not name.isdigit() and not param.endswith("content"):
        assert name in error["message"] and error["code"] == "unsupported_parameter"


def test_values_that_ask_for_nothing_are_accepted(served):
    """Null or OpenAI's neutral default asks for nothing: clients that always send them keep working."""
    baseline = ok(served)["choices"][0]["message"]["content"]
    neutral = ok(
        served,
        logprobs=False,
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        tools=[],
        response_format=None,
        tool_choice=None,
        store=False,
        user="someone",
        messages=[{"role": "assistant", "content": "hi", "refusal": None, "tool_calls": None}, USER],
    )
    assert isinstance(neutral["choices"][0]["message"]["content"], str)
    assert ok(served, logprobs=False)["choices"][0]["message"]["content"] == baseline


def test_the_openai_client_sees_a_bad_request_naming_the_field(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="chain", messages=[USER], logprobs=True, top_logprobs=2)
    assert e.value.body["param"] in {"logprobs", "top_logprobs"}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="chain", messages=[USER], response_format={"type": "json_object"}
        )
    assert e.value.body["param"] == "response_format"
