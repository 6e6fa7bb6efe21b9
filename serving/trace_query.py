"""Served episodes and their turns read back from the span store (serving/span_reader.py), filtered
by conversation, episode, role, adapter version and time: what `teamtr traces list` / `show` print.

An episode is a finished `invoke_agent` span; its turns are its `chat` child spans (serving/tracing.py),
its reward the latest feedback of its conversation. Episodes whose spans are still in the batch
processor's queue are not in the store yet (the tracer flushes them every few seconds and at shutdown).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from teamtr.serving.span_reader import episode_spans, feedback_spans, turn_spans
from teamtr.serving.tracing import (
    ADAPTER_VERSIONS,
    AGENT_NAME,
    CONVERSATION_ID,
    FEEDBACK_COMMENT,
    FINAL_ANSWER,
    FINISH_REASONS,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    REWARD,
    TASK_ID,
    TASK_TEXT,
    TURN_ADAPTER,
    TURN_BASE,
    TURN_INDEX,
    TURN_NODE,
    TURN_ROLE,
    TURN_STEP,
    TURN_TEXT,
    TURN_VERSION,
)


@dataclass
class TracedTurn:
    index: int
    role: str
    adapter: str | None
    version: int
    base_model: str
    node: str | None
    step: int | None
    text: str
    input_tokens: int
    output_tokens: int
    start_ns: int
    end_ns: int
    finish_reason: str | None = None


@dataclass
class TracedEpisode:
    episode_id: str  # the completion id of the request (teamtr.task_id)
    trace_id: str
    conversation_id: str
    team: str
    task: str
    final_answer: str | None
    status: str  # OK, or ERROR for an episode that failed
    start_ns: int
    end_ns: int
    adapter_versions: dict[str, int]  # role -> the version it ran on
    input_tokens: int
    output_tokens: int
    reward: float | None = None  # the conversation's latest feedback, if any
    feedback_comment: str | None = None
    turns: list[TracedTurn] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TraceFilter:
    """Which episodes (and, for role / version, which of their turns) a query keeps; None: any."""

    conversation: str | None = None  # a conversation id, or a prefix of one
    episode: str | None = None  # an episode's completion id, or its trace id (a prefix of either)
    role: str | None = None  # episodes where this role spoke (its turns only, with `turns_only`)
    version: int | None = None  # ... with this adapter version (of `role`, when it is given)
    team: str | None = None
    since_ns: int | None = None  # episodes that started at or after this time
    until_ns: int | None = None  # ... and before this one

    def keeps_turn(self, turn: TracedTurn) -> bool:
        if self.role is not None and self.role not in (turn.role, turn.adapter):
            return False
        return self.version is None or turn.version == self.version


def _episode(trace_id: str, start_ns: int, end_ns: int, status: str, a: dict[str, Any]) -> TracedEpisode:
    return TracedEpisode(
        episode_id=str(a.get(TASK_ID, "")),
        trace_id=trace_id,
        conversation_id=str(a.get(CONVERSATION_ID, "")),
        team=str(a.get(AGENT_NAME, "")),
        task=str(a.get(TASK_TEXT, "")),
        final_answer=a.get(FINAL_ANSWER),
        status=status,
        start_ns=int(start_ns),
        end_ns=int(end_ns),
        adapter_versions={k: int(v) for k, v in json.loads(a.get(ADAPTER_VERSIONS, "{}")).items()},
        input_tokens=int(a.get(INPUT_TOKENS, 0)),
        output_tokens=int(a.get(OUTPUT_TOKENS, 0)),
    )


def _turn(start_ns: int, end_ns: int, a: dict[str, Any]) -> TracedTurn:
    finish = a.get(FINISH_REASONS)
    return TracedTurn(
        index=int(a.get(TURN_INDEX, 0)),
        role=str(a.get(TURN_ROLE, a.get(AGENT_NAME, ""))),
        adapter=a.get(TURN_ADAPTER) or None,
        version=int(a.get(TURN_VERSION, 0)),
        base_model=str(a.get(TURN_BASE, "base")),
        node=a.get(TURN_NODE),
        step=int(a[TURN_STEP]) if TURN_STEP in a else None,
        text=str(a.get(TURN_TEXT, "")),
        input_tokens=int(a.get(INPUT_TOKENS, 0)),
        output_tokens=int(a.get(OUTPUT_TOKENS, 0)),
        start_ns=int(start_ns),
        end_ns=int(end_ns),
        finish_reason=finish[0] if finish else None,
    )


def traced_episodes(
    store: str | Path, where: TraceFilter | None = None, *, limit: int | None = None, turns_only: bool = False
) -> list[TracedEpisode]:
    """The store's finished episodes that pass `where`, oldest first (the newest `limit` of them), each
    with its turns in order (`turns_only`: only the turns of `where.role` / `where.version`)."""
    where = where or TraceFilter()
    episodes: dict[tuple[str, str], TracedEpisode] = {}
    for span in episode_spans(
        store, conversation_prefix=where.conversation, since_ns=where.since_ns, until_ns=where.until_ns
    ):
        ep = _episode(span.trace_id, span.start_ns, span.end_ns, span.status, span.attributes)
        if where.team is not None and ep.team != where.team:
            continue
        if where.episode is not None and not (
            ep.episode_id.startswith(where.episode) or ep.trace_id.startswith(where.episode)
        ):
            continue
        episodes[(span.trace_id, span.span_id)] = ep
    turns: dict[tuple[str, str | None], list[TracedTurn]] = defaultdict(list)
    for span in turn_spans(store, {trace for trace, _ in episodes}):
        turns[(span.trace_id, span.parent_span_id)].append(_turn(span.start_ns, span.end_ns, span.attributes))
    feedback = _latest_feedback(store, {ep.conversation_id for ep in episodes.values()})
    out = []
    for key, ep in episodes.items():
        ep.turns = sorted(turns.get(key, []), key=lambda t: t.index)
        if where.role is not None or where.version is not None:
            kept = [t for t in ep.turns if where.keeps_turn(t)]
            if not kept:
                continue
            if turns_only:
                ep.turns = kept
        ep.reward, ep.feedback_comment = feedback.get(ep.conversation_id, (None, None))
        out.append(ep)
    return out[-limit:] if limit else out


def _latest_feedback(store: str | Path, conversations: set[str]) -> dict[str, tuple[float, str | None]]:
    """conversation -> (reward, comment) of its latest feedback."""
    out: dict[str, tuple[float, str | None]] = {}
    for span in feedback_spans(store):
        a = span.attributes
        if a.get(CONVERSATION_ID) in conversations:
            out[a[CONVERSATION_ID]] = (float(a[REWARD]), a.get(FEEDBACK_COMMENT))
    return out
