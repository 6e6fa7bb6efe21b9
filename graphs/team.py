"""A team of role agents as a LangGraph `StateGraph` whose state is the shared transcript.

    START --route--> role_1 --route--> role_2 --route--> ... --route--> END

Turn-taking: exactly one role acts per step; `route` asks the router which role speaks next (round-robin
by default, or any function of the state you write, like a LangGraph conditional edge; `load_router`
reads one from a `module:function` spec), ends the episode at the max-turn guard or when the final-answer
rule fires. Each role calls a langchain-core chat model: the engine-backed `EngineChatModel` or any other
LangChain chat model, e.g. `ChatOpenAI` pointed at a vLLM server.

`Team` is one builder of an ordinary compiled graph: its episodes go through the same capture path as any
user graph (graphs/capture.py `run_episode`), which records each role's turn, pins adapter versions and
seeds each call.

`arun_from` restarts an episode from a kept prefix of its turns (the transcript they wrote is the
graph's initial state, the router continues from there): suffix resampling (training/stage.py).

In a thread (`arun(..., checkpointer=...)` with a `thread_id`, graphs/capture.py) the state persists
across episodes: the first episode's task stays the task, each later request's text enters the
transcript as a user message (rendered as a plain user turn, graphs/roles.py `role_messages`), and the
roles see the whole conversation. `turns` counts the turns of the current episode, so the router and
the max-turn guard start again with every request.
"""

from __future__ import annotations

import operator
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from teamtr.graphs.capture import EpisodeRunner, run_episode
from teamtr.graphs.chat_format import ChatFormat, template_traits
from teamtr.graphs.chat_model import strip_stop
from teamtr.graphs.loading import import_module
from teamtr.graphs.role_models import RoleModels, role_chat_model
from teamtr.graphs.roles import Role, role_messages, with_view
from teamtr.graphs.seeds import derive_seed
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.trajectory import Trajectory, Turn

__all__ = ["RoundRobin", "Router", "Team", "TeamError", "TeamState", "derive_seed", "load_router"]


class TeamState(TypedDict):
    """The shared context: the task and every message so far (graphs/capture.py records the turns)."""

    task: str
    # {"role", "text"}; a user's message in a thread also has "user": True
    transcript: Annotated[list[dict[str, Any]], operator.add]
    final: str | None
    turns: int  # the turns of this episode (a thread's transcript holds earlier episodes too)
    # private views of the task, one text per role in team order (meta["role_views"]: tasks/relay.py)
    views: list[str] | None


Router = Callable[[TeamState], str]  # returns the next role's name, or END


class RoundRobin:
    """Roles speak in their declared order, `rounds` times around."""

    def __init__(self, rounds: int = 1) -> None:
        if rounds < 1:
            raise ValueError("rounds must be >= 1")
        self.rounds = rounds
        self.order: list[str] = []

    def __call__(self, state: TeamState) -> str:
        k = episode_turns(state)
        return self.order[k % len(self.order)] if k < self.rounds * len(self.order) else END


def episode_turns(state: TeamState) -> int:
    """Turns taken in this episode (a state from before `turns` existed: the whole transcript)."""
    return state.get("turns", len(state["transcript"]))


class TeamError(ValueError):
    """A malformed team, reported when it is built."""


