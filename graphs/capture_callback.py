"""The callback handler that records one LangGraph invocation's LLM calls as turns (`EpisodeCapture`),
which graphs/capture.py `run_episode` puts among the invocation's callbacks.

A teamtr `EngineChatModel` call becomes a `Turn` with the engine's token ids and behaviour log-probs; any
other chat model's call its text only, with a `ForeignModelWarning`. Every turn records the LangGraph node
that made it (`node_path`) and its step. The handler is also where an `EngineChatModel` finds the
episode's pinned adapter versions and its per-call seeds.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from teamtr.graphs.chat_model import METADATA_KEY, turn_from_reply
from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.graphs.seeds import derive_seed
from teamtr.graphs.trajectory import Turn

log = logging.getLogger(__name__)


class ForeignModelWarning(UserWarning):
    """A chat model that is not teamtr's made a call: its turn is recorded as text only."""


@dataclass
class _Call:
    index: int
    node: str | None
    step: int | None
    meta: dict[str, Any]
    model_name: str
    turn: Turn | None = None
    failed: bool = False


def node_path(metadata: Mapping[str, Any]) -> str | None:
    """'outer/inner' from LangGraph's checkpoint namespace ('outer:<id>|inner:<id>'), else the node
    (a call's callback metadata; serving/episodes.py records served turns by it too)."""
    ns = metadata.get("langgraph_checkpoint_ns") or ""
    parts = [p.split(":", 1)[0] for p in ns.split("|") if p]
    if parts:
        return "/".join(parts)
    return metadata.get("langgraph_node")


def _model_name(serialized: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> str:
    ids = (serialized or {}).get("id")
    if isinstance(ids, list) and ids:
        return str(ids[-1])
    return str((kwargs.get("invocation_params") or {}).get("_type", "unknown chat model"))


class EpisodeCapture(BaseCallbackHandler):
    """Collects one invocation's LLM calls as turns; give a fresh one to every invocation.

    Runs inline on the event loop (no thread hop), so a call's turn slot is taken the moment it starts.
    """

    is_teamtr_episode = True  # how EngineChatModel finds it among a call's handlers
    run_inline = True
    raise_error = True  # a bug here must not drop turns silently

    def __init__(
        self, seed: int | None = None, adapter_pins: Mapping[str, tuple[str, int]] | None = None
    ) -> None:
        self.seed = seed
        self.adapter_pins = dict(adapter_pins or {})
        self._calls: dict[UUID, _Call] = {}
        self._order: list[_Call] = []
        self._node_runs: dict[UUID, str] = {}  # run id -> node, for the graph's node runs
        self.failed_node: str | None = None  # the innermost node a failure went through

    # ---- what EngineChatModel asks ------------------------------------------------------------------

    def pin(self, role: str | None) -> tuple[str, int] | None:
        """(engine adapter, version) this episode samples role `role` with, if pinned."""
        return self.adapter_pins.get(role) if role is not None else None

    def call_seed(self, run_id: UUID) -> int | None:
        """The sampling seed of the call `run_id`: derived from the episode seed and the call's index."""
        call = self._calls.get(run_id)
        if self.seed is None or call is None:
            return None
        return derive_seed(self.seed, call.index)

    # ---- callbacks ----------------------------------------------------------------------------------

    def _start(self, serialized: Any, run_id: UUID, metadata: Mapping[str, Any] | None, kwargs: Any) -> None:
        meta = dict(metadata or {})
        call = _Call(
            index=len(self._order),
            node=node_path(meta),
            step=meta.get("langgraph_step"),
            meta=meta,
            model_name=_model_name(serialized, kwargs),
        )
        self._calls[run_id] = call
        self._order.append(call)

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, metadata: dict | None = None, **kwargs: Any
    ) -> None:
        self._start(serialized, run_id, metadata, kwargs)

    def on_llm_start(
        self, serialized: Any, prompts: Any, *, run_id: UUID, metadata: dict | None = None, **kwargs: Any
    ) -> None:
        self._start(serialized, run_id, metadata, kwargs)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        call = self._calls.get(run_id)
        if call is None:
            return
        gen = response.generations[0][0]
        message = gen.message if isinstance(gen, ChatGeneration) else AIMessage(gen.text)
        engine_meta = message.response_metadata.get(METADATA_KEY)
        role = (engine_meta or {}).get("role") or call.meta.get("teamtr_role") or call.node or "unknown"
        if engine_meta is None:
            text = (
                f"chat model {call.model_name} called in node {call.node!r} (role {role!r}) is not a teamtr "
                "EngineChatModel: its turn is recorded as text only (no token ids or log-probs to train on)"
            )
            warnings.warn(text, ForeignModelWarning, stacklevel=2)
            log.warning(text)
        call.turn = turn_from_reply(
            message,
            role,
            call.meta.get("teamtr_adapter"),
            call.meta.get("teamtr_base_model") or DEFAULT_BASE,
            node=call.node,
            step=call.step,
        )

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, metadata: dict | None = None, **kwargs: Any
    ) -> None:
        node = node_path(dict(metadata or {}))
        if node:
            self._node_runs[run_id] = node

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._node_runs.pop(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        node = self._node_runs.pop(run_id, None)
        if self.failed_node is None and node is not None:  # children fail first: the innermost node
            self.failed_node = node

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        call = self._calls.get(run_id)
        if call is not None:
            call.failed = True

    # ---- the result ---------------------------------------------------------------------------------

    @property
    def calls_started(self) -> int:
        return len(self._order)

    def turns(self) -> list[Turn]:
        """Every finished call's turn, in the order the calls started (failed calls have none)."""
        return [c.turn for c in self._order if c.turn is not None]

    def last_node(self) -> str | None:
        return self._order[-1].node if self._order else None
