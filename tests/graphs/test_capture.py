"""Episode capture of an arbitrary LangGraph graph (graphs/capture.py, graphs/role_models.py).

The graph under test is written the way a user writes one: its own TypedDict state, a non-LLM checker
node, a conditional edge that loops back to the planner, two roles working in parallel via `Send` on
private views, and a merge role inside a subgraph. Its only teamtr-specific code is
`team.model("<role>")`. The engine is wrapped in a recording proxy (the `Engine` protocol, nothing
mocked underneath) that notes every `Generation` it hands out and which episode asked for it, through a
context variable the test sets itself: an account of what was sampled kept apart from the capture.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.random_adapters import randomise_adapters
from teamtr.graphs.capture import EpisodeLimitError, GraphTeam, RewardError, run_episode
from teamtr.graphs.capture_callback import ForeignModelWarning
from teamtr.graphs.engine import Engine, Generation, SamplingParams
from teamtr.graphs.role_models import RoleModels, UnknownRoleError
from teamtr.graphs.roles import Role
from teamtr.graphs.seeds import derive_seed
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.team import Team, TeamError, load_router

ROLE_NAMES = ("planner", "left", "right", "merger")
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=8, stop=("\n",))
EPISODE: contextvars.ContextVar[int | None] = contextvars.ContextVar("episode", default=None)


class RecordingEngine:
    """An `Engine` that forwards to a real one and records each generation with the asking episode."""

    def __init__(self, inner: EmbeddedEngine) -> None:
        self.inner = inner
        self.records: list[tuple[int | None, str | None, Generation]] = []  # (episode, adapter, gen)

    def tokenizer(self, base: str = "base"):
        return self.inner.tokenizer(base)

    def base_models(self) -> list[str]:
        return self.inner.base_models()

    def adapter_version(self, adapter: str | None, base: str = "base") -> int:
        return self.inner.adapter_version(adapter, base)

    async def generate(self, prompt_ids, *, adapter, sampling, base="base") -> Generation:
        gen = await self.inner.generate(prompt_ids, adapter=adapter, sampling=sampling, base=base)
        self.records.append((EPISODE.get(), adapter, gen))
        return gen

    async def load_adapter(self, name: str, path: str, base: str = "base") -> None:
        await self.inner.load_adapter(name, path, base)

    async def unload_adapter(self, name: str, base: str = "base") -> None:
        await self.inner.unload_adapter(name, base)

    def score(self, prompts, completions, adapter, base="base"):
        return self.inner.score(prompts, completions, adapter, base)


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> RecordingEngine:
    eng = EmbeddedEngine(tiny_model_dir, adapters={r: None for r in ROLE_NAMES}, threads=1)
    randomise_adapters(eng, ROLE_NAMES, std=0.3, seed=2)  # differ from the base and from each other
    proxy = RecordingEngine(eng)
    assert isinstance(proxy, Engine)
    return proxy


def roles() -> list[Role]:
    return [Role(name, f"You are the {name}.", adapter=name, sampling=SAMPLING) for name in ROLE_NAMES]


# ---- the user's graph ---------------------------------------------------------------------------------


class ReviewState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    plans: Annotated[list[str], operator.add]
    drafts: Annotated[list[str], operator.add]
    checks: int


class WorkerView(TypedDict):  # what one parallel branch sees: its own private view, not the state
    role: str
    view: str


class MergeState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    drafts: list[str]


class MergeOutput(TypedDict):  # the subgraph hands back only its message (drafts would add up twice)
    messages: Annotated[list[AnyMessage], add_messages]


MAX_PLANS = 3


def review_graph(team: RoleModels):
    async def plan(state: ReviewState) -> dict:
        context = [SystemMessage("Plan."), state["messages"][0], *(AIMessage(p) for p in state["plans"])]
        reply = await team.model("planner").ainvoke(context)
        return {"plans": [reply.content]}

    def check(state: ReviewState) -> dict:  # a deterministic checker: no LLM
        return {"checks": state.get("checks", 0) + 1}

    def after_check(state: ReviewState) -> Any:
        if len(state["plans"][-1]) % 2 == 1 and len(state["plans"]) < MAX_PLANS:
            return "plan"  # the checker failed: back to the planner
        plan_text = state["plans"][-1]
        return [Send("work", {"role": r, "view": f"{r}:{plan_text}"}) for r in ("left", "right")]

    async def work(view: WorkerView) -> dict:
        reply = await team.model(view["role"]).ainvoke([SystemMessage("Work."), HumanMessage(view["view"])])
        return {"drafts": [f"{view['role']}={reply.content}"]}

    async def combine(state: MergeState) -> dict:
        reply = await team.model("merger").ainvoke(
            [SystemMessage("Merge."), HumanMessage("|".join(sorted(state["drafts"])))]
        )
        return {"messages": [reply]}

    merge = StateGraph(MergeState, output_schema=MergeOutput)
    merge.add_node("combine", combine)
    merge.add_edge(START, "combine")
    merge.add_edge("combine", END)

    g = StateGraph(ReviewState)
    g.add_node("plan", plan)
    g.add_node("check", check)
    g.add_node("work", work)
    g.add_node("merge", merge.compile())
    g.add_edge(START, "plan")
    g.add_edge("plan", "check")
    g.add_conditional_edges("check", after_check, ["plan", "work"])
    g.add_edge("work", "merge")
    g.add_edge("merge", END)
    return g.compile()


def drafts_reward(task: TaskInstance, state: dict) -> float:
    return float(len(state["drafts"])) + 0.5 * state["checks"]


def tasks(n: int) -> list[TaskInstance]:
    return [TaskInstance(id=f"t{i}", prompt=f"{i}+{i % 7}+{i % 3}", answer=None) for i in range(n)]


# ---- (a) capture is exact ------------------------------------------------------------------------------


def test_capture_is_exact_for_32_concurrent_invocations(engine):
    team = RoleModels(engine, roles())
    graph = GraphTeam(review_graph(team), name="review", roles=ROLE_NAMES, reward=drafts_reward)
    instances = tasks(32)
    engine.records.clear()
    batches_before = engine.inner.decode_batches

    async def episode(i: int):
        EPISODE.set(i)  # the proxy's own account of who asked; the capture never reads it
        return await graph.arun(instances[i], seed=100 + i)

    async def all_episodes():
        return await asyncio.gather(*(episode(i) for i in range(32)))

    trajectories = asyncio.run(all_episodes())
    tok = engine.tokenizer()
    assert len(engine.records) == sum(len(t.turns) for t in trajectories)  # nothing lost, nothing extra
    assert engine.inner.decode_batches - batches_before < len(engine.records) / 4  # they really ran together
    plan_counts = set()
    for i, traj in enumerate(trajectories):
        sampled = [(adapter, g) for ep, adapter, g in engine.records if ep == i]
        assert len(sampled) == len(traj.turns), f"episode {i}"
        for turn, (adapter, gen) in zip(traj.turns, sampled, strict=True):  # call order, turn by turn
            assert turn.prompt_ids == gen.prompt_ids
            assert turn.completion_ids == gen.completion_ids
            assert turn.logprobs == gen.logprobs
            assert turn.adapter == adapter == turn.role  # each role spoke with its own adapter
            assert turn.adapter_version == gen.adapter_version
            assert turn.base_model == "base"
            assert turn.text == gen.text == tok.decode(turn.completion_ids, skip_special_tokens=True)
            assert instances[i].prompt in tok.decode(turn.prompt_ids) or turn.role != "planner"
        # the structure the graph took: plans until the checker passed, two parallel workers, the merge
        n_plans = len(traj.turns) - 3
        plan_counts.add(n_plans)
        assert [t.role for t in traj.turns[:n_plans]] == ["planner"] * n_plans
        assert [(t.node, t.step) for t in traj.turns[:n_plans]] == [
            ("plan", 1 + 2 * k) for k in range(n_plans)
        ]
        workers = traj.turns[n_plans : n_plans + 2]
        assert sorted(t.role for t in workers) == ["left", "right"]
        assert {(t.node, t.step) for t in workers} == {("work", 2 * n_plans + 1)}
        merger = traj.turns[-1]
        assert (merger.role, merger.node) == ("merger", "merge/combine")
        assert traj.final_answer == merger.text.split("\n")[0]
        assert traj.reward == 2.0 + 0.5 * n_plans
        assert traj.task_id == traj.group_id == instances[i].id
        assert traj.metadata == {"graph": "review", "seed": 100 + i}
        for w in workers:  # a worker's private view: only its own label and the last plan
            assert tok.decode(w.prompt_ids).count(
                f"{w.role}:{traj.turns[n_plans - 1].text.split(chr(10))[0]}"
            )
    assert len(plan_counts) > 1  # episodes took different paths, so a mixed-up turn would show


def test_seeded_invocations_reproduce_and_pins_hold(engine):
    team = RoleModels(engine, roles())
    graph = GraphTeam(review_graph(team), name="review")
    a = graph.run(tasks(3), seed=5)
    b = graph.run(tasks(3), seed=5)
    c = graph.run(tasks(3), seed=6)
    ids = lambda ts: [t.completion_ids for tr in ts for t in tr.turns]  # noqa: E731
    assert ids(a) == ids(b) != ids(c)

    # a pin (role -> engine adapter, version) holds for the whole episode without any change to the graph
    engine.records.clear()
    [pinned] = graph.run(tasks(1), seed=5, adapter_pins={"planner": ("left", 7)})
    planner_calls = [
        adapter for _, adapter, g in engine.records if g.prompt_ids == pinned.turns[0].prompt_ids
    ]
    assert planner_calls == ["left"]
    for turn in pinned.turns:
        expected = (turn.role, 7) if turn.role == "planner" else (turn.role, 0)
        assert (turn.adapter, turn.adapter_version) == expected

    async def via_configurable():  # the config's configurable["adapter_pins"], as serving passes them
        return await run_episode(
            graph.graph, tasks(1)[0], config={"configurable": {"adapter_pins": {"merger": ("right", 3)}}}
        )

    traj = asyncio.run(via_configurable())
    assert (traj.turns[-1].role, traj.turns[-1].adapter_version) == ("merger", 3)
    assert engine.records[-1][1] == "right"


def test_a_call_with_its_own_callbacks_still_reaches_its_episode(engine):
    """Callbacks passed to a call replace the inherited ones (the capture's among them); the engine model
    reports such a call to its episode itself."""
    from langchain_core.callbacks import BaseCallbackHandler

    class Counter(BaseCallbackHandler):
        def __init__(self) -> None:
            self.ends = 0

        def on_llm_end(self, response, **kwargs) -> None:
            self.ends += 1

    counter = Counter()
    team = RoleModels(engine, roles())

    async def act(state):
        first = await team.model("planner").ainvoke(state["messages"], config={"callbacks": [counter]})
        second = await team.model("merger").ainvoke([*state["messages"], first])
        return {"messages": [first, second]}

    graph = GraphTeam(one_node_graph(act))
    engine.records.clear()

    async def episode(i: int):
        EPISODE.set(i)
        return await graph.arun(tasks(8)[i], seed=i)

    async def all_episodes():
        return await asyncio.gather(*(episode(i) for i in range(8)))

    trajectories = asyncio.run(all_episodes())
    assert counter.ends == 8  # the node's own handler saw its calls
    for i, traj in enumerate(trajectories):
        sampled = [g for ep, _, g in engine.records if ep == i]
        assert [(t.role, t.node) for t in traj.turns] == [("planner", "act"), ("merger", "act")]
        assert [(t.prompt_ids, t.completion_ids, t.logprobs) for t in traj.turns] == [
            (g.prompt_ids, g.completion_ids, g.logprobs) for g in sampled
        ]
    again = asyncio.run(all_episodes())  # and the episode's seeds reached it too
    assert [t.completion_ids for tr in again for t in tr.turns] == [
        t.completion_ids for tr in trajectories for t in tr.turns
    ]


def test_team_episodes_go_through_the_same_capture(engine):
    """Team builds an ordinary graph: its turns are the capture's, with node and step, exact as sampled."""
    team = Team.from_engine([r for r in roles() if r.name != "merger"], engine, name="trio")
    engine.records.clear()
    [traj] = team.run(tasks(1), seed=3, adapter_pins={"left": ("right", 2)})
    assert [(t.role, t.node, t.step) for t in traj.turns] == [
        ("planner", "planner", 1),
        ("left", "left", 2),
        ("right", "right", 3),
    ]
    assert [(t.prompt_ids, t.completion_ids, t.logprobs) for t in traj.turns] == [
        (g.prompt_ids, g.completion_ids, g.logprobs) for _, _, g in engine.records
    ]
    assert [a for _, a, _ in engine.records] == ["planner", "right", "right"]  # the pin held
    assert [(t.adapter, t.adapter_version) for t in traj.turns] == [("planner", 0), ("left", 2), ("right", 0)]
    assert traj.metadata == {"team": "trio", "seed": derive_seed(3, 0, 0)}  # the episode's own seed


# ---- (b) a chat model that is not teamtr's ------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    from teamtr.serving.server import ServeConfig
    from tests.support.serving import make_run_dir, serve_in_background

    run = make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=1)
    with serve_in_background(ServeConfig.from_run_dir(run, "chain", api_keys=["sk-k"])) as server:
        yield server


