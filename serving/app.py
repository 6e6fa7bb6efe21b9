"""The team chat API: an OpenAI-compatible FastAPI app where `model` names a team.

    POST /v1/chat/completions   run the team on the conversation; the final message is the answer
    GET  /v1/models             the teams served
    POST /v1/feedback           attach a reward to a conversation (for traces -> trajectories)
    GET  /health
    GET  /admin/adapters, POST /admin/adapters, POST /admin/adapters/rollback   (admin key)

The user's last message is the task; earlier messages are context, folded into the task text as
`<role>: <content>` lines (a team sees one task string). Each role samples with the settings it was
declared with; `max_tokens` / `temperature` are validated but do not override a role's settings.
Errors always have OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.outputs import LLMResult
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teamtr.graphs.chat_model import METADATA_KEY
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.team import Team
from teamtr.graphs.trajectory import Trajectory, Turn
from teamtr.serving.protocol import (
    AdapterListResponse,
    AdapterPushRequest,
    AdapterRollbackRequest,
    AdapterVersionInfo,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    ChunkChoice,
    Delta,
    ErrorResponse,
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
from teamtr.serving.registry import AdapterError, AdapterRegistry, AdapterVersion, UnknownAdapterError
from teamtr.serving.tracing import TeamTracer

CONVERSATION_HEADER = "X-Conversation-Id"


@dataclass
class ServeSettings:
    """Limits and keys of one server. Defaults: an open chat API, admin endpoints off (no admin key)."""

    api_keys: tuple[str, ...] = ()  # Bearer keys accepted by the chat API; empty = no key needed
    admin_key: str | None = None  # Bearer key of the /admin endpoints; None = they answer 403
    max_body_bytes: int = 1_000_000  # larger request bodies get 413
    max_prompt_tokens: int = 256  # the task (with folded context) in tokens; longer gets 400
    max_tokens_limit: int = 4096  # a request's max_tokens above this gets 400
    max_conversations: int = 100_000  # conversation ids remembered for /v1/feedback


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def _error(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


_TYPE_OF_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class BodyLimit:
    """413 for request bodies over the limit, whether or not they declare a Content-Length."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            response = _error(
                413,
                f"request body over {self.max_bytes} bytes",
                "invalid_request_error",
                code="payload_too_large",
            )
            return await response(scope, receive, send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise StarletteHTTPException(413, f"request body over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)


@dataclass
class ServedTeam:
    """A team and, for each of its roles that has a registered adapter, that adapter's name."""

    team: Team
    adapters: dict[str, str] = field(default_factory=dict)  # role name -> registry adapter name


class _TurnRecorder(AsyncCallbackHandler):
    """Turns an episode's chat-model calls into live turn spans and turn events, as they end."""

    run_inline = True

    def __init__(
        self,
        tracer: TeamTracer | None,
        episode_span: Any,
        conversation_id: str,
        on_turn: Callable[[TurnInfo], None] | None,
    ) -> None:
        self.tracer, self.span, self.conversation_id, self.on_turn = (
            tracer,
            episode_span,
            conversation_id,
            on_turn,
        )
        self._started: dict[UUID, tuple[int, str]] = {}
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
        self._started[run_id] = (time.time_ns(), (metadata or {}).get("langgraph_node", ""))

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        start_ns, role = self._started.pop(run_id, (None, ""))
        message = response.generations[0][0].message  # type: ignore[attr-defined]
        meta = message.response_metadata.get(METADATA_KEY)
        if meta is None:  # not an engine-backed model: nothing to trace at token level
            return
        turn = Turn(
            role=role,
            adapter=meta["adapter"],
            adapter_version=meta["adapter_version"],
            prompt_ids=list(meta["prompt_ids"]),
            completion_ids=list(meta["completion_ids"]),
            logprobs=list(meta["logprobs"]),
            text=meta["text"],
            base_model=meta["base_model"],
            temperature=meta.get("temperature"),
            top_p=meta.get("top_p"),
        )
        index = len(self.turns)
        self.turns.append(turn)
        finish = message.response_metadata.get("finish_reason", "stop")
        self.finish_reasons.append(finish)
        if self.tracer is not None:
            self.tracer.record_turn(
                self.span, turn, index, self.conversation_id, start_ns, time.time_ns(), finish
            )
        if self.on_turn is not None:
            self.on_turn(_turn_info(index, turn))


def _turn_info(index: int, turn: Turn) -> TurnInfo:
    return TurnInfo(
        index=index,
        role=turn.role,
        adapter=turn.adapter,
        adapter_version=turn.adapter_version,
        text=turn.text,
        prompt_tokens=len(turn.prompt_ids),
        completion_tokens=len(turn.completion_ids),
    )


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    adapter_versions: dict[str, int]
    finish_reason: str


def task_text(request: ChatCompletionRequest) -> str:
    """The user's last message, after the earlier messages folded in as `<role>: <content>` lines."""
    *context, last = request.messages
    lines = [f"{m.name or m.role}: {m.text()}" for m in context if m.text().strip()]
    return "\n".join([*lines, last.text()])


def create_app(
    teams: dict[str, ServedTeam | Team],
    registry: AdapterRegistry,
    tracer: TeamTracer | None = None,
    settings: ServeSettings | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> FastAPI:
    """The API over already-built teams (all on the engine `registry` manages).

    `on_trajectory` receives every finished episode's trajectory (online training hooks, tests)."""
    settings = settings or ServeSettings()
    served = {
        name: t if isinstance(t, ServedTeam) else ServedTeam(t, _registered(t, registry))
        for name, t in teams.items()
    }
    conversations: OrderedDict[str, int] = OrderedDict()
    app = FastAPI(
        title="teamtr team chat API",
        version="0.1.0",
        description="OpenAI-compatible chat completions where `model` names a team of role agents.",
    )
    app.state.registry, app.state.tracer, app.state.settings, app.state.teams = (
        registry,
        tracer,
        settings,
        served,
    )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    bearer = HTTPBearer(auto_error=False)

    # --- errors in OpenAI's shape ----------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return _error(e.status, e.message, e.type, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(
                400, "the request body is not valid JSON", "invalid_request_error", code="json_invalid"
            )
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = first.get("msg", "invalid request")
        if loc:
            message = f"{'.'.join(loc)}: {message}"
        return _error(400, message, "invalid_request_error", ".".join(loc) or None, first.get("type"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error(
            e.status_code,
            str(e.detail),
            _TYPE_OF_STATUS.get(e.status_code, "invalid_request_error"),
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _crash(_: Request, e: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(e).__name__}: {e}", "server_error")

    # --- keys ------------------------------------------------------------------------------------
    def _key(credentials: HTTPAuthorizationCredentials | None) -> str | None:
        return credentials.credentials if credentials is not None else None

    async def api_key(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if not settings.api_keys:
            return
        key = _key(credentials)
        if key is None:
            raise APIError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                "authentication_error",
                code="invalid_api_key",
            )
        if not any(hmac.compare_digest(key, k) for k in (*settings.api_keys, settings.admin_key or "")):
            raise APIError(401, "incorrect API key", "authentication_error", code="invalid_api_key")

    async def admin_key(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        key = _key(credentials)
        if settings.admin_key is None:
            raise APIError(
                403,
                "admin endpoints are disabled: start the server with an admin key",
                "permission_error",
                code="admin_disabled",
            )
        if key is None:
            raise APIError(
                401,
                "missing admin key: send 'Authorization: Bearer <admin key>'",
                "authentication_error",
                code="invalid_api_key",
            )
        if not hmac.compare_digest(key, settings.admin_key):
            if any(hmac.compare_digest(key, k) for k in settings.api_keys):
                raise APIError(
                    403,
                    "this API key may not use admin endpoints",
                    "permission_error",
                    code="insufficient_permissions",
                )
            raise APIError(401, "incorrect admin key", "authentication_error", code="invalid_api_key")

    errors = {status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 413)}

    # --- one episode ------------------------------------------------------------------------------
    def _validate(request: ChatCompletionRequest) -> tuple[ServedTeam, str]:
        team = served.get(request.model)
        if team is None:
            raise APIError(
                404,
                f"the model {request.model!r} does not exist; teams: {sorted(served)}",
                param="model",
                code="model_not_found",
            )
        cap = request.turn_token_cap()
        if cap is not None and cap > settings.max_tokens_limit:
            raise APIError(
                400,
                f"max_tokens {cap} is over this server's limit {settings.max_tokens_limit}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        task = task_text(request)
        tokenizer = registry.engine.tokenizer(team.team.roles[0].base_model)
        n_tokens = len(tokenizer(task, add_special_tokens=False)["input_ids"])
        if n_tokens > settings.max_prompt_tokens:
            raise APIError(
                400,
                f"the conversation is {n_tokens} tokens; this server takes at most "
                f"{settings.max_prompt_tokens}",
                param="messages",
                code="context_length_exceeded",
            )
        return team, task

    def _conversation_id(request: ChatCompletionRequest, http: Request, completion_id: str) -> str:
        given = (request.metadata or {}).get("conversation_id") or http.headers.get(CONVERSATION_HEADER)
        return given[:256] if given else completion_id

    async def run_episode(
        name: str,
        team: ServedTeam,
        task: str,
        request: ChatCompletionRequest,
        completion_id: str,
        conversation_id: str,
        on_turn: Callable[[TurnInfo], None] | None = None,
    ) -> EpisodeResult:
        async with registry.pin(sorted(set(team.adapters.values()))) as pinned:
            pins = {role: pinned[adapter] for role, adapter in team.adapters.items()}
            versions = {role: v for role, (_, v) in pins.items()}
            instance = TaskInstance(id=completion_id, prompt=task, answer=None)
            span_cm = tracer.episode(name, conversation_id, task) if tracer is not None else _no_span()
            with span_cm as span:
                recorder = _TurnRecorder(tracer, span, conversation_id, on_turn)
                trajectory = await team.team.arun(
                    instance, seed=request.seed, adapter_pins=pins, config={"callbacks": [recorder]}
                )
                trajectory.metadata["conversation_id"] = conversation_id
                if tracer is not None:
                    tracer.finish_episode(span, trajectory, versions)
        conversations[conversation_id] = conversations.pop(conversation_id, 0) + 1
        while len(conversations) > settings.max_conversations:
            conversations.popitem(last=False)
        if on_trajectory is not None:
            on_trajectory(trajectory)
        finish = recorder.finish_reasons[-1] if recorder.finish_reasons else "stop"
        return EpisodeResult(trajectory, versions, "length" if finish == "length" else "stop")

    def _usage(trajectory: Trajectory) -> Usage:
        prompt = sum(len(t.prompt_ids) for t in trajectory.turns)
        completion = sum(len(t.completion_ids) for t in trajectory.turns)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    # --- routes ----------------------------------------------------------------------------------
    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses=errors,
        dependencies=[Depends(api_key)],
    )
    async def chat_completions(request: ChatCompletionRequest, http: Request) -> Any:
        team, task = _validate(request)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        conversation_id = _conversation_id(request, http, completion_id)
        headers = {CONVERSATION_HEADER: conversation_id}
        if request.stream:
            return StreamingResponse(
                _stream(request, team, task, completion_id, conversation_id),
                media_type="text/event-stream",
                headers=headers,
            )
        result = await run_episode(request.model, team, task, request, completion_id, conversation_id)
        t = result.trajectory
        body = ChatCompletionResponse(
            id=completion_id,
            model=request.model,
            choices=[
                Choice(
                    message=ResponseMessage(content=t.final_answer or ""), finish_reason=result.finish_reason
                )
            ],
            usage=_usage(t),
            teamtr=TeamInfo(
                conversation_id=conversation_id,
                adapter_versions=result.adapter_versions,
                turns=[_turn_info(i, turn) for i, turn in enumerate(t.turns)],
            ),
        )
        return JSONResponse(body.model_dump(), headers=headers)

    async def _stream(
        request: ChatCompletionRequest, team: ServedTeam, task: str, completion_id: str, conversation_id: str
    ) -> AsyncIterator[str]:
        options = request.stream_options
        turns: asyncio.Queue[TurnInfo] = asyncio.Queue()
        on_turn = turns.put_nowait if options is not None and options.include_turns else None
        episode = asyncio.create_task(
            run_episode(request.model, team, task, request, completion_id, conversation_id, on_turn)
        )

        def chunk(**kwargs: Any) -> str:
            c = ChatCompletionChunk(id=completion_id, model=request.model, **kwargs)
            return f"data: {json.dumps(c.model_dump(exclude_none=True))}\n\n"

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
            yield chunk(choices=[], usage=_usage(result.trajectory))
        yield "data: [DONE]\n\n"

    @app.get("/v1/models", response_model=ModelList, dependencies=[Depends(api_key)], responses=errors)
    async def models() -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=name, roles=[r.name for r in t.team.roles]) for name, t in sorted(served.items())
            ]
        )

    @app.get(
        "/v1/models/{model}", response_model=ModelCard, dependencies=[Depends(api_key)], responses=errors
    )
    async def model(model: str) -> ModelCard:
        if model not in served:
            raise APIError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
        return ModelCard(id=model, roles=[r.name for r in served[model].team.roles])

    @app.post(
        "/v1/feedback", response_model=FeedbackResponse, dependencies=[Depends(api_key)], responses=errors
    )
    async def feedback(body: FeedbackRequest) -> FeedbackResponse:
        if body.conversation_id not in conversations:
            raise APIError(
                404,
                f"unknown conversation id {body.conversation_id!r}",
                param="conversation_id",
                code="conversation_not_found",
            )
        if tracer is None:
            raise APIError(
                409, "tracing is off on this server, so a reward has nowhere to go", code="tracing_disabled"
            )
        tracer.record_feedback(body.conversation_id, body.reward, body.comment)
        return FeedbackResponse(
            conversation_id=body.conversation_id,
            reward=body.reward,
            episodes=conversations[body.conversation_id],
        )

    @app.get("/health", response_model=HealthResponse)
    async def health() -> HealthResponse:
        return HealthResponse(
            teams=sorted(served), adapters=registry.current_versions(), in_flight=registry.in_flight()
        )

    # --- admin -----------------------------------------------------------------------------------
    def _info(v: AdapterVersion) -> AdapterVersionInfo:
        current = registry.current(v.adapter).version == v.version
        return AdapterVersionInfo(
            role=v.adapter,
            version=v.version,
            engine_name=v.engine_name,
            path=str(v.path),
            live=v.live,
            in_flight=v.in_flight,
            current=current,
        )

    def _known(adapter: str) -> None:
        if adapter not in registry.adapters():
            raise APIError(
                404,
                f"unknown adapter {adapter!r}; registered: {registry.adapters()}",
                param="role",
                code="adapter_not_found",
            )

    @app.get(
        "/admin/adapters",
        response_model=AdapterListResponse,
        dependencies=[Depends(admin_key)],
        responses=errors,
    )
    async def list_adapters() -> AdapterListResponse:
        return AdapterListResponse(
            roles={a: [_info(v) for v in registry.versions(a)] for a in registry.adapters()},
            current=registry.current_versions(),
        )

    @app.post(
        "/admin/adapters",
        response_model=AdapterVersionInfo,
        dependencies=[Depends(admin_key)],
        responses=errors,
    )
    async def push_adapter(body: AdapterPushRequest) -> AdapterVersionInfo:
        _known(body.role)
        try:
            return _info(await registry.push(body.role, body.path, body.version))
        except AdapterError as e:
            raise APIError(400, str(e), param="path", code="adapter_rejected") from None

    @app.post(
        "/admin/adapters/rollback",
        response_model=AdapterVersionInfo,
        dependencies=[Depends(admin_key)],
        responses=errors,
    )
    async def rollback_adapter(body: AdapterRollbackRequest) -> AdapterVersionInfo:
        _known(body.role)
        try:
            return _info(await registry.rollback(body.role))
        except (AdapterError, UnknownAdapterError) as e:
            raise APIError(400, str(e), param="role", code="rollback_refused") from None

    return app


def _registered(team: Team, registry: AdapterRegistry) -> dict[str, str]:
    known = set(registry.adapters())
    return {r.name: r.adapter for r in team.roles if r.adapter is not None and r.adapter in known}


class _no_span:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
