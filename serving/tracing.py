"""OpenTelemetry spans for served team episodes, and spans back to training trajectories.

One span per request (`invoke_agent <team>`) and one child span per agent turn (`chat <adapter@vN>`),
with the GenAI semantic-convention attributes (`gen_ai.operation.name`, `gen_ai.agent.name`,
`gen_ai.request.model`, `gen_ai.usage.input_tokens` / `output_tokens`, `gen_ai.conversation.id`).
With token capture on (the default) a turn span also carries the prompt / completion token ids and the
behaviour log-probs under `teamtr.turn.*`, which is what `trajectories_from_spans` needs to rebuild the
exact `Trajectory` a rollout records. `POST /v1/feedback` adds a `feedback` span with the reward.

Exporters: a local SQLite span store (on by default) and OTLP/HTTP (endpoint configurable), e.g. an
Arize Phoenix server, whose UI then shows every agent turn. The store is written as each span ends
(`SimpleSpanProcessor`), so an episode's spans are committed before its answer is sent and a killed
server loses none of what it answered (docs/serving.md "Durability" has the cost); OTLP goes in batches.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from teamtr.graphs.capture import describe_error
from teamtr.graphs.trajectory import Trajectory, Turn, prompt_group
from teamtr.serving.exploration import EXPLORATION_KEY
from teamtr.serving.pg_store import PgStore
from teamtr.serving.span_reader import StoredSpan, stored_spans
from teamtr.serving.trace_store import (
    OP_AGENT,
    OP_CHAT,
    OP_FEEDBACK,
    PostgresSpanExporter,
    SQLiteSpanExporter,
)

# GenAI semantic conventions (opentelemetry.io/docs/specs/semconv/gen-ai/)
OPERATION = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CONVERSATION_ID = "gen_ai.conversation.id"
PROVIDER = "gen_ai.provider.name"
FINISH_REASONS = "gen_ai.response.finish_reasons"
# teamtr's own attributes: what a Trajectory needs beyond the conventions
TASK_ID = "teamtr.task_id"
GROUP_ID = "teamtr.group_id"
TASK_TEXT = "teamtr.task"
FINAL_ANSWER = "teamtr.final_answer"
METADATA = "teamtr.metadata_json"
ADAPTER_VERSIONS = "teamtr.adapter_versions_json"
TURN_INDEX = "teamtr.turn.index"
TURN_ROLE = "teamtr.turn.role"
TURN_ADAPTER = "teamtr.turn.adapter"
TURN_VERSION = "teamtr.turn.adapter_version"
TURN_BASE = "teamtr.turn.base_model"
TURN_TEXT = "teamtr.turn.text"
TURN_PROMPT_IDS = "teamtr.turn.prompt_ids"
TURN_COMPLETION_IDS = "teamtr.turn.completion_ids"
TURN_LOGPROBS = "teamtr.turn.logprobs"
TURN_TEMPERATURE = "teamtr.turn.temperature"  # what the log-probs are (graphs/trajectory.py Turn)
TURN_TOP_P = "teamtr.turn.top_p"
TURN_NODE = "teamtr.turn.node"  # the LangGraph node that made the call ("outer/inner" in a subgraph)
TURN_STEP = "teamtr.turn.step"  # ... and its superstep
TURN_TOOL_CALLS = "teamtr.turn.tool_calls"  # JSON lists, as graphs/trajectory.py Turn keeps them
TURN_INVALID_TOOL_CALLS = "teamtr.turn.invalid_tool_calls"
EXCEPTION_TYPE = "exception.type"  # OpenTelemetry's exception attributes, on a failed episode span
EXCEPTION_MESSAGE = "exception.message"
REWARD = "teamtr.reward"
EXPLORATION = "teamtr.exploration"  # true on an episode sampled at the training temperature (exploration.py)
# a canary episode and the incumbent's shadow answer to its request (serving/episodes.py) share a pair id
PAIR_ID = "teamtr.canary.pair_id"
SHADOW = "teamtr.canary.shadow"  # true on the shadow (its answer was not returned)
FEEDBACK_COMMENT = "teamtr.feedback.comment"


@dataclass
class TracingConfig:
    """Where spans go. Defaults: the SQLite store only, token ids and log-probs captured."""

    sqlite_path: str | Path | None = "traces.db"  # None: no local store
    shared_store: PgStore | None = None  # the replicas' PostgreSQL store (serving/pg_store.py), instead
    otlp_endpoint: str | None = None  # e.g. http://127.0.0.1:6006/v1/traces
    otlp_headers: dict[str, str] | None = None
    capture_tokens: bool = True  # token ids + log-probs on turn spans (needed by to-trajectories)
    service_name: str = "teamtr"


def build_tracer_provider(config: TracingConfig) -> TracerProvider:
    """A provider of its own (not the process-global one), so several servers / tests can coexist."""
    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
    if config.shared_store is not None:
        provider.add_span_processor(SimpleSpanProcessor(PostgresSpanExporter(config.shared_store)))
    elif config.sqlite_path is not None:
        provider.add_span_processor(SimpleSpanProcessor(SQLiteSpanExporter(config.sqlite_path)))
    if config.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, headers=config.otlp_headers)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class TeamTracer:
    """Opens the request span, records turn spans under it, and feedback spans."""

    def __init__(
        self, provider: TracerProvider, capture_tokens: bool = True, store_path: str | Path | None = None
    ) -> None:
        self.provider = provider
        self.capture_tokens = capture_tokens
        # the span store, if any (GET /admin/episodes reads it): a SQLite file or a postgresql:// URL
        self.store_path = store_path
        self._tracer = provider.get_tracer("teamtr.serving")

    @contextmanager
    def episode(self, team: str, conversation_id: str, task: str) -> Iterator[Span]:
        """The span of one request: the whole team episode."""
        with self._tracer.start_as_current_span(
            f"{OP_AGENT} {team}",
            kind=SpanKind.SERVER,
            attributes={
                OPERATION: OP_AGENT,
                AGENT_NAME: team,
                REQUEST_MODEL: team,
                PROVIDER: "teamtr",
                CONVERSATION_ID: conversation_id,
                TASK_TEXT: task,
            },
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            try:
                yield span
            except Exception as e:  # on the span itself too: the SQLite store keeps attributes, not events
                span.set_attributes({EXCEPTION_TYPE: type(e).__name__, EXCEPTION_MESSAGE: describe_error(e)})
                raise

    def record_turn(
        self,
        episode: Span,
        turn: Turn,
        index: int,
        conversation_id: str,
        start_ns: int | None = None,
        end_ns: int | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """One `chat` span per agent turn, a child of the episode span."""
        model = _model_label(turn)
        attributes: dict[str, Any] = {
            OPERATION: OP_CHAT,
            AGENT_NAME: turn.role,
            REQUEST_MODEL: model,
            RESPONSE_MODEL: model,
            PROVIDER: "teamtr",
            INPUT_TOKENS: len(turn.prompt_ids),
            OUTPUT_TOKENS: len(turn.completion_ids),
            CONVERSATION_ID: conversation_id,
            TURN_INDEX: index,
            TURN_ROLE: turn.role,
            TURN_ADAPTER: turn.adapter or "",
            TURN_VERSION: turn.adapter_version,
            TURN_BASE: turn.base_model,
            TURN_TEXT: turn.text,
        }
        if finish_reason:
            attributes[FINISH_REASONS] = (finish_reason,)
        if turn.node is not None:  # OpenTelemetry attributes cannot be None
            attributes[TURN_NODE] = turn.node
        if turn.step is not None:
            attributes[TURN_STEP] = int(turn.step)
        if turn.tool_calls:
            attributes[TURN_TOOL_CALLS] = json.dumps(turn.tool_calls)
        if turn.invalid_tool_calls:
            attributes[TURN_INVALID_TOOL_CALLS] = json.dumps(turn.invalid_tool_calls)
        if self.capture_tokens:
            # map, not a generator: a prompt's ids are hundreds of ints, converted on the event loop
            attributes[TURN_PROMPT_IDS] = tuple(map(int, turn.prompt_ids))
            attributes[TURN_COMPLETION_IDS] = tuple(map(int, turn.completion_ids))
            attributes[TURN_LOGPROBS] = tuple(map(float, turn.logprobs))
            if turn.temperature is not None:
                attributes[TURN_TEMPERATURE] = float(turn.temperature)
            if turn.top_p is not None:
                attributes[TURN_TOP_P] = float(turn.top_p)
        span = self._tracer.start_span(
            f"{OP_CHAT} {model}",
            context=trace.set_span_in_context(episode),
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=start_ns,
        )
        span.end(end_time=end_ns)

    def finish_episode(self, episode: Span, trajectory: Trajectory, adapter_versions: dict[str, int]) -> None:
        attributes = {
            INPUT_TOKENS: sum(len(t.prompt_ids) for t in trajectory.turns),
            OUTPUT_TOKENS: sum(len(t.completion_ids) for t in trajectory.turns),
            TASK_ID: trajectory.task_id,
            GROUP_ID: trajectory.group_id,
            METADATA: json.dumps(trajectory.metadata, default=str),
            ADAPTER_VERSIONS: json.dumps(adapter_versions),
        }
        if trajectory.final_answer is not None:  # absent = no final answer; "" is an empty one
            attributes[FINAL_ANSWER] = trajectory.final_answer
        attributes[EXPLORATION] = bool(trajectory.metadata.get(EXPLORATION_KEY, False))
        episode.set_attributes(attributes)
        episode.set_status(Status(StatusCode.OK))

    def record_feedback(self, conversation_id: str, reward: float, comment: str | None = None) -> None:
        attributes: dict[str, Any] = {
            OPERATION: OP_FEEDBACK,
            CONVERSATION_ID: conversation_id,
            REWARD: reward,
        }
        if comment:
            attributes[FEEDBACK_COMMENT] = comment
        self._tracer.start_span(f"{OP_FEEDBACK} {conversation_id}", attributes=attributes).end()

    def flush(self, timeout_millis: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _model_label(turn: Turn) -> str:
    """`gen_ai.request.model` of a turn: the adapter name and version (`adder1@v4`), or the base."""
    if not turn.adapter:
        return turn.base_model
    return turn.adapter if "@v" in turn.adapter else f"{turn.adapter}@v{turn.adapter_version}"


class MissingTokensError(ValueError):
    pass


def _turn_from_span(span: StoredSpan) -> Turn:
    a = span.attributes
    if TURN_COMPLETION_IDS not in a:
        raise MissingTokensError(
            f"turn span {span.span_id} has no token ids: serve with token capture on (the default) "
            "to turn traces into trajectories"
        )
    return Turn(
        role=a[TURN_ROLE],
        adapter=a[TURN_ADAPTER] or None,
        adapter_version=int(a[TURN_VERSION]),
        prompt_ids=[int(i) for i in a[TURN_PROMPT_IDS]],
        completion_ids=[int(i) for i in a[TURN_COMPLETION_IDS]],
        logprobs=[float(x) for x in a[TURN_LOGPROBS]],
        text=a[TURN_TEXT],
        base_model=a.get(TURN_BASE, "base"),
        temperature=float(a[TURN_TEMPERATURE]) if TURN_TEMPERATURE in a else None,
        top_p=float(a[TURN_TOP_P]) if TURN_TOP_P in a else None,
        tool_calls=json.loads(a.get(TURN_TOOL_CALLS, "[]")),
        invalid_tool_calls=json.loads(a.get(TURN_INVALID_TOOL_CALLS, "[]")),
        node=a.get(TURN_NODE),
        step=int(a[TURN_STEP]) if TURN_STEP in a else None,
    )


def trajectories_from_spans(
    spans: Iterable[StoredSpan], require_reward: bool = False, group_by_prompt: bool = False
) -> list[Trajectory]:
    """Every finished episode span with its turn spans, rewarded by the latest feedback of its
    conversation (0.0 without feedback, or skipped when `require_reward`). `group_by_prompt` gives the
    episodes of one prompt one group id (`prompt_group`) instead of the request's own, and the task text
    as `metadata["prompt"]`."""
    episodes: list[StoredSpan] = []
    turns: dict[tuple[str, str], list[StoredSpan]] = defaultdict(list)
    rewards: dict[str, float] = {}
    for s in sorted(spans, key=lambda s: (s.start_ns, s.span_id)):
        op = s.attributes.get(OPERATION)
        if op == OP_AGENT and s.status != "ERROR" and TASK_ID in s.attributes:
            episodes.append(s)
        elif op == OP_CHAT and s.parent_span_id:
            turns[(s.trace_id, s.parent_span_id)].append(s)
        elif op == OP_FEEDBACK:
            rewards[s.attributes[CONVERSATION_ID]] = float(s.attributes[REWARD])
    out = []
    for ep in episodes:
        a = ep.attributes
        conversation = a.get(CONVERSATION_ID, "")
        if require_reward and conversation not in rewards:
            continue
        children = sorted(turns[(ep.trace_id, ep.span_id)], key=lambda s: int(s.attributes[TURN_INDEX]))
        metadata = json.loads(a.get(METADATA, "{}"))
        prompt = a.get(TASK_TEXT, "")
        if group_by_prompt:  # the group's prompt, beside its id
            metadata.setdefault("prompt", prompt)
        out.append(
            Trajectory(
                task_id=a[TASK_ID],
                turns=[_turn_from_span(s) for s in children],
                reward=rewards.get(conversation, 0.0),
                group_id=prompt_group(prompt) if group_by_prompt else a.get(GROUP_ID, ""),
                final_answer=a.get(FINAL_ANSWER),
                metadata=metadata,
            )
        )
    return out


def trajectories_from_store(
    path: str | Path, require_reward: bool = False, group_by_prompt: bool = False
) -> list[Trajectory]:
    return trajectories_from_spans(stored_spans(path), require_reward, group_by_prompt)