def load_router(spec: str) -> Router:
    """The router a config names as `module:function`: a function of the state (or a RoundRobin instance),
    imported as every `module:attribute` of a config is (graphs/loading.py: the working directory too)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TeamError(f"router must look like 'module:function', got {spec!r}")
    try:
        module = import_module(module_name)
    except ImportError as e:
        raise TeamError(f"router {spec!r}: cannot import module {module_name!r}: {e}") from e
    router = getattr(module, attr, None)
    if router is None or not callable(router):
        raise TeamError(f"router {spec!r}: module {module_name!r} has no callable {attr!r}")
    return router


@dataclass
class Team(EpisodeRunner):
    """Roles + router -> a compiled LangGraph; `arun` / `rollout` produce `Trajectory`s.

    models: one chat model per role name. `Team.from_engine` builds them from an engine.
    router: RoundRobin (default) or a function of the state returning a role name or END; a custom
        router must say where it can go (`destinations`, or a `Literal[...]` return annotation) so a
        wrong name is caught when the team is built.
    max_turns: guard against routers that never end (default: rounds x roles for round-robin, else 16).
    is_final: final-answer rule; a message for which it returns True ends the episode. Without it the
        final answer is the last message.
    """

    roles: Sequence[Role]
    models: dict[str, BaseChatModel]
    router: Router | None = None
    destinations: Sequence[str] | None = None
    max_turns: int | None = None
    is_final: Callable[[str], bool] | None = None
    name: str = "team"
    graph: CompiledStateGraph = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.roles = list(self.roles)
        names = [r.name for r in self.roles]
        if not names:
            raise TeamError("a team needs at least one role")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TeamError(f"duplicate role names: {dupes}")
        missing = [n for n in names if n not in self.models]
        if missing:
            raise TeamError(f"no chat model for roles {missing}")
        if self.router is None:
            self.router = RoundRobin()
        if isinstance(self.router, RoundRobin):
            self.router.order = names
            self.destinations = names
            self.max_turns = self.max_turns or self.router.rounds * len(names)
        else:
            self.destinations = list(self.destinations or _literal_destinations(self.router) or [])
            if not self.destinations:
                raise TeamError(
                    "a custom router must declare where it can route: pass destinations=[...] or annotate "
                    "its return type as Literal['role_a', 'role_b', END]"
                )
            self.max_turns = self.max_turns or 16
        unknown = [d for d in self.destinations if d not in names and d != END]
        if unknown:
            raise TeamError(f"router names unknown roles {unknown}; roles are {names}")
        if self.max_turns < 1:
            raise TeamError("max_turns must be >= 1")
        self.role_models = RoleModels(None, self.roles, self.models)
        self.graph = self._build()

    @classmethod
    def from_engine(
        cls, roles: Sequence[Role], engine: Any, *, chat_format: ChatFormat | None = None, **kwargs: Any
    ) -> Team:
        """Every role speaks through `engine` with its own adapter, base model and sampling settings;
        `chat_format` says how the team's context goes through the chat template (graphs/chat_format.py)."""
        models = {r.name: role_chat_model(r, engine, chat_format) for r in roles}
        for base in {r.base_model for r in roles}:  # a template that cannot render a team fails here
            template_traits(engine.tokenizer(base), (chat_format or ChatFormat()).template_kwargs)
        return cls(roles=roles, models=models, **kwargs)

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    # ---- the graph ----------------------------------------------------------------------------------

    def _route(self, state: TeamState) -> str:
        if state.get("final") is not None or episode_turns(state) >= self.max_turns:
            return END
        nxt = self.router(state)
        if nxt != END and nxt not in self.models:
            raise TeamError(f"router returned unknown role {nxt!r}")
        return nxt

    def _node(self, role: Role) -> Callable:
        model = self.role_models.model(role.name)  # capture records the turn; pins and seeds come from it

        index = [r.name for r in self.roles].index(role.name)

        async def act(state: TeamState) -> dict:
            transcript = [(None if e.get("user") else e["role"], e["text"]) for e in state["transcript"]]
            views = state.get("views")
            me = with_view(role, views[index] if views and index < len(views) else None)
            reply = await model.ainvoke(role_messages(me, state["task"], transcript))
            text = reply.text if isinstance(reply.text, str) else str(reply.content)
            final = text if self.is_final is not None and self.is_final(text) else None
            turn = {"role": role.name, "text": text}
            return {"transcript": [turn], "final": final, "turns": episode_turns(state) + 1}

        return act

    def _build(self) -> CompiledStateGraph:
        g = StateGraph(TeamState)
        for r in self.roles:
            g.add_node(r.name, self._node(r))
        path_map = [*self.destinations, END]
        g.add_conditional_edges(START, self._route, path_map)
        for r in self.roles:
            g.add_conditional_edges(r.name, self._route, path_map)
        return g.compile(name=self.name)

    # ---- running episodes ---------------------------------------------------------------------------

    async def arun(
        self,
        task: TaskInstance | str,
        *,
        verifier: Any | None = None,
        seed: int | None = None,
        adapter_pins: dict[str, tuple[str, int]] | None = None,
        group_id: str = "",
        config: dict[str, Any] | None = None,
        checkpointer: Any | None = None,
    ) -> Trajectory:
        """One episode. `verifier` (a TaskFamily) scores the final answer into the reward. With a
        `checkpointer` (and a `thread_id` in the config) the episode continues that thread."""
        return await self._episode(
            task, _team_input, {"team": self.name, "seed": seed}, verifier=verifier, seed=seed,
            adapter_pins=adapter_pins, group_id=group_id, config=config, checkpointer=checkpointer,
            continue_input=_thread_input,
        )  # fmt: skip

    async def _episode(
        self, task: TaskInstance | str, start: Callable, metadata: dict[str, Any], **options: Any
    ) -> Trajectory:
        """One run of the team's graph from the state `start(task)` (graphs/capture.py run_episode)."""
        return await run_episode(
            self.graph,
            task,
            name=self.name,
            make_input=start,
            read_output=_team_output,
            recursion_limit=self.max_turns + 8,
            metadata=metadata,
            **options,
        )

    @property
    def resumable(self) -> bool:
        """Whether an episode can restart from a prefix of its turns: the round-robin router reads only
        the transcript, which the turns give back (one turn per message). A custom router may keep its
        own state or loop: those teams resample in full."""
        return isinstance(self.router, RoundRobin)

    async def arun_from(
        self,
        task: TaskInstance,
        prefix: Sequence[Turn],
        *,
        verifier: Any | None = None,
        seed: int | None = None,
        adapter_pins: dict[str, tuple[str, int]] | None = None,
        group_id: str = "",
    ) -> Trajectory:
        """The episode continued from `prefix` (turns of an earlier episode of `task`, none of which ended
        it): the graph starts from the transcript they wrote; the new trajectory is the kept turns (as
        they are: ids, log-probs, versions) followed by the newly sampled ones."""
        if not self.resumable:
            raise TeamError(f"team {self.name!r}: a custom router cannot restart from a prefix")
        transcript = [{"role": t.role, "text": self._message_text(t)} for t in prefix]

        def start(instance: TaskInstance) -> TeamState:
            return {"task": instance.prompt, "transcript": transcript, "final": None, "turns": len(prefix),
                    "views": _views(instance)}  # fmt: skip

        metadata = {"team": self.name, "seed": seed, "prefix_turns": len(prefix)}
        suffix = await self._episode(
            task, start, metadata, verifier=verifier, seed=seed, adapter_pins=adapter_pins, group_id=group_id
        )
        suffix.turns = [*prefix, *suffix.turns]
        return suffix

    def _message_text(self, turn: Turn) -> str:
        """The transcript text of a recorded turn, as the engine-backed chat model put it there."""
        stop = getattr(getattr(self.models.get(turn.role), "sampling", None), "stop", ()) or ()
        return strip_stop(turn.text, tuple(stop))


def _team_input(task: TaskInstance) -> TeamState:
    return {"task": task.prompt, "transcript": [], "final": None, "turns": 0, "views": _views(task)}


def _views(task: TaskInstance | str) -> list[str] | None:
    return task.meta.get("role_views") if isinstance(task, TaskInstance) else None


def _thread_input(task: TaskInstance) -> dict[str, Any]:
    """A later request of a thread: its text joins the stored transcript as the user's message; the
    thread's first task stays the task."""
    return {"transcript": [{"role": "user", "text": task.prompt, "user": True}], "final": None, "turns": 0}


def _team_output(state: TeamState) -> str | None:
    """The final-answer rule's message, else the last message."""
    final = state.get("final")
    if final is None and state["transcript"]:
        final = state["transcript"][-1]["text"]
    return final


def _literal_destinations(router: Callable) -> list[str] | None:
    """Destinations from a `-> Literal["a", "b", END]` annotation, as LangGraph itself reads them."""
    try:
        hints = typing.get_type_hints(router)
    except Exception:
        return None
    ret = hints.get("return")
    if typing.get_origin(ret) is typing.Literal:
        return [str(a) for a in typing.get_args(ret)]
    return None
