"""One served episode: the team runs on pinned adapter versions, and its turns, trajectory and spans are
recorded as they happen.

Each episode pins the current version of every adapter its team uses for its whole run
(`AdapterRegistry.pin`, serving/registry.py), so a version promoted mid-episode never mixes into it.
Turns are recorded by a LangChain callback as each chat-model call ends, so turn spans and streamed
turn chunks go out while the episode is still running; with a token sink the same callback forwards each
turn's text pieces as the engine decodes them (graphs/chat_model.py `wants_tokens`).

Shadow episodes (a candidate under canary with `shadow`, serving/canary.py): an episode that pinned the
candidate is answered a second time, concurrently, by the incumbent's versions on the same request (same
task, chat messages, seed, sampling, and a copy of the thread's state as it was before the canary episode
ran), so `teamtr improve` compares the two on the same prompt. The shadow's answer is never returned; it
adds nothing to the conversation, gets no feedback (its span has a conversation id of its own) and is
traced with `teamtr.canary.shadow`; the two spans share `teamtr.canary.pair_id`. Its cost: one more
episode per canary episode, outside the admission gate.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

from teamtr.client.protocol import TurnInfo
from teamtr.graphs.capture_callback import node_path
from teamtr.graphs.chat_model import METADATA_KEY, is_engine_reply, turn_from_reply
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.team import Team
from teamtr.graphs.trajectory import Trajectory, Turn
from teamtr.serving.exploration import EXPLORATION_KEY
from teamtr.serving.registry import AdapterRegistry, AdapterVersion, Pins
from teamtr.serving.threads import ConversationThreads, copy_thread
from teamtr.serving.tracing import PAIR_ID, SHADOW, TeamTracer

log = logging.getLogger(__name__)


@dataclass
class ServedTeam:
    """A team and, for each of its roles that has a registered adapter, that adapter's name."""

    team: Team
    adapters: dict[str, str] = field(default_factory=dict)  # role name -> registry adapter name
    # the role whose (one, last) turn is the answer: streamed live (serving/token_stream.py); None: the
    # team's own rule (a round-robin Team's last turn), else the answer goes out when the episode ends
    answer_role: str | None = None


def registered_adapters(team: Team, registry: AdapterRegistry) -> dict[str, str]:
    """Role name -> adapter, for the roles whose adapter the registry manages."""
    known = set(registry.adapters())
    return {r.name: r.adapter for r in team.roles if r.adapter is not None and r.adapter in known}


def turn_info(index: int, turn: Turn) -> TurnInfo:
    """A turn as the API shows it (the response's `teamtr.turns`, streamed `teamtr_turn` chunks)."""
    return TurnInfo(
        index=index,
        role=turn.role,
        adapter=turn.adapter,
        adapter_version=turn.adapter_version,
        text=turn.text,
        prompt_tokens=len(turn.prompt_ids),
        completion_tokens=len(turn.completion_ids),
    )


