"""A user's own LangGraph graph streams its answer live (serving/token_stream.py, `answer_role`): the
client receives the first content chunk while the answering turn is still being decoded.

How "still being decoded" is made certain, not timed: the graph's answering node calls its model with a
callback of its own (`HoldUntilSeen`) that, at the first decoded piece, waits for the test to say it has
received a content chunk. Until then the turn cannot end (the model's call awaits its callbacks for every
piece). Were the answer sent only when the episode ends, the test would never see content before the
callback gave up waiting, and the test fails."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import yaml
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph

from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role
from teamtr.serving.server import ServeConfig
from tests.support.serving import make_run_dir, serve_in_background

SEEN = threading.Event()  # set by the test once a content chunk arrived
HOLD_S = 120.0  # only a bound against hanging: the callback gives up after this
held: list[bool] = []  # per answering turn: True if the test's signal came while the turn was decoding


def roles() -> list[Role]:
    say = SamplingParams(temperature=0.0, max_new_tokens=6, stop=())  # every decoded piece is answer text
    return [
        Role("adder1", "Draft an answer.", adapter="adder1", sampling=say),
        Role("adder2", "Give the final answer.", adapter="adder2", sampling=say),
    ]


class HoldUntilSeen(AsyncCallbackHandler):
    """At the first non-empty piece of the call it is given to, wait for the test's signal."""

    run_inline = False  # after the server's own (inline) turn recorder has forwarded the piece

    def __init__(self) -> None:
        self.waited = False

    async def on_llm_new_token(self, token: str, **kwargs) -> None:
        if token and not self.waited:
            self.waited = True
            held.append(await asyncio.to_thread(SEEN.wait, HOLD_S))


def build(models):
    """drafter (adder1) -> answerer (adder2) -> END over the chat's messages."""

    async def drafter(state: MessagesState) -> dict:
        messages = [SystemMessage(models.role("adder1").system_prompt), *state["messages"]]
        return {"messages": [await models.model("adder1").ainvoke(messages)]}

    async def answerer(state: MessagesState, config: RunnableConfig) -> dict:
        draft = state["messages"][-1].content
        messages = [SystemMessage(models.role("adder2").system_prompt), HumanMessage(f"draft: {draft}")]
        # the invocation's callbacks (the server's turn recorder among them) and the hold, for this call
        callbacks = config["callbacks"].copy()
        callbacks.add_handler(HoldUntilSeen(), inherit=False)
        reply = await models.model("adder2").ainvoke(messages, config={**config, "callbacks": callbacks})
        return {"messages": [AIMessage(reply.content)]}

    graph = StateGraph(MessagesState)
    graph.add_node("drafter", drafter)
    graph.add_node("answerer", answerer)
    graph.add_edge(START, "drafter")
    graph.add_edge("drafter", "answerer")
    graph.add_edge("answerer", END)
    return graph.compile()


def test_a_user_graph_streams_its_answer_while_the_last_turn_is_decoded(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    team = {"graph": f"{__name__}:build", "roles": f"{__name__}:roles", "model": str(tiny_model_dir)}
    (run / "config.yaml").write_text(yaml.safe_dump({"team": team}))
    config = ServeConfig.from_run_dir(run, "graph", tracing={"sqlite_path": None})
    config.teams["graph"].answer_role = "adder2"
    finished = []
    SEEN.clear()
    held.clear()
    with serve_in_background(config, on_trajectory=finished.append) as server:
        body = {"model": "graph", "messages": [{"role": "user", "content": "12+7"}], "stream": True}
        content = []
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                if delta:
                    content.append(delta)
                    SEEN.set()  # the answering turn may end now
    assert held == [True]  # the first content chunk came while the answering turn was being decoded
    (trajectory,) = finished
    assert [t.role for t in trajectory.turns] == ["adder1", "adder2"]
    assert "".join(content) == trajectory.final_answer == trajectory.turns[-1].text
