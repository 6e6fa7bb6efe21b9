"""The team chat API: an OpenAI-compatible FastAPI app where `model` names a team.

    POST /v1/chat/completions   run the team on the conversation; the final message is the answer
    GET  /v1/models             the teams served
    POST /v1/feedback           attach a reward to a conversation (for traces -> trajectories)
    GET  /health, /health/live, /health/ready (ready: the engine answers and every adapter is loaded)
    GET  /metrics               Prometheus
    GET  /admin/adapters, POST /admin/adapters, POST /admin/adapters/rollback   (admin key)

This module only assembles the app; each job has its own module: serving/service.py (validate, run,
build responses and stream chunks), serving/episodes.py (an episode on pinned adapter versions, its
turns and spans), serving/errors.py (OpenAI's error shape), serving/auth.py (keys), serving/admin.py
(the /admin routes), serving/body_limit.py (413), serving/limits.py (queues, rate limits),
serving/sampling.py (a request's sampling under the team's pins), serving/health.py (readiness),
serving/metrics.py (Prometheus). The wire format is client/protocol.py; docs/serving.md describes the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from teamtr.client.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    LiveResponse,
    ModelCard,
    ModelList,
    ReadyResponse,
)
from teamtr.graphs.team import Team
from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.adapter_paths import AdapterRoots
from teamtr.serving.admin import admin_router
from teamtr.serving.auth import admin_key_check, api_key_check, key_owner, pages_key_check
from teamtr.serving.body_limit import BodyLimit
from teamtr.serving.completion import CONVERSATION_HEADER, TIMEOUT_HEADER
from teamtr.serving.conversations import Conversations, ConversationStore
from teamtr.serving.episodes import ServedEpisodeRunner, ServedTeam, registered_adapters
from teamtr.serving.errors import ERROR_RESPONSES, install_error_handlers
from teamtr.serving.health import not_ready_reasons
from teamtr.serving.metrics import CONTENT_TYPE, TEAM_STATE_KEY, RequestMetrics
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.service import ChatCompletionService
from teamtr.serving.settings import ServeSettings, TeamPolicy
from teamtr.serving.shutdown import CancelledAnswer
from teamtr.serving.threads import ConversationThreads
from teamtr.serving.tracing import TeamTracer

__all__ = ["ServeSettings", "ServedTeam", "TeamPolicy", "create_app"]  # what serving/server.py builds from


def _caller(http: Request) -> str:
    """Whom a rate limit counts: the bearer key, else the client's address."""
    auth = http.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return "key:" + auth[7:].strip()
    return "addr:" + (http.client.host if http.client else "unknown")


def create_app(
    teams: dict[str, ServedTeam | Team],
    registry: AdapterRegistry,
    tracer: TeamTracer | None = None,
    settings: ServeSettings | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    conversations: ConversationStore | None = None,
) -> FastAPI:
    """The API over already-built teams (all on the engine `registry` manages).

    `on_trajectory` receives every finished episode's trajectory (online training hooks, tests);
    `conversations`: the conversation table (serving/conversations.py; default: in memory)."""
    settings = settings or ServeSettings()
    served = {
        name: t if isinstance(t, ServedTeam) else ServedTeam(t, registered_adapters(t, registry))
        for name, t in teams.items()
    }
    conversations = conversations or Conversations(settings.max_conversations)
    threads = ConversationThreads(conversations)
    runner = ServedEpisodeRunner(registry, tracer, threads, on_trajectory)
    service = ChatCompletionService(served, registry, tracer, settings, runner, threads)

    protect = settings.protect_pages
    app = FastAPI(
        title="teamtr team chat API",
        version="0.1.0",
        description="OpenAI-compatible chat completions where `model` names a team of role agents.",
        # protected pages are served below, behind a key
        **({"docs_url": None, "redoc_url": None, "openapi_url": None} if protect else {}),
    )
    app.state.registry, app.state.tracer, app.state.settings, app.state.teams = (
        registry,
        tracer,
        settings,
        served,
    )
    app.state.service = service
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(CancelledAnswer)
    app.add_middleware(RequestMetrics, metrics=lambda: service.metrics)
    install_error_handlers(app)
    # declared only where checked: the schema then says which routes need a key on this server
    api_key = [Depends(api_key_check(settings))] if settings.api_keys else []
    page_key = [Depends(pages_key_check(settings))] if protect else []
    if protect:
        _protected_docs(app, page_key)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses=ERROR_RESPONSES,
        dependencies=api_key,
    )
    async def chat_completions(request: ChatCompletionRequest, http: Request) -> Any:
        if request.model in served:
            setattr(http.state, TEAM_STATE_KEY, request.model)  # the metrics' team label
        service.check_rate(_caller(http))
        completion = service.prepare(
            request,
            http.headers.get(CONVERSATION_HEADER),
            http.headers.get(TIMEOUT_HEADER),
            owner=key_owner(http.headers.get("authorization"), settings),
        )
        headers = {CONVERSATION_HEADER: completion.conversation_id}

        async def disconnected() -> None:  # as vLLM's server does: the next http.disconnect message
            while (await http.receive())["type"] != "http.disconnect":
                pass

        if request.stream:
            await service.admit(completion, disconnected)  # a full queue is a 429, before any header
            events = service.stream(completion)
            first = await anext(events)  # started: its `finally` now releases the places, whatever happens

            async def body() -> AsyncIterator[str]:
                yield first
                async for event in events:
                    yield event

            return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
        response = await service.complete(completion, disconnected)
        return JSONResponse(response.model_dump(), headers=headers)

    @app.get("/v1/models", response_model=ModelList, dependencies=api_key, responses=ERROR_RESPONSES)
    async def models() -> ModelList:
        return service.models()

    @app.get("/v1/models/{model}", response_model=ModelCard, dependencies=api_key, responses=ERROR_RESPONSES)
    async def model(model: str = Path(min_length=1, max_length=256)) -> ModelCard:
        return service.model(model)

    @app.post(
        "/v1/feedback", response_model=FeedbackResponse, dependencies=api_key, responses=ERROR_RESPONSES
    )
    async def feedback(body: FeedbackRequest, http: Request) -> FeedbackResponse:
        return service.feedback(body, key_owner(http.headers.get("authorization"), settings))

    @app.get("/health", response_model=HealthResponse, dependencies=page_key, responses=ERROR_RESPONSES)
    async def health() -> HealthResponse:
        return service.health()

    @app.get("/health/live", response_model=LiveResponse)
    async def live() -> LiveResponse:
        return LiveResponse()

    @app.get("/health/ready", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
    async def ready() -> Any:
        reasons = await not_ready_reasons(registry, settings.probe_timeout_s)
        if reasons:
            return JSONResponse(ReadyResponse(status="not_ready", reasons=reasons).model_dump(), 503)
        return ReadyResponse(status="ready")

    @app.get("/metrics", response_class=Response, dependencies=page_key, responses=ERROR_RESPONSES)
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    roots = AdapterRoots(settings.adapter_roots)
    app.include_router(admin_router(registry, admin_key_check(settings), tracer, roots))
    return app


def _protected_docs(app: FastAPI, key: list[Any]) -> None:
    """/openapi.json, /docs and /redoc behind a key (the production preset)."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=key)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=key)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=app.title)

    @app.get("/redoc", include_in_schema=False, dependencies=key)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=app.title)