async def test_foreign_chat_model_call_is_a_text_turn_with_a_warning(engine, served):
    from langchain_openai import ChatOpenAI

    critic = ChatOpenAI(base_url=served.url + "/v1", api_key="sk-k", model="chain", max_retries=0)
    team = RoleModels(
        engine, [*roles(), Role("critic", "Criticise.", adapter="critic-lora")], {"critic": critic}
    )

    class S(TypedDict):
        messages: Annotated[list[AnyMessage], add_messages]

    async def draft(state: S) -> dict:
        return {"messages": [await team.model("planner").ainvoke(state["messages"])]}

    async def criticise(state: S) -> dict:
        return {"messages": [await team.model("critic").ainvoke("12+7+30+5")]}

    g = StateGraph(S)
    g.add_node("draft", draft)
    g.add_node("criticise", criticise)
    g.add_edge(START, "draft")
    g.add_edge("draft", "criticise")
    g.add_edge("criticise", END)
    try:
        with pytest.warns(
            ForeignModelWarning, match=r"ChatOpenAI called in node 'criticise' \(role 'critic'\)"
        ):
            traj = await run_episode(g.compile(), "3+4", seed=0)
    finally:
        await critic.root_async_client.close()
    engine_turn, foreign = traj.turns
    assert engine_turn.role == "planner" and engine_turn.completion_ids
    assert (foreign.role, foreign.adapter, foreign.adapter_version, foreign.node) == (
        "critic",
        "critic-lora",
        0,
        "criticise",
    )
    assert foreign.prompt_ids == foreign.completion_ids == foreign.logprobs == []
    assert not foreign.trainable and engine_turn.trainable
    assert foreign.text == traj.final_answer and foreign.text  # the served team's answer, as text


