"""Every 5xx explains itself (issue 27): a user graph whose conditional edge returns an undeclared node
fails naming its graph, node and task, in training (the first held-out evaluation), in a bare episode and
in serving (a 500 whose message says so, a logged traceback, an episode span carrying the exception)."""

from __future__ import annotations

import asyncio
import logging
import sys
import textwrap
import types
from pathlib import Path
from typing import TypedDict

import httpx
import pytest
import yaml
from langgraph.graph import END, START, StateGraph

from teamtr.graphs.capture import describe_error, run_episode
from teamtr.graphs.run_layout import read_metrics
from teamtr.serving.server import ServeConfig
from teamtr.serving.span_reader import stored_spans
from teamtr.serving.tracing import EXCEPTION_MESSAGE, EXCEPTION_TYPE, OP_AGENT
from tests.support.serving import serve_in_background, write_versions

BROKEN_SOURCE = """
from langgraph.graph import END, START, MessagesState, StateGraph
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role

def roles():
    return [Role("solo", "unused", adapter="solo", sampling=SamplingParams(temperature=0.0, max_new_tokens=3))]

def build(models):
    async def answer(state):
        return {"messages": [await models.model("solo").ainvoke(state["messages"])]}
    g = StateGraph(MessagesState)
    g.add_node("answer", answer)
    g.add_node("critic", answer)
    g.add_edge(START, "answer")
    g.add_conditional_edges("answer", lambda state: "revisor", {"critic": "critic", END: END})
    g.add_edge("critic", END)
    return g.compile()
"""
broken = types.ModuleType("teamtr_test_broken_edge")
sys.modules[broken.__name__] = broken
exec(textwrap.dedent(BROKEN_SOURCE), broken.__dict__)


class _State(TypedDict):
    steps: list[str]


def test_an_episode_error_names_graph_node_and_task_and_keeps_its_type():
    g = StateGraph(_State)
    g.add_node("writer", lambda s: {"steps": [*s["steps"], "w"]})
    g.add_node("critic", lambda s: s)
    g.add_edge(START, "writer")
    g.add_conditional_edges("writer", lambda s: "revisor", {"critic": "critic", END: END})
    g.add_edge("critic", END)
    with pytest.raises(KeyError) as caught:  # the type stays: callers that map types still can
        asyncio.run(run_episode(g.compile(), "task", name="review", make_input=lambda t: {"steps": []}))
    text = describe_error(caught.value)
    assert text.startswith("KeyError: 'revisor'")
    assert "in graph 'review', node 'writer', task 'adhoc'" in text


@pytest.fixture(scope="module")
def broken_run(tiny_model_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("broken")
    write_versions(Path(tiny_model_dir), run, range(1), roles=("solo",))
    team = {
        "model": str(tiny_model_dir),
        "graph": f"{broken.__name__}:build",
        "roles": f"{broken.__name__}:roles",
    }
    (run / "config.yaml").write_text(yaml.safe_dump({"team": team}))
    return run


def test_a_served_crash_is_a_named_500_logged_with_its_traceback_and_on_its_span(broken_run, caplog):
    caplog.set_level(logging.ERROR, logger="teamtr.serving")
    body = {"model": "solo", "messages": [{"role": "user", "content": "hello"}]}
    with serve_in_background(ServeConfig.from_run_dir(broken_run, "solo")) as server:
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        streamed = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120)
    assert r.status_code == 500, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("internal error: KeyError: 'revisor'")
    assert "in graph 'solo', node 'answer', task 'chatcmpl-" in message
    assert "node 'answer'" in streamed.text and "KeyError" in streamed.text  # in-band, after the headers
    logged = [rec for rec in caplog.records if rec.name == "teamtr.serving" and rec.exc_info]
    assert logged and logged[0].exc_info[0] is KeyError and "revisor" in logged[0].getMessage()
    failed = [s for s in stored_spans(broken_run / "traces.db", OP_AGENT) if s.status == "ERROR"]
    assert len(failed) == 2
    assert failed[0].attributes[EXCEPTION_TYPE] == "KeyError"
    assert "node 'answer'" in failed[0].attributes[EXCEPTION_MESSAGE]


def test_the_first_held_out_evaluation_names_where_it_failed(broken_run, tmp_path):
    from teamtr.training.config import TrainConfig
    from teamtr.training.run_dir import RunDirError
    from teamtr.training.trainer import Trainer

    team = yaml.safe_load((broken_run / "config.yaml").read_text())["team"]
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "stages": 1,
            "team": {**team, "lora_rank": 4},
            "task": {"name": "chain"},
            "eval": {"stage_episodes": 1, "final_episodes": 1},
        }
    )
    with pytest.raises(RunDirError) as caught:
        Trainer(cfg).train()
    text = str(caught.value)
    assert text.startswith("held-out evaluation 'at the start' failed: KeyError: 'revisor'")
    # the user's graph, not the trainer's internal name for its evaluation team (issue 34 item 5)
    assert f"in graph '{broken.__name__}:build', node 'answer', task " in text
    (failed,) = read_metrics(cfg.run_dir, kind="failed")  # the run records why it stopped
    assert "revisor" in failed["error"] and failed["where"] == "run"
