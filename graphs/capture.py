"""Capture any LangGraph graph's episode as one `Trajectory` (graphs/trajectory.py).

`run_episode(graph, task, ...)` invokes a compiled graph once with an `EpisodeCapture`
(graphs/capture_callback.py) among the invocation's callbacks. LangGraph hands an invocation's callbacks
to every node, to subgraphs and to `Send` branches, so every chat-model call made while the invocation
runs reports to that one capture, and concurrent invocations (each with its own capture) never mix.
Each call becomes a `Turn`, in the order the calls started:

- an `EngineChatModel` call (graphs/chat_model.py): the prompt ids the engine saw, the completion ids it
  sampled, their behaviour log-probs, role, adapter, adapter version and base, exactly as sampled;
- any other chat model's call (e.g. `ChatOpenAI`): its text only, with a `ForeignModelWarning`.

A node that passes callbacks of its own to a call replaces the inherited ones; an `EngineChatModel` then
reports the call to the episode itself (through a context variable `run_episode` sets), so its turn is
still recorded; a foreign model's call made that way is out of the capture's sight.
Every turn also records the LangGraph node that made it ("outer/inner" inside a subgraph) and its step.
The capture is also where an `EngineChatModel` finds the episode's pinned adapter versions
(`adapter_pins`, role -> (engine adapter, version)) and its per-call seeds (`derive_seed(seed, k)` for
the k-th call), so graph code passes neither.

The reward comes from a user function `reward(task, final_state) -> float` or a TaskFamily verifier on
the final answer (`read_output(final_state)`: by default the last AI message of LangGraph's
`MessagesState` convention, `{"messages": [...]}`).

Threads: with a LangGraph `checkpointer` and a `thread_id` in the config's `configurable`, the graph runs
on the thread's persisted state (serving/conversations.py holds the served threads): the first episode
of a thread starts from `make_input(task)`, a later one from `continue_input(task)` (default: the same),
which LangGraph applies to the stored state through the graph's reducers (a `MessagesState` appends the
new messages). Either way the trajectory holds only this episode's calls, and the checkpoint is written
once, when the episode ends (durability "exit").
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.errors import GraphRecursionError

from teamtr.graphs.capture_callback import EpisodeCapture
from teamtr.graphs.chat_model import active_episode
from teamtr.graphs.seeds import derive_seed
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.trajectory import Trajectory

RewardFn = Callable[[TaskInstance, Any], float]  # (task, final state) -> reward


class EpisodeError(RuntimeError):
    """An episode could not become a trajectory; the message names the graph, the task and the cause."""


class EpisodeLimitError(EpisodeError):
    """An episode ran past its recursion limit (a loop that never ends, or a limit set too low)."""


class RewardError(EpisodeError):
    """The reward function raised or returned a number that is not finite."""


# ---- input / output conventions ---------------------------------------------------------------------


def messages_input(task: TaskInstance) -> dict[str, Any]:
    """LangGraph's `MessagesState` convention: the task as the first human message."""
    return {"messages": [HumanMessage(task.prompt)]}


def last_ai_text(state: Any) -> str | None:
    """The text of the last AI message in `state["messages"]` (None if there is none)."""
    messages = state.get("messages", []) if isinstance(state, Mapping) else []
    for m in reversed(messages):
        if isinstance(m, BaseMessage) and m.type == "ai":
            return m.text if isinstance(m.text, str) else str(m.content)
    return None


def _fn_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def episode_reward(
    task: TaskInstance,
    state: Any,
    final: str | None,
    reward: RewardFn | None,
    verifier: Any | None,
) -> float:
    """`reward(task, state)` if given, else the verifier on the final answer, else 0; always finite."""
    if reward is None and verifier is None:
        return 0.0
    where = f"reward function {_fn_name(reward)}" if reward is not None else f"verifier {verifier!r}"
    try:
        value = reward(task, state) if reward is not None else verifier.verify(task, final or "")
        value = float(value)
    except Exception as e:
        raise RewardError(f"{where} failed on task {task.id!r}: {type(e).__name__}: {e}") from e
    if not math.isfinite(value):
        raise RewardError(f"{where} returned {value} on task {task.id!r}: a reward must be a finite number")
    return value


