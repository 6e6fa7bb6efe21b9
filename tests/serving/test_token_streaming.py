"""Token streaming on a real server: the answer's tokens arrive as content deltas while they are decoded,
add up to the non-streamed answer, and the per-turn extension streams every role's tokens."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.engine import SamplingParams
from teamtr.serving.server import ServeConfig
from teamtr.serving.token_stream import AnswerStream, safe_prefix
from tests.support.serving import make_run_dir, serve_in_background

API_KEY = "sk-test-key"
TASK = "12+7+30+5"
MESSAGES = [{"role": "user", "content": TASK}]



@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    run = make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=1)
    config = ServeConfig.from_run_dir(run, "chain", api_keys=[API_KEY])
    with serve_in_background(config) as server:
        yield server


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0)


async def test_embedded_pieces_add_up_to_the_text_and_change_nothing_sampled(tiny_model_dir):
    """Random tokens at T = 1.5 (byte pieces that merge into characters among them): the pieces add up to
    the decoded text, and the same seed samples the same tokens with or without a callback."""
    engine = EmbeddedEngine(tiny_model_dir, threads=1)
    prompt = engine.tokenizer()("12+7+30+5", add_special_tokens=False)["input_ids"]
    for seed in range(4):
        sampling = SamplingParams(temperature=1.5, max_new_tokens=24, seed=seed)
        pieces: list[str] = []
        streamed = await engine.generate(prompt, adapter=None, sampling=sampling, on_token=pieces.append)
        plain = await engine.generate(prompt, adapter=None, sampling=sampling)
        assert "".join(pieces) == streamed.text == plain.text
        assert "\ufffd" not in "".join(pieces[:-1])  # no half character sent ahead of its other bytes
        assert streamed.completion_ids == plain.completion_ids and streamed.logprobs == plain.logprobs


def test_a_stop_string_is_held_back_until_it_is_ruled_out():
    assert safe_prefix("answer: 4", ("\n\nEND",)) == "answer: 4"
    assert safe_prefix("answer: 4\n", ("\n\nEND",)) == "answer: 4"  # may be the start of the stop
    assert safe_prefix("answer: 4\n\nEN", ("\n\nEND",)) == "answer: 4"
    assert safe_prefix("answer: 4\n\nEND more", ("\n\nEND",)) == "answer: 4"
    answer = AnswerStream(final_turn=1, stops_of={"b": ("##",)})
    sent = [answer.piece(0, "a", "not the answer"), answer.piece(1, "b", "4#"), answer.piece(1, "b", "2")]
    sent += [answer.piece(1, "b", "##tail"), answer.finish("4#2")]
    assert sent == ["", "4", "#2", "", ""]


def content_deltas(chunks) -> list[str]:
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


def test_the_answer_streams_token_by_token_and_adds_up_to_the_unstreamed_answer(client):
    settings = {"model": "chain", "messages": MESSAGES, "temperature": 0, "seed": 3, "max_tokens": 12}
    whole = client.chat.completions.create(**settings)
    chunks = list(
        client.chat.completions.create(**settings, stream=True, stream_options={"include_usage": True})
    )
    deltas = content_deltas(chunks)
    assert whole.choices[0].message.content  # a non-empty answer to stream
    assert len(deltas) > 1
    assert "".join(deltas) == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    # the final turn's completion tokens, one piece per token at most (merged bytes come out together)
    assert len(deltas) <= whole.model_extra["teamtr"]["turns"][-1]["completion_tokens"]


def test_the_first_content_arrives_before_the_stream_ends(client):
    stream = client.chat.completions.create(
        model="chain", messages=MESSAGES, temperature=0, max_tokens=12, stream=True
    )
    events = []
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            events.append("content")
        if c.choices and c.choices[0].finish_reason:
            events.append("finish")
    assert events.count("content") > 1 and events[-1] == "finish"


def test_the_per_turn_extension_streams_every_roles_tokens_as_it_speaks(served):
    body = {
        "model": "chain",
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_turns": True},
    }
    with httpx.stream(
        "POST",
        served.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    ) as r:
        assert r.status_code == 200
        lines = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(e) for e in lines[:-1]]
    turns = [c["teamtr_turn"] for c in chunks if "teamtr_turn" in c]
    assert [t["role"] for t in turns] == ["adder1", "adder2", "adder3"]
    streamed = 0
    for turn in turns:
        at = next(i for i, c in enumerate(chunks) if c.get("teamtr_turn") == turn)
        pieces = [c["teamtr_token"] for c in chunks if c.get("teamtr_token", {}).get("index") == turn["index"]]
        # every piece of the turn went out before the turn's own chunk, and they add up to its text
        before = [c["teamtr_token"] for c in chunks[:at] if c.get("teamtr_token", {}).get("index") == turn["index"]]
        assert before == pieces
        assert {p["role"] for p in pieces} == {turn["role"]}
        assert "".join(p["text"] for p in pieces) == turn["text"]
        streamed += len(pieces)
    assert streamed > len(turns)  # token by token, not one piece per turn
    answer = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert "".join(answer) == turns[-1]["text"].split("\n")[0]


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_streams_the_same_tokens_it_returns_unstreamed(vllm_server, vllm_model_dir, tmp_path):
    """On the real vLLM engine the streamed turns (assembled from vLLM's streamed chunks) carry the same
    token ids and log-probs as the unstreamed ones, and the answer streams in several deltas."""
    run = make_run_dir(vllm_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig.from_run_dir(run, "chain", engine="vllm", vllm_url=vllm_server.url)
    recorded = []
    with serve_in_background(config, on_trajectory=recorded.append) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        # the tiny random model's answer is sometimes empty (its last turn opens with the stop "\n"): take
        # the first task whose answer has something to stream
        for task in ("12+7+30+5", "3+4+5+6", "40+1+2+3", "9+9+9+9", "1+2", "77+8"):
            settings = {"model": "chain", "messages": [{"role": "user", "content": task}], "temperature": 0}
            whole = client.chat.completions.create(**settings, max_tokens=12)
            if len(whole.choices[0].message.content or "") > 1:
                break
        chunks = list(
            client.chat.completions.create(
                **settings,
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True, "include_turns": True},
            )
        )
    deltas = content_deltas(chunks)
    assert "".join(deltas) == whole.choices[0].message.content
    assert len(deltas) > 1
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens
    pieces = [c.model_extra["teamtr_token"] for c in chunks if c.model_extra.get("teamtr_token")]
    unstreamed, streamed = recorded[-2:]
    assert len(pieces) > len(streamed.turns)
    for i, turn in enumerate(streamed.turns):
        assert "".join(p["text"] for p in pieces if p["index"] == i) == turn.text
    for a, b in zip(unstreamed.turns, streamed.turns, strict=True):
        assert a.completion_ids == b.completion_ids and a.text == b.text
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) < 1e-4