# ---- (c) bad input ------------------------------------------------------------------------------------


def one_node_graph(fn, loop: bool = False):
    class S(TypedDict):
        messages: Annotated[list[AnyMessage], add_messages]

    g = StateGraph(S)
    g.add_node("act", fn)
    g.add_edge(START, "act")
    if loop:
        g.add_conditional_edges("act", lambda s: "act", ["act"])
    else:
        g.add_edge("act", END)
    return g.compile()


def test_unknown_role_is_named(engine):
    team = RoleModels(engine, roles())

    async def act(state):
        return {"messages": [await team.model("ghost").ainvoke(state["messages"])]}

    with pytest.raises(
        UnknownRoleError, match=r"'ghost'.*roles are \['planner', 'left', 'right', 'merger'\]"
    ):
        GraphTeam(one_node_graph(act)).run(tasks(1))
    with pytest.raises(UnknownRoleError, match="'nobody'"):
        RoleModels(engine, roles(), {"nobody": team.raw_model("left")})


def test_a_role_model_sends_the_role_system_prompt_when_the_messages_have_none(engine):
    """issue 34 item 1: docs/graphs.md's `team.model("planner").ainvoke(state["messages"])` with the
    task's messages alone reaches the model with the planner's system prompt first; a node that passes its
    own system message is sent exactly that."""
    from teamtr.graphs.chat_format import render_prompt_ids

    team = RoleModels(engine, roles())
    own = SystemMessage("A prompt of the node's own.")

    async def act(state):
        plain = await team.model("planner").ainvoke(state["messages"])
        given = await team.model("left").ainvoke([own, *state["messages"]])
        return {"messages": [plain, given]}

    traj = GraphTeam(one_node_graph(act), roles=ROLE_NAMES).run(tasks(1), seed=0)[0]
    tok = engine.tokenizer()
    task = HumanMessage(tasks(1)[0].prompt)
    planner, left = traj.turns
    assert planner.prompt_ids == render_prompt_ids(tok, [SystemMessage("You are the planner."), task])
    assert left.prompt_ids == render_prompt_ids(tok, [own, task])