def _with_capture(config: Mapping[str, Any] | None, capture: EpisodeCapture) -> dict[str, Any]:
    cfg = dict(config or {})
    callbacks = cfg.get("callbacks")
    if callbacks is None:
        cfg["callbacks"] = [capture]
    elif isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(capture, inherit=True)
        cfg["callbacks"] = manager
    else:
        cfg["callbacks"] = [*callbacks, capture]
    return cfg


@dataclass
class EpisodeContext:
    """Where an episode failed, added to its exception as a note (`describe_error` shows it)."""

    graph: str
    node: str | None
    task: str

    def note(self) -> str:
        return f"in graph {self.graph!r}, node {self.node!r}, task {self.task!r}"


def describe_error(e: BaseException) -> str:
    """`Type: message`, then the notes (a failed episode's graph, node and task), for one-line reports."""
    notes = [n for n in getattr(e, "__notes__", ()) if isinstance(n, str)]
    return "; ".join([f"{type(e).__name__}: {e}", *notes])


async def run_episode(
    graph: Any,
    task: TaskInstance | str,
    *,
    name: str = "graph",
    reward: RewardFn | None = None,
    verifier: Any | None = None,
    seed: int | None = None,
    adapter_pins: Mapping[str, tuple[str, int]] | None = None,
    group_id: str = "",
    config: Mapping[str, Any] | None = None,
    make_input: Callable[[TaskInstance], Any] = messages_input,
    read_output: Callable[[Any], str | None] = last_ai_text,
    recursion_limit: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    checkpointer: Any | None = None,
    continue_input: Callable[[TaskInstance], Any] | None = None,
) -> Trajectory:
    """One invocation of `graph` (anything with LangGraph's `ainvoke`) -> one `Trajectory`.

    adapter_pins: role -> (engine adapter, version) for the whole episode; default: the config's
        `configurable["adapter_pins"]`. `seed` and the pins are also put in `configurable` for nodes
        that want them.
    metadata: the trajectory's metadata (default `{"graph": name, "seed": seed}`).
    checkpointer: a LangGraph checkpoint saver: the episode continues the thread the config's
        `configurable["thread_id"]` names (see the module docstring); None: a fresh state, as always.
    """
    instance = task if isinstance(task, TaskInstance) else TaskInstance(id="adhoc", prompt=task, answer=None)
    cfg = dict(config or {})
    configurable = dict(cfg.get("configurable") or {})
    pins = dict(adapter_pins if adapter_pins is not None else configurable.get("adapter_pins") or {})
    cfg["configurable"] = {**configurable, "seed": seed, "adapter_pins": pins}
    if recursion_limit is not None:
        cfg.setdefault("recursion_limit", recursion_limit)
    options: dict[str, Any] = {}
    start = make_input
    if checkpointer is not None:
        if not configurable.get("thread_id"):
            raise ValueError(f"graph {name!r}: a checkpointer needs config['configurable']['thread_id']")
        graph = graph.copy({"checkpointer": checkpointer})
        if (await graph.aget_state(cfg)).values:  # the thread has a state: this episode continues it
            start = continue_input or make_input
        options["durability"] = "exit"
    capture = EpisodeCapture(seed=seed, adapter_pins=pins)
    token = active_episode.set(capture)
    try:
        state = await graph.ainvoke(start(instance), config=_with_capture(cfg, capture), **options)
    except GraphRecursionError as e:
        limit = cfg.get("recursion_limit", "LangGraph's default")
        raise EpisodeLimitError(
            f"graph {name!r}, task {instance.id!r}: the episode exceeded its recursion limit ({limit} steps) "
            f"after {capture.calls_started} LLM calls, the last in node {capture.last_node()!r}; a loop that "
            "never ends? Add a turn guard to its conditional edge or raise recursion_limit"
        ) from e
    except Exception as e:  # the type stays (callers map some, e.g. an engine's); where it failed is added
        e.add_note(EpisodeContext(name, capture.failed_node or capture.last_node(), instance.id).note())
        raise
    finally:
        active_episode.reset(token)
    final = read_output(state)
    return Trajectory(
        task_id=instance.id,
        group_id=group_id or instance.id,
        turns=capture.turns(),
        reward=episode_reward(instance, state, final, reward, verifier),
        final_answer=final,
        metadata=dict(metadata) if metadata is not None else {"graph": name, "seed": seed},
    )


