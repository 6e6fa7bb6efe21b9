"""Tracing: a span per request and per turn with GenAI attributes, stored locally and exported by OTLP to a
real Phoenix server; stored spans + feedback round-trip into exactly the trajectories the team recorded."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from teamtr.cli.serve import app as cli_app
from teamtr.engines.vllm_server import free_port
from teamtr.graphs.trajectory import load_jsonl
from teamtr.serving.server import ServeConfig
from teamtr.serving.span_reader import stored_spans
from teamtr.serving.tracing import MissingTokensError, trajectories_from_store
from tests.support.serving import make_run_dir, serve_in_background

REPO = Path(__file__).resolve().parents[2]
PHOENIX = REPO / ".phoenix-venv" / "bin" / "phoenix"
TASKS = ["12+7+30+5", "3+4+5+6", "40+1+2+3"]


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    return make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=1)


def _serve(run_dir, db, **tracing):
    config = ServeConfig.from_run_dir(run_dir, "chain", tracing={"sqlite_path": str(db), **tracing})
    recorded = []
    return serve_in_background(config, on_trajectory=recorded.append), recorded


def test_served_conversations_round_trip_into_the_recorded_trajectories(run_dir, tmp_path):
    db = tmp_path / "traces.db"
    server, recorded = _serve(run_dir, db)
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        replies = [
            client.chat.completions.create(model="chain", messages=[{"role": "user", "content": t}])
            for t in TASKS
        ]
        rewards = {replies[0].id: 1.0, replies[2].id: -0.5}
        for conversation, reward in rewards.items():
            r = httpx.post(
                server.url + "/v1/feedback", json={"conversation_id": conversation, "reward": reward}
            )
            assert r.status_code == 200
        server.server.tracer.flush()
    out = tmp_path / "trajectories.jsonl"
    result = CliRunner().invoke(cli_app, ["traces", "to-trajectories", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    back = {t.task_id: t for t in load_jsonl(out)}
    assert len(back) == len(recorded) == len(TASKS)
    for traj in recorded:
        conversation = traj.metadata["conversation_id"]
        expected = dataclasses.replace(traj, reward=rewards.get(conversation, 0.0))
        assert back[traj.task_id] == expected  # token ids, log-probs, versions, text: all equal
        assert all(t.completion_ids and t.logprobs for t in back[traj.task_id].turns)
    only_rewarded = trajectories_from_store(db, require_reward=True)
    assert sorted(t.metadata["conversation_id"] for t in only_rewarded) == sorted(rewards)


def test_spans_carry_genai_semantic_conventions(run_dir, tmp_path):
    db = tmp_path / "traces.db"
    server, recorded = _serve(run_dir, db)
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="chain",
            messages=[{"role": "user", "content": TASKS[0]}],
            metadata={"conversation_id": "conv-42"},
        )
        assert reply.model_extra["teamtr"]["conversation_id"] == "conv-42"
        server.server.tracer.flush()
    spans = list(stored_spans(db))
    [episode] = [s for s in spans if s.attributes["gen_ai.operation.name"] == "invoke_agent"]
    turns = [s for s in spans if s.attributes["gen_ai.operation.name"] == "chat"]
    assert episode.name == "invoke_agent chain" and episode.status == "OK"
    assert episode.attributes["gen_ai.agent.name"] == "chain"
    assert episode.attributes["gen_ai.conversation.id"] == "conv-42"
    assert episode.attributes["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens
    assert episode.attributes["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens
    assert [s.attributes["gen_ai.agent.name"] for s in turns] == ["adder1", "adder2", "adder3"]
    for span, turn in zip(turns, recorded[0].turns, strict=True):
        assert span.parent_span_id == episode.span_id and span.trace_id == episode.trace_id
        assert span.attributes["gen_ai.request.model"] == f"{turn.role}@v1"
        assert span.attributes["gen_ai.usage.input_tokens"] == len(turn.prompt_ids)
        assert span.attributes["gen_ai.usage.output_tokens"] == len(turn.completion_ids)
        assert span.attributes["gen_ai.conversation.id"] == "conv-42"
        assert episode.start_ns <= span.start_ns <= span.end_ns <= episode.end_ns


def test_without_token_capture_spans_hold_no_ids_and_conversion_says_why(run_dir, tmp_path):
    db = tmp_path / "traces.db"
    server, _ = _serve(run_dir, db, capture_tokens=False)
    with server:
        openai.OpenAI(base_url=server.url + "/v1", api_key="none").chat.completions.create(
            model="chain", messages=[{"role": "user", "content": TASKS[1]}]
        )
        server.server.tracer.flush()
    turns = list(stored_spans(db, operation="chat"))
    assert len(turns) == 3 and not any("teamtr.turn.prompt_ids" in s.attributes for s in turns)
    with pytest.raises(MissingTokensError, match="token capture"):
        trajectories_from_store(db)


# ---- a real OTLP receiver: Arize Phoenix in its own virtual environment ----------------------------------


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    if not PHOENIX.exists():
        pytest.skip("Phoenix is not installed (.phoenix-venv): scripts/setup_phoenix.sh could not install it")
    port, grpc_port = free_port(), free_port()
    workdir = tmp_path_factory.mktemp("phoenix")
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(workdir),
    }
    log = open(workdir / "phoenix.log", "wb")
    process = subprocess.Popen(
        [str(PHOENIX), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"phoenix exited: {(workdir / 'phoenix.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("phoenix did not become healthy in 180 s")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
        log.close()


@pytest.mark.phoenix
def test_phoenix_receives_turn_spans_by_otlp(run_dir, tmp_path, phoenix):
    server, recorded = _serve(run_dir, tmp_path / "traces.db", otlp_endpoint=phoenix + "/v1/traces")
    with server:
        openai.OpenAI(base_url=server.url + "/v1", api_key="none").chat.completions.create(
            model="chain",
            messages=[{"role": "user", "content": TASKS[2]}],
            metadata={"conversation_id": "phx-1"},
        )
        assert server.server.tracer.flush()
    spans = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(spans) < 4:
        spans = [
            s
            for s in httpx.get(phoenix + "/v1/projects/default/spans", params={"limit": 100}).json()["data"]
            if s["attributes"].get("gen_ai.conversation.id") == "phx-1"
        ]
        time.sleep(0.5)
    by_op = {}
    for s in spans:
        by_op.setdefault(s["attributes"]["gen_ai.operation.name"], []).append(s)
    [episode] = by_op["invoke_agent"]
    turns = sorted(by_op["chat"], key=lambda s: s["attributes"]["teamtr.turn.index"])
    assert episode["attributes"]["gen_ai.agent.name"] == "chain"
    assert [s["attributes"]["gen_ai.agent.name"] for s in turns] == ["adder1", "adder2", "adder3"]
    for span, turn in zip(turns, recorded[0].turns, strict=True):
        assert span["parent_id"] == episode["context"]["span_id"]
        assert span["attributes"]["gen_ai.request.model"] == f"{turn.role}@v1"
        assert span["attributes"]["gen_ai.usage.output_tokens"] == len(turn.completion_ids)
        assert span["attributes"]["teamtr.turn.completion_ids"] == turn.completion_ids
        assert span["attributes"]["teamtr.turn.logprobs"] == turn.logprobs
