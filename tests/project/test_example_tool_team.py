"""examples/tool_team.py end to end: TeamTR trains the tool-using team briefly on a tiny random Llama, then
`teamtr serve` (its own process) holds a three-request conversation on one thread with the `openai`
client; request 3's episode sees requests 1-2 from the LangGraph checkpoint, and after a restart of the
server the same thread goes on (docs/serving.md "Threads"). The tool team's warm start
(examples/tool_team_warm.py, a short build here) makes a solver that writes `<tool_call>` blocks which
the example's ToolNode runs, and the served thread then holds tool calls. With a scripted solver (a langchain-core fake
chat model), bad tool calls come back as error ToolMessages and the round guard ends a calling loop."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import warnings
from pathlib import Path

import httpx
import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from transformers import AutoTokenizer

from teamtr.graphs.capture_callback import ForeignModelWarning
from teamtr.serving.conversations import threads_path
from teamtr.serving.threads import thread_config
from teamtr.serving.tracing import trajectories_from_store
from tests.support.example_graphs import ROOT, example_config, train
from tests.support.serve_process import serve_process

QUESTIONS = ["2+3+4+5", "6+1+1+7", "9+9+2+1", "4+4+4+4"]
THREAD = "tool-thread-1"


WARM_TEST_STEPS = 150  # half the example's build: enough for well-formed calls (docs/graphs.md "Tools")


@pytest.fixture(scope="module")
def warm_model_dir(tmp_path_factory) -> Path:
    """A short build of the tool team's warm start (about a minute on one idle core) whose solver is shown
    a call in nine demonstrations of ten, so that the served thread's sampled turns hold calls."""
    from examples.tool_team_warm import build
    from teamtr.training.warmstart.tool_demos import ToolDemoMix

    path = tmp_path_factory.mktemp("tool_warm") / "model"
    build(path, steps=WARM_TEST_STEPS, mix=ToolDemoMix(call_rate=0.9, slip_rate=0.0))
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


@pytest.mark.slow  # a warm start, a short training and two server processes
def test_the_tool_team_trains_and_serves_a_thread_across_a_restart(warm_model_dir, tmp_path):
    import openai

    model_dir = warm_model_dir
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
    # the warm-started solver uses the tool in the thread: a call, then a turn that reads its result
    assert any(turn.tool_calls for e in episodes for turn in e.turns)
    assert any("<tool_response>" in tokenizer.decode(t.prompt_ids) for e in episodes for t in e.turns)
    first = tokenizer.decode(episodes[0].turns[0].prompt_ids)
    assert QUESTIONS[1] not in first and QUESTIONS[2] not in first

    # the conversation is the checkpointed graph state (MessagesState), not a folded string
    saved = _checkpoint_messages(threads_path(run_dir / "conversations.db"))
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
    saved = _checkpoint_messages(threads_path(run_dir / "conversations.db"))
    assert [m.content for m in saved if m.type == "human"] == QUESTIONS


@pytest.mark.slow  # the warm start's build
def test_the_warm_started_solver_writes_tool_calls_that_the_tool_node_runs(warm_model_dir):
    """Greedy, on the base model alone: the solver writes well-formed `<tool_call>` blocks, ToolNode runs
    `calc` on them (a success ToolMessage with the value of the expression the solver wrote), and the
    solver's next turn sees the result."""
    import dataclasses

    from examples.review_loop import calculate
    from examples.tool_team import build, make_input, roles
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.graphs.capture import run_episode
    from teamtr.graphs.role_models import RoleModels
    from teamtr.tasks.chain import ChainArithmetic

    greedy = [dataclasses.replace(r, adapter=None, sampling=dataclasses.replace(r.sampling, temperature=0.0))
              for r in roles()]  # fmt: skip
    graph = build(RoleModels(EmbeddedEngine(str(warm_model_dir), threads=1), greedy))
    family = ChainArithmetic(steps=3)
    states: list[dict] = []

    async def episodes():
        return await asyncio.gather(*[
            run_episode(graph, task, make_input=make_input, reward=lambda t, state: states.append(state) or 0.0)
            for task in family.generate(8, seed=11)
        ])  # fmt: skip

    trajectories = asyncio.run(episodes())
    calls = [(turn, call) for t in trajectories for turn in t.turns for call in turn.tool_calls]
    assert len(calls) >= 2, "the warm-started solver wrote no tool calls"
    assert all(call["name"] == "calc" and set(call["arguments"]) == {"expression"} for _, call in calls)
    results = {m.tool_call_id: m for state in states for m in state["messages"] if m.type == "tool"}
    ran = [results[call["id"]] for _, call in calls if call["id"] in results]
    assert len(ran) == len(calls)  # every valid call went through ToolNode
    for (_, call), result in zip(calls, ran, strict=True):
        assert result.status == "success"
        assert result.content == str(calculate(call["arguments"]["expression"]))
    for t in trajectories:  # after a call the solver acts on the tool's result
        for before, after in zip(t.turns, t.turns[1:], strict=False):
            if before.tool_calls:
                assert after.role == "solver" and len(after.prompt_ids) > len(before.prompt_ids)