async def gather_episodes(
    run_one: Callable[[TaskInstance, int | None], Awaitable[Trajectory]],
    tasks: Sequence[TaskInstance],
    *,
    group_size: int = 1,
    seed: int | None = None,
    max_concurrency: int | None = None,
) -> list[Trajectory]:
    """`group_size` episodes per task, all in flight at once (the engine batches their calls).

    `run_one(task, episode_seed)` runs one episode. Trajectories come back grouped by task, in task
    order; the episode seeds are `derive_seed(seed, task index, member)`, so seeded runs reproduce."""
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def one(i: int, g: int) -> Trajectory:
        async with gate:
            return await run_one(tasks[i], None if seed is None else derive_seed(seed, i, g))

    return list(await asyncio.gather(*(one(i, g) for i in range(len(tasks)) for g in range(group_size))))


class EpisodeRunner:
    """`rollout` and `run` over a class's own `arun` (one episode): shared by `GraphTeam` and
    graphs/team.py `Team`, which differ only in how one episode goes in and out of their graph."""

    async def arun(self, task: TaskInstance, **options: Any) -> Trajectory:
        raise NotImplementedError

    async def rollout(
        self,
        tasks: Sequence[TaskInstance],
        *,
        group_size: int = 1,
        verifier: Any | None = None,
        seed: int | None = None,
        adapter_pins: Mapping[str, tuple[str, int]] | None = None,
        max_concurrency: int | None = None,
    ) -> list[Trajectory]:
        """`group_size` episodes per task, all in flight at once (the engine batches their turns).

        Trajectories come back grouped by task, in task order; seeded runs are reproducible."""

        async def one(task: TaskInstance, ep_seed: int | None) -> Trajectory:
            return await self.arun(task, verifier=verifier, seed=ep_seed, adapter_pins=adapter_pins)

        return await gather_episodes(
            one, tasks, group_size=group_size, seed=seed, max_concurrency=max_concurrency
        )

    def run(self, tasks: Sequence[TaskInstance], **kwargs: Any) -> list[Trajectory]:
        """Synchronous `rollout` for scripts and notebooks without an event loop."""
        return asyncio.run(self.rollout(tasks, **kwargs))


@dataclass
class GraphTeam(EpisodeRunner):
    """A user's compiled graph as a team: `arun` / `rollout` / `run`, the same calls as graphs/team.py `Team`.

    graph: the compiled graph (its nodes call `RoleModels.model(name)`, graphs/role_models.py).
    roles: the role names it may call (reports and the trainer's update order; not enforced here).
    """

    graph: Any
    name: str = "graph"
    roles: Sequence[str] = ()
    reward: RewardFn | None = None
    make_input: Callable[[TaskInstance], Any] = messages_input
    read_output: Callable[[Any], str | None] = last_ai_text
    recursion_limit: int | None = None
    config: dict[str, Any] = field(default_factory=dict)

    async def arun(
        self,
        task: TaskInstance | str,
        *,
        verifier: Any | None = None,
        seed: int | None = None,
        adapter_pins: Mapping[str, tuple[str, int]] | None = None,
        group_id: str = "",
        config: Mapping[str, Any] | None = None,
        checkpointer: Any | None = None,
    ) -> Trajectory:
        return await run_episode(
            self.graph,
            task,
            name=self.name,
            reward=self.reward,
            verifier=verifier,
            seed=seed,
            adapter_pins=adapter_pins,
            group_id=group_id,
            config={**self.config, **(config or {})},
            make_input=self.make_input,
            read_output=self.read_output,
            recursion_limit=self.recursion_limit,
            checkpointer=checkpointer,
        )

