"""The chat-completion service the routes call: validate a request, pick its team, run and record the
episode, and build the OpenAI-shaped response or stream of chunks (the routes in serving/app.py stay thin
over it).

The user's last message is the task; earlier messages are context, folded into the task text as
`<role>: <content>` lines (a team sees one task string). Each role samples with the settings it was
declared with; `max_tokens` / `temperature` are validated but do not override a role's settings.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.episodes import Conversations, EpisodeResult, EpisodeRunner, ServedTeam, turn_info
from teamtr.serving.errors import APIError
from teamtr.serving.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    ChunkChoice,
    Delta,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    ResponseMessage,
    TeamInfo,
    TurnInfo,
    Usage,
    error_body,
)
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.settings import ServeSettings
from teamtr.serving.tracing import TeamTracer

CONVERSATION_HEADER = "X-Conversation-Id"


def task_text(request: ChatCompletionRequest) -> str:
    """The user's last message, after the earlier messages folded in as `<role>: <content>` lines."""
    *context, last = request.messages
    lines = [f"{m.name or m.role}: {m.text()}" for m in context if m.text().strip()]
    return "\n".join([*lines, last.text()])


def usage_of(trajectory: Trajectory) -> Usage:
    """Token usage summed over all the episode's turns."""
    prompt = sum(len(t.prompt_ids) for t in trajectory.turns)
    completion = sum(len(t.completion_ids) for t in trajectory.turns)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


@dataclass
class Completion:
    """A validated request, ready to run: its team, task text and ids."""

    request: ChatCompletionRequest
    team: ServedTeam
    task: str
    completion_id: str
    conversation_id: str


class ChatCompletionService:
    def __init__(
        self,
        teams: dict[str, ServedTeam],
        registry: AdapterRegistry,
        tracer: TeamTracer | None,
        settings: ServeSettings,
        runner: EpisodeRunner,
        conversations: Conversations,
    ) -> None:
        self.teams, self.registry, self.tracer, self.settings = teams, registry, tracer, settings
        self.runner, self.conversations = runner, conversations

    # ---- chat completions -----------------------------------------------------------------------

    def prepare(self, request: ChatCompletionRequest, conversation_header: str | None) -> Completion:
        """Check the request against the served teams and the server's limits (APIError if it fails)."""
        team = self.teams.get(request.model)
        if team is None:
            raise APIError(
                404,
                f"the model {request.model!r} does not exist; teams: {sorted(self.teams)}",
                param="model",
                code="model_not_found",
            )
        cap = request.turn_token_cap()
        if cap is not None and cap > self.settings.max_tokens_limit:
            raise APIError(
                400,
                f"max_tokens {cap} is over this server's limit {self.settings.max_tokens_limit}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        task = task_text(request)
        tokenizer = self.registry.engine.tokenizer(team.team.roles[0].base_model)
        n_tokens = len(tokenizer(task, add_special_tokens=False)["input_ids"])
        if n_tokens > self.settings.max_prompt_tokens:
            raise APIError(
                400,
                f"the conversation is {n_tokens} tokens; this server takes at most "
                f"{self.settings.max_prompt_tokens}",
                param="messages",
                code="context_length_exceeded",
            )
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        given = (request.metadata or {}).get("conversation_id") or conversation_header
        conversation_id = given[:256] if given else completion_id
        return Completion(request, team, task, completion_id, conversation_id)

    async def complete(self, c: Completion) -> ChatCompletionResponse:
        result = await self._run(c)
        t = result.trajectory
        return ChatCompletionResponse(
            id=c.completion_id,
            model=c.request.model,
            choices=[
                Choice(
                    message=ResponseMessage(content=t.final_answer or ""), finish_reason=result.finish_reason
                )
            ],
            usage=usage_of(t),
            teamtr=TeamInfo(
                conversation_id=c.conversation_id,
                adapter_versions=result.adapter_versions,
                turns=[turn_info(i, turn) for i, turn in enumerate(t.turns)],
            ),
        )

    async def stream(self, c: Completion) -> AsyncIterator[str]:
        """Server-sent events: the role chunk, each turn as it ends (if asked), the answer, the finish
        chunk, usage (if asked), [DONE]. An error after the headers went out is reported in-band."""
        options = c.request.stream_options
        turns: asyncio.Queue[TurnInfo] = asyncio.Queue()
        on_turn = turns.put_nowait if options is not None and options.include_turns else None
        episode = asyncio.create_task(self._run(c, on_turn))

        def chunk(**kwargs: Any) -> str:
            body = ChatCompletionChunk(id=c.completion_id, model=c.request.model, **kwargs)
            return f"data: {json.dumps(body.model_dump(exclude_none=True))}\n\n"

        try:
            yield chunk(choices=[ChunkChoice(delta=Delta(role="assistant", content=""))])
            while not episode.done() or not turns.empty():
                getter = asyncio.ensure_future(turns.get())
                await asyncio.wait({getter, episode}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield chunk(choices=[], teamtr_turn=getter.result())
                else:
                    getter.cancel()
            result = episode.result()
        except Exception as e:  # headers are gone: report in-band, as OpenAI does, then end the stream
            yield f"data: {json.dumps(error_body(f'{type(e).__name__}: {e}', 'server_error'))}\n\n"
            yield "data: [DONE]\n\n"
            return
        finally:
            if not episode.done():  # the client went away: stop the episode
                episode.cancel()
        yield chunk(choices=[ChunkChoice(delta=Delta(content=result.trajectory.final_answer or ""))])
        yield chunk(choices=[ChunkChoice(delta=Delta(), finish_reason=result.finish_reason)])
        if options is not None and options.include_usage:
            yield chunk(choices=[], usage=usage_of(result.trajectory))
        yield "data: [DONE]\n\n"

    async def _run(self, c: Completion, on_turn: Callable[[TurnInfo], None] | None = None) -> EpisodeResult:
        return await self.runner.run(
            c.request.model,
            c.team,
            c.task,
            seed=c.request.seed,
            completion_id=c.completion_id,
            conversation_id=c.conversation_id,
            on_turn=on_turn,
        )

    # ---- the other chat-API endpoints -------------------------------------------------------------

    def models(self) -> ModelList:
        return ModelList(data=[self.model(name) for name in sorted(self.teams)])

    def model(self, name: str) -> ModelCard:
        if name not in self.teams:
            raise APIError(404, f"the model {name!r} does not exist", param="model", code="model_not_found")
        return ModelCard(id=name, roles=[r.name for r in self.teams[name].team.roles])

    def feedback(self, body: FeedbackRequest) -> FeedbackResponse:
        if body.conversation_id not in self.conversations:
            raise APIError(
                404,
                f"unknown conversation id {body.conversation_id!r}",
                param="conversation_id",
                code="conversation_not_found",
            )
        if self.tracer is None:
            raise APIError(
                409, "tracing is off on this server, so a reward has nowhere to go", code="tracing_disabled"
            )
        self.tracer.record_feedback(body.conversation_id, body.reward, body.comment)
        return FeedbackResponse(
            conversation_id=body.conversation_id,
            reward=body.reward,
            episodes=self.conversations.episodes(body.conversation_id),
        )

    def health(self) -> HealthResponse:
        return HealthResponse(
            teams=sorted(self.teams),
            adapters=self.registry.current_versions(),
            in_flight=self.registry.in_flight(),
        )
