"""Tool calls through the real vLLM engine: a role whose tiny model was taught (in this test) to
call a tool and then answer from its result runs a `model -> tools_condition -> ToolNode -> model` graph
on a vLLM server of that model, in a rollout and behind the chat API; the call is parsed from vLLM's text
into `tool_calls`, ToolNode runs it, the next prompt holds the result, and the turns and the trace spans
record it (docs/graphs.md "Tools")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.messages.tool import tool_call
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from transformers import AutoTokenizer

from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_server import VLLMServer, start_vllm_server
from teamtr.graphs.capture import GraphTeam
from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.role_models import RoleModels
from teamtr.graphs.roles import Role
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.tool_calls import format_tool_call

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # the session's vLLM server starts in 30 s or more

torch.set_num_threads(1)

QUESTION = "4+1?"
ANSWER = "It is 5."


@tool
def inc(x: int) -> int:
    """Add one."""
    return x + 1


CALL = format_tool_call("inc", {"x": 4})
# the tool as the model sees it, as short as an OpenAI tool can be (ToolNode still checks `inc`'s own
# schema): the tiny model's context is 512 tokens, and vLLM refuses prompt + max_tokens beyond it
SCHEMA = {"type": "function", "function": {"name": "inc", "parameters": {"type": "object"}}}


def roles(adapter: str | None = "agent") -> list[Role]:
    """One role (with its own adapter when served); greedy, so the taught completions come back exactly."""
    return [Role("agent", "", adapter=adapter, sampling=SamplingParams(temperature=0.0, max_new_tokens=72))]


def build(models: RoleModels):
    """agent -> tools_condition -> ToolNode -> agent (the config's `team.graph` in the serving test)."""
    agent = models.model("agent").bind_tools([SCHEMA])

    async def act(state: MessagesState) -> dict:
        return {"messages": [await agent.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", act)
    g.add_node("tools", ToolNode([inc], handle_tool_errors=True))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def contexts(tokenizer) -> tuple[list[int], list[int]]:
    """The prompt ids of the agent's two turns: the question; the question, the call and its result."""
    tools = [convert_to_openai_tool(SCHEMA)]
    question = [HumanMessage(QUESTION)]
    called = [*question, AIMessage("", tool_calls=[tool_call(name="inc", args={"x": 4}, id="c")]),
              ToolMessage("5", tool_call_id="c", name="inc")]  # fmt: skip
    return render_prompt_ids(tokenizer, question, tools=tools), render_prompt_ids(tokenizer, called, tools=tools)


@pytest.fixture(scope="module")
def taught_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' tiny random Llama fine-tuned (~150 steps, ~15 s) until greedy decoding writes the call
    after the question and the answer after the result, with a margin so vLLM's numerics decode the same.
    (A LoRA adapter on the frozen random model does not learn this: the whole model is tuned.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.vllm import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("taught") / "model")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = []
    for prompt, completion in zip(contexts(tok), [CALL, ANSWER], strict=True):
        target = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((torch.tensor([prompt + target]), len(prompt)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(400):
        opt.zero_grad()
        losses = []
        for ids, n in rows:
            labels = ids.clone()
            labels[0, :n] = -100  # the completion only, as in training
            losses.append(model(input_ids=ids, labels=labels).loss)
        if max(loss.item() for loss in losses) < 0.01:
            break
        sum(losses).backward()
        opt.step()
    assert max(loss.item() for loss in losses) < 0.01, "the model did not learn the call"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def taught_server(taught_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A vLLM server of its own for the taught model (the session's server serves the random one)."""
    from tests.support.vllm import vllm_skip_reason

    reason = vllm_skip_reason()
    if reason:
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("vllm-tools-log") / "server.log"
    server = start_vllm_server(taught_model_dir, served_model_name="tiny-tools", max_loras=2, log_path=str(log))
    try:
        yield server
    finally:
        server.stop()


async def test_a_rollout_on_vllm_calls_the_tool_and_reads_its_result(taught_server):
    engine = VLLMEngine({"base": taught_server})
    first, second = contexts(engine.tokenizer())
    try:
        team = GraphTeam(build(RoleModels(engine, roles(adapter=None))), name="tools", roles=["agent"])
        (trajectory,) = await team.rollout([TaskInstance(id="t", prompt=QUESTION, answer=None)], seed=0)
    finally:
        engine.close()
    call, answer = trajectory.turns
    assert call.text == CALL and call.prompt_ids == first
    assert [(c["name"], c["arguments"]) for c in call.tool_calls] == [("inc", {"x": 4})]
    assert call.invalid_tool_calls == []
    assert answer.prompt_ids == second  # the ToolNode's result, rendered by the template, as vLLM saw it
    assert answer.text == ANSWER and answer.tool_calls == [] and trajectory.final_answer == ANSWER
    assert all(len(t.logprobs) == len(t.completion_ids) > 0 for t in trajectory.turns)


def test_a_served_team_on_vllm_calls_the_tool_and_traces_it(taught_server, taught_model_dir, tmp_path):
    from teamtr.serving.server import ServeConfig
    from teamtr.serving.tracing import trajectories_from_store
    from tests.support.serving import serve_in_background, write_versions

    run = tmp_path / "tools"
    # the role's adapter as the trainer writes it, with B = 0: the served role speaks as the taught model
    write_versions(taught_model_dir, run, range(1, 2), roles=("agent",), scale=0.0)
    graph = {"graph": f"{__name__}:build", "roles": f"{__name__}:roles", "model": str(taught_model_dir)}
    (run / "config.yaml").write_text(yaml.safe_dump({"team": graph}))
    config = ServeConfig.from_run_dir(run, engine="vllm", vllm_url=taught_server.url)  # traces: run/traces.db
    recorded = []
    with serve_in_background(config, on_trajectory=recorded.append) as server:
        body = {"model": "tools", "messages": [{"role": "user", "content": QUESTION}]}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == ANSWER
    assert [t["text"] for t in r.json()["teamtr"]["turns"]] == [CALL, ANSWER]
    (served,) = recorded
    (traced,) = trajectories_from_store(run / "traces.db")
    first, second = contexts(AutoTokenizer.from_pretrained(taught_model_dir))
    for trajectory in (served, traced):  # the episode as it ran, and as its spans give it back
        call, answer = trajectory.turns
        assert [(c["name"], c["arguments"]) for c in call.tool_calls] == [("inc", {"x": 4})]
        assert call.prompt_ids == first and answer.prompt_ids == second and answer.tool_calls == []
    assert traced.turns[0].tool_calls == served.turns[0].tool_calls  # the call's id too