class TurnRecorder(AsyncCallbackHandler):
    """Turns an episode's chat-model calls into live turn spans and turn events, as they end."""

    run_inline = True

    def __init__(
        self,
        tracer: TeamTracer | None,
        episode_span: Any,
        conversation_id: str,
        on_turn: Callable[[TurnInfo], None] | None,
        observe_turn: Callable[[str, float, int], None] | None = None,
        on_token: Callable[[int, str, str], None] | None = None,
    ) -> None:
        self.tracer, self.span, self.conversation_id, self.on_turn = (
            tracer,
            episode_span,
            conversation_id,
            on_turn,
        )
        self.observe_turn = observe_turn  # (role, seconds, completion tokens), for /metrics
        self._started: dict[UUID, tuple[int, str, int | None]] = {}  # run id -> (start ns, node, step)
        # (turn index, role, text piece) as each turn is decoded; the engine streams only when it is set
        self.on_token = on_token
        self.wants_tokens = on_token is not None
        self._speaking: dict[UUID, tuple[int, str]] = {}  # run id -> (turn index, role) of a call under way
        self._calls = 0
        self.turns: list[Turn] = []
        self.finish_reasons: list[str] = []

    async def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        meta = metadata or {}
        # where in the graph the call was made, as graphs/capture.py records it for a rollout's turns
        node = node_path(meta) or ""
        self._started[run_id] = (time.time_ns(), node, meta.get("langgraph_step"))
        # turns are indexed in the order they start (a Team's turns run one at a time, so also as they end);
        # the role: a Team's call metadata, else the engine model's own (a user graph's RoleModels model
        # carries its role itself: graphs/role_models.py), else the node
        params = kwargs.get("invocation_params") or {}
        self._speaking[run_id] = (self._calls, meta.get("teamtr_role") or params.get("role") or node)
        self._calls += 1

    async def on_llm_new_token(self, token: str, *, run_id: UUID, **kwargs: Any) -> None:
        if self.on_token is not None and run_id in self._speaking:
            index, role = self._speaking[run_id]
            self.on_token(index, role, token)

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        start_ns, node, step = self._started.pop(run_id, (None, "", None))
        self._speaking.pop(run_id, None)
        message = response.generations[0][0].message  # type: ignore[attr-defined]
        if not is_engine_reply(message):  # not an engine-backed model: nothing to trace at token level
            return
        # the role the engine model spoke as (a user graph's node may speak as several roles, e.g. one
        # node behind two `Send` branches), not the node's name
        role = message.response_metadata[METADATA_KEY].get("role") or node
        turn = turn_from_reply(message, role, node=node or None, step=step)
        index = len(self.turns)
        self.turns.append(turn)
        finish = message.response_metadata.get("finish_reason", "stop")
        self.finish_reasons.append(finish)
        if self.observe_turn is not None and start_ns is not None:
            self.observe_turn(turn.role, (time.time_ns() - start_ns) / 1e9, len(turn.completion_ids))
        if self.tracer is not None:
            self.tracer.record_turn(
                self.span, turn, index, self.conversation_id, start_ns, time.time_ns(), finish
            )
        if self.on_turn is not None:
            self.on_turn(turn_info(index, turn))


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    adapter_versions: dict[str, int]  # role -> the version the episode ran on
    finish_reason: str  # "length" when the last turn hit its token cap, else "stop"
    seconds: float = 0.0  # the episode's wall time