def test_an_episode_past_its_recursion_limit_says_so(engine):
    team = RoleModels(engine, roles())

    async def act(state):
        return {"messages": [await team.model("planner").ainvoke(state["messages"][:1])]}

    graph = GraphTeam(one_node_graph(act, loop=True), name="looper", recursion_limit=4)
    with pytest.raises(
        EpisodeLimitError, match=r"graph 'looper', task 't0'.*recursion limit \(4 steps\).*'act'"
    ):
        graph.run(tasks(1), seed=0)


def reward_that_raises(task, state):
    raise ZeroDivisionError("no reward today")


def reward_nan(task, state):
    return math.nan


@pytest.mark.parametrize(
    "reward, message",
    [
        (reward_that_raises, r"reward function .*reward_that_raises failed on task 't0'.*no reward today"),
        (reward_nan, r"reward function .*reward_nan returned nan on task 't0'.*finite"),
    ],
)
def test_a_bad_reward_function_is_named(engine, reward, message):
    team = RoleModels(engine, roles())

    async def act(state):
        return {"messages": [await team.model("merger").ainvoke(state["messages"])]}

    with pytest.raises(RewardError, match=message):
        GraphTeam(one_node_graph(act), reward=reward).run(tasks(1), seed=0)


def test_load_router_reads_module_function_specs(engine, tmp_path, monkeypatch):
    (tmp_path / "my_routers.py").write_text(
        "from typing import Literal\n\n"
        "def right_then_left(state) -> Literal['right', 'left', '__end__']:\n"
        "    n = len(state['transcript'])\n"
        "    return ['right', 'left'][n] if n < 2 else '__end__'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    team = Team.from_engine(
        [r for r in roles() if r.name in ("left", "right")],
        engine,
        router=load_router("my_routers:right_then_left"),
    )
    [traj] = team.run(tasks(1), seed=0)
    assert [(t.role, t.node) for t in traj.turns] == [("right", "right"), ("left", "left")]
    for spec, message in [
        ("no-colon", "module:function"),
        ("teamtr.no_such_module:f", "cannot import"),
        ("teamtr.graphs.team:no_such_router", "no callable 'no_such_router'"),
    ]:
        with pytest.raises(TeamError, match=message):
            load_router(spec)