def _checkpoint_messages(path: Path) -> list:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with sqlite3.connect(path) as conn:
        found = SqliteSaver(conn).get_tuple(thread_config(THREAD))
    assert found is not None, f"no checkpoint of thread {THREAD} in {path}"
    return found.checkpoint["channel_values"]["messages"]


class ScriptedModel(GenericFakeChatModel):
    """A real langchain-core chat model that replies from a script and accepts tools (as a solver must)."""

    def bind_tools(self, tools, **kwargs):
        return self


def _scripted_episode(solver_replies: list, reviewer_reply: str) -> tuple:
    from langchain_core.messages import AIMessage

    from examples.tool_team import build, make_input, roles
    from teamtr.graphs.capture import run_episode
    from teamtr.graphs.role_models import RoleModels
    from teamtr.graphs.task import TaskInstance

    models = {"solver": ScriptedModel(messages=iter(solver_replies)),
              "reviewer": ScriptedModel(messages=iter([AIMessage(reviewer_reply)]))}  # fmt: skip
    states = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ForeignModelWarning)
        trajectory = asyncio.run(
            run_episode(
                build(RoleModels(None, roles(), models)),
                TaskInstance(id="t", prompt="3+7+9+5", answer=None),
                make_input=make_input,
                reward=lambda task, state: states.append(state) or 0.0,
            )
        )
    return trajectory, states[0]


def test_bad_tool_calls_come_back_as_errors_and_the_episode_goes_on():
    """The example's ToolNode: a raising tool (calc on a non-expression), an unknown tool and arguments
    that fail the schema each give the solver an error ToolMessage; it calls again, reads the value, and
    the reviewer answers. The trajectory records every call."""
    from langchain_core.messages import AIMessage
    from langchain_core.messages.tool import tool_call

    bad = [tool_call(name="calc", args={"expression": "two plus"}, id="raises"),
           tool_call(name="abacus", args={}, id="unknown"),
           tool_call(name="calc", args={"expr": 3}, id="schema")]  # fmt: skip
    good = [tool_call(name="calc", args={"expression": "3+7+9+5"}, id="good")]
    trajectory, state = _scripted_episode(
        [AIMessage("", tool_calls=bad), AIMessage("", tool_calls=good), AIMessage("24")], "24"
    )
    assert [t.role for t in trajectory.turns] == ["solver", "solver", "solver", "reviewer"]
    assert [c["id"] for c in trajectory.turns[0].tool_calls] == ["raises", "unknown", "schema"]
    assert trajectory.turns[1].tool_calls[0]["arguments"] == {"expression": "3+7+9+5"}
    results = {m.tool_call_id: m for m in state["messages"] if m.type == "tool"}
    assert all(results[i].status == "error" for i in ("raises", "unknown", "schema"))
    assert "not an integer + - * expression" in results["raises"].content
    assert "abacus is not a valid tool" in results["unknown"].content
    assert "expression" in results["schema"].content  # the missing field, named by the schema check
    assert results["good"].content == "24" and results["good"].status == "success"
    assert trajectory.final_answer == "24" and state["tool_rounds"] == 2


def test_a_solver_that_keeps_calling_is_stopped_by_the_round_guard():
    from langchain_core.messages import AIMessage
    from langchain_core.messages.tool import tool_call

    from examples.tool_team import MAX_TOOL_ROUNDS

    calls = [AIMessage("", tool_calls=[tool_call(name="calc", args={"expression": "1+1"}, id=f"c{k}")])
             for k in range(MAX_TOOL_ROUNDS + 3)]  # fmt: skip
    trajectory, state = _scripted_episode(calls, "2")
    roles = [t.role for t in trajectory.turns]
    assert roles == ["solver"] * (MAX_TOOL_ROUNDS + 1) + ["reviewer"]
    assert sum(m.type == "tool" for m in state["messages"]) == MAX_TOOL_ROUNDS