class ServedEpisodeRunner:
    """Runs served episodes on the registry's engine; every finished trajectory goes to `on_trajectory`
    (online training hooks, tests)."""

    def __init__(
        self,
        registry: AdapterRegistry,
        tracer: TeamTracer | None,
        threads: ConversationThreads,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> None:
        self.registry, self.tracer, self.threads = registry, tracer, threads
        self.on_trajectory = on_trajectory
        self.shadows: set[asyncio.Task] = set()  # shadow episodes under way (serving/canary.py)

    async def run(
        self,
        name: str,
        team: ServedTeam,
        task: str,
        *,
        seed: int | None,
        completion_id: str,
        conversation_id: str,
        on_turn: Callable[[TurnInfo], None] | None = None,
        graph: Team | None = None,
        observe_turn: Callable[[str, float, int], None] | None = None,
        messages: list[BaseMessage] | None = None,
        on_token: Callable[[int, str, str], None] | None = None,
        checkpointer: Any | None = None,
        owner: str | None = None,
        exploration: bool = False,
    ) -> EpisodeResult:
        """`graph`: the team variant to run (serving/sampling.py; default `team.team`). `messages`: the
        request's chat messages, which a user graph's default input (MessagesState) receives as they are
        (graphs/user_graph.py `default_input`); a Team reads the task text. `on_token(turn index, role,
        piece)`: each turn's text as it is decoded (token streaming; serving/service.py `stream`).
        `checkpointer`: the episode continues the thread `conversation_id` from its saved state
        (serving/threads.py); None: a fresh conversation. `owner`: the key digest a new
        conversation belongs to (serving/auth.py `key_owner`). `exploration`: the episode samples at the
        training temperature (serving/exploration.py); its span and trajectory metadata say so."""
        started = time.perf_counter()
        async with self.registry.pin(sorted(set(team.adapters.values()))) as pinned:
            pins = {role: pinned[adapter] for role, adapter in team.adapters.items()}
            versions = {role: v for role, (_, v) in pins.items()}
            meta = {"messages": list(messages)} if messages else {}
            instance = TaskInstance(id=completion_id, prompt=task, answer=None, meta=meta)
            tracer = self.tracer
            # no await between the pin and the hold: the shadow gets the incumbent this episode drew against
            shadow = self.registry.hold_shadow(pinned) if tracer is not None else None
            pair_id = uuid.uuid4().hex if shadow is not None else None
            if shadow is not None:
                saver = (
                    await copy_thread(checkpointer, conversation_id) if checkpointer is not None else None
                )
                run = self._shadow(name, team, instance, shadow, pair_id, seed, graph, saver, conversation_id)
                job = asyncio.create_task(run)
                self.shadows.add(job)
                job.add_done_callback(self.shadows.discard)
            span_cm = tracer.episode(name, conversation_id, task) if tracer is not None else nullcontext()
            with span_cm as span:
                if pair_id is not None:
                    span.set_attribute(PAIR_ID, pair_id)
                recorder = TurnRecorder(self.tracer, span, conversation_id, on_turn, observe_turn, on_token)
                config, threaded = _run_config(recorder, checkpointer, conversation_id)
                trajectory = await (graph or team.team).arun(
                    instance, seed=seed, adapter_pins=pins, config=config, **threaded
                )
                trajectory.metadata["conversation_id"] = conversation_id
                if exploration:
                    trajectory.metadata[EXPLORATION_KEY] = True
                if self.tracer is not None:
                    self.tracer.finish_episode(span, trajectory, versions)
        await self.threads.count_episode(conversation_id, name, owner)
        if self.on_trajectory is not None:
            self.on_trajectory(trajectory)
        finish = recorder.finish_reasons[-1] if recorder.finish_reasons else "stop"
        return EpisodeResult(
            trajectory, versions, "length" if finish == "length" else "stop", time.perf_counter() - started
        )

    async def _shadow(
        self,
        name: str,
        team: ServedTeam,
        instance: TaskInstance,
        held: tuple[Pins, list[AdapterVersion]],
        pair_id: str,
        seed: int | None,
        graph: Team | None,
        saver: Any | None,
        thread_id: str,
    ) -> None:
        """The incumbent's answer to a canary episode's request, traced, never returned (the module's doc)."""
        pinned, versions_held = held
        try:
            pins = {role: pinned[adapter] for role, adapter in team.adapters.items()}
            tracer = self.tracer
            assert tracer is not None  # hold_shadow is asked only with a tracer
            with tracer.episode(name, f"shadow-{pair_id}", instance.prompt) as span:
                span.set_attributes({PAIR_ID: pair_id, SHADOW: True})
                recorder = TurnRecorder(tracer, span, f"shadow-{pair_id}", None)
                config, threaded = _run_config(recorder, saver, thread_id)
                trajectory = await (graph or team.team).arun(
                    instance, seed=seed, adapter_pins=pins, config=config, **threaded
                )
                tracer.finish_episode(span, trajectory, {role: v for role, (_, v) in pins.items()})
        except Exception as e:  # the canary leaves a pair without its shadow out (canary.py SHADOW_LOST)
            log.warning("shadow episode %s failed: %s", pair_id, e)
        finally:
            await self.registry.release(versions_held)


def _run_config(
    recorder: TurnRecorder, checkpointer: Any | None, thread_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run config of an episode (its turn recorder; the thread it continues, with a checkpointer) and
    the keyword arguments that give the graph that checkpointer."""
    config: dict[str, Any] = {"callbacks": [recorder]}
    threaded: dict[str, Any] = {}
    if checkpointer is not None:
        config["configurable"] = {"thread_id": thread_id}
        threaded["checkpointer"] = checkpointer
    return config, threaded
