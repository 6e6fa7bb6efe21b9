"""The /admin routes: list, promote and roll back adapter versions; stage a candidate team, set its canary
share, promote it atomically or abandon it; take `teamtr improve --watch`'s state reports (for /metrics);
read served episodes back (admin key; serving/auth.py).

A push is validated by the registry (serving/registry.py) before anything changes; a refused version
is a 400 `adapter_rejected` and the serving version stays. client/admin_client.py is their HTTP client;
`teamtr improve` (improve/) drives the candidate routes.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from fastapi import APIRouter, Depends, Query

from teamtr.client.admin_protocol import (
    AdapterListResponse,
    AdapterPushRequest,
    AdapterRollbackRequest,
    AdapterVersionInfo,
    CanaryShareRequest,
    CandidateAbandonRequest,
    CandidateDecision,
    CandidateInfo,
    CandidateLoadRequest,
    FeedbackTrajectoriesResponse,
    ImproveReport,
    ServedEpisodesResponse,
    TeamRestoreRequest,
)
from teamtr.serving.adapter_checks import AdapterError, UnknownAdapterError
from teamtr.serving.adapter_paths import AdapterRoots
from teamtr.serving.auth import KeyCheck
from teamtr.serving.canary import Candidate
from teamtr.serving.errors import ERROR_RESPONSES, APIError
from teamtr.serving.pg_store import is_database_url
from teamtr.serving.registry import AdapterRegistry, AdapterVersion
from teamtr.serving.served_episodes import feedback_trajectories, served_episodes
from teamtr.serving.tracing import MissingTokensError, TeamTracer

MAX_EPISODES = 100_000  # the most episodes one GET /admin/episodes gives
SQLITE_INT_MAX = 2**63 - 1
MAX_REPORTS = 64  # teams whose `teamtr improve --watch` reports the server keeps  # a larger since_ns is no SQLite INTEGER


def version_info(registry: AdapterRegistry, v: AdapterVersion) -> AdapterVersionInfo:
    return AdapterVersionInfo(
        role=v.adapter,
        version=v.version,
        engine_name=v.engine_name,
        path=str(v.path),
        live=v.live,
        in_flight=v.in_flight,
        current=registry.current(v.adapter).version == v.version,
        candidate=registry.is_candidate(v.adapter, v.version),
        lineage=v.lineage,
        state=registry.state(v),
    )


def candidate_info(candidate: Candidate | None) -> CandidateInfo | None:
    if candidate is None:
        return None
    return CandidateInfo(
        versions=candidate.versions,
        incumbent=candidate.incumbent,
        lineage=candidate.lineage,
        share=candidate.share,
        episodes=candidate.episodes,
        canary_episodes=candidate.canary_episodes,
        total_canary_episodes=candidate.total_canary_episodes,
        shadow=candidate.shadow,
    )


def _require_known(registry: AdapterRegistry, adapter: str) -> None:
    if adapter not in registry.adapters():
        raise APIError(
            404,
            f"unknown adapter {adapter!r}; registered: {registry.adapters()}",
            param="role",
            code="adapter_not_found",
        )


def admin_router(
    registry: AdapterRegistry,
    admin_key: KeyCheck,
    tracer: TeamTracer | None = None,
    roots: AdapterRoots | None = None,
) -> APIRouter:
    """`roots`: where pushed adapter paths may be (serving/adapter_paths.py); default: anywhere."""
    router = APIRouter(dependencies=[Depends(admin_key)], responses=ERROR_RESPONSES)
    roots = roots or AdapterRoots(None)

    def confined(path: str, param: str) -> Path:
        try:
            return roots.resolve(path)
        except ValueError as e:
            raise APIError(400, str(e), param=param, code="adapter_path_refused") from None

    @router.get("/admin/adapters", response_model=AdapterListResponse)
    async def list_adapters() -> AdapterListResponse:
        await registry.follow()  # what other replicas changed (several replicas: serving/pg_store.py)
        return AdapterListResponse(
            roles={a: [version_info(registry, v) for v in registry.versions(a)] for a in registry.adapters()},
            current=registry.current_versions(),
            candidate=candidate_info(registry.candidate),
            teams=registry.teams,
        )

    @router.post("/admin/adapters", response_model=AdapterVersionInfo)
    async def push_adapter(body: AdapterPushRequest) -> AdapterVersionInfo:
        _require_known(registry, body.role)
        path = confined(body.path, "path")
        try:
            return version_info(registry, await registry.push(body.role, path, body.version))
        except AdapterError as e:
            raise APIError(400, roots.hide(str(e)), param="path", code="adapter_rejected") from None

    @router.post("/admin/adapters/rollback", response_model=AdapterVersionInfo)
    async def rollback_adapter(body: AdapterRollbackRequest) -> AdapterVersionInfo:
        _require_known(registry, body.role)
        try:
            return version_info(registry, await registry.rollback(body.role))
        except (AdapterError, UnknownAdapterError) as e:
            raise APIError(409, str(e), param="role", code="rollback_refused") from None

    @router.get("/admin/candidate", response_model=CandidateInfo | None)
    async def get_candidate() -> CandidateInfo | None:
        await registry.follow()
        return candidate_info(registry.candidate)

    @router.post("/admin/candidate", response_model=CandidateInfo)
    async def load_candidate(body: CandidateLoadRequest) -> CandidateInfo:
        for adapter in body.versions:
            _require_known(registry, adapter)
        paths = {a: confined(v.path, f"versions.{a}.path") for a, v in body.versions.items()}
        try:
            candidate = await registry.load_candidate(
                {a: (paths[a], v.version) for a, v in body.versions.items()}, body.lineage, shadow=body.shadow
            )
            registry.set_canary_share(body.share)
        except AdapterError as e:
            raise APIError(400, roots.hide(str(e)), param="versions", code="candidate_rejected") from None
        return candidate_info(candidate)  # type: ignore[return-value]

    @router.post("/admin/candidate/share", response_model=CandidateInfo)
    async def set_share(body: CanaryShareRequest) -> CandidateInfo:
        await registry.follow()  # a candidate loaded through another replica
        try:
            return candidate_info(registry.set_canary_share(body.share))  # type: ignore[return-value]
        except AdapterError as e:
            raise APIError(409, str(e), code="no_candidate") from None

    async def decide(decision: str, step, refused_code: str) -> CandidateDecision:
        """One all-roles step of the candidate team, answered with the versions it moved and the current ones."""
        try:
            versions = await step()
        except AdapterError as e:
            raise APIError(409, str(e), code=refused_code) from None
        return CandidateDecision(decision=decision, versions=versions, current=registry.current_versions())

    @router.post("/admin/candidate/promote", response_model=CandidateDecision)
    async def promote() -> CandidateDecision:
        return await decide("promoted", registry.promote_candidate, "no_candidate")

    @router.post("/admin/candidate/abandon", response_model=CandidateDecision)
    async def abandon(body: CandidateAbandonRequest | None = None) -> CandidateDecision:
        b = body or CandidateAbandonRequest()
        step = functools.partial(registry.abandon_candidate, b.rolled_back, b.reason)
        return await decide("rolled_back" if b.rolled_back else "abandoned", step, "no_candidate")

    @router.post("/admin/teams/restore", response_model=CandidateDecision)
    async def restore(body: TeamRestoreRequest) -> CandidateDecision:
        """An earlier promoted team (the listing's `teams[team]`) serves again, all adapters at once."""
        return await decide(
            "restored", functools.partial(registry.restore_team, body.team), "restore_refused"
        )

    @router.post("/admin/candidate/rollback", response_model=CandidateDecision)
    async def rollback_promotion() -> CandidateDecision:
        """The last promoted candidate team, undone for all its roles at once."""
        return await decide("rolled_back", registry.rollback_promotion, "rollback_refused")

    @router.post("/admin/improve", response_model=ImproveReport)
    async def report_improve(body: ImproveReport) -> ImproveReport:
        """`teamtr improve --watch` reports its state here, for /metrics (serving/metrics.py)."""
        if body.team not in registry.improve_reports and len(registry.improve_reports) >= MAX_REPORTS:
            raise APIError(409, f"reports of {MAX_REPORTS} teams are kept already", code="too_many_reports")
        registry.improve_reports[body.team] = body
        return body

    @router.get("/admin/improve", response_model=dict[str, ImproveReport])
    async def improve_reports() -> dict[str, ImproveReport]:
        return registry.improve_reports

    @router.get("/admin/episodes", response_model=ServedEpisodesResponse)
    async def episodes(
        team: str | None = Query(None, min_length=1, max_length=128),
        since_ns: int = Query(0, ge=0, le=SQLITE_INT_MAX, description="episodes started at or after"),
        limit: int | None = Query(None, ge=1, le=MAX_EPISODES, description="the newest this many"),
        shadows: bool = Query(False, description="with the canary's shadow episodes (serving/episodes.py)"),
    ) -> ServedEpisodesResponse:
        store = await flushed_store()
        found = await asyncio.to_thread(
            served_episodes, store, team=team, since_ns=since_ns, limit=limit, shadows=shadows
        )
        return ServedEpisodesResponse(episodes=found)

    @router.get("/admin/feedback-episodes", response_model=FeedbackTrajectoriesResponse)
    async def feedback_episodes(
        team: str | None = Query(None, min_length=1, max_length=128),
        since_ns: int = Query(0, ge=0, le=SQLITE_INT_MAX, description="episodes started at or after"),
        limit: int | None = Query(None, ge=1, le=MAX_EPISODES, description="the newest this many"),
    ) -> FeedbackTrajectoriesResponse:
        """Exploratory episodes (serving/exploration.py) with feedback, with their tokens and log-probs."""
        store = await flushed_store()
        try:
            found = await asyncio.to_thread(
                feedback_trajectories, store, team=team, since_ns=since_ns, limit=limit
            )
        except MissingTokensError as e:
            raise APIError(409, str(e), code="tokens_not_captured") from None
        return FeedbackTrajectoriesResponse(trajectories=[t.to_dict() for t in found])

    async def flushed_store() -> str | Path:
        if tracer is None or tracer.store_path is None:
            raise APIError(
                409,
                "this server keeps no span store, so it has no served episodes to give",
                code="tracing_disabled",
            )
        await asyncio.to_thread(tracer.flush)  # spans still in the batch processor's queue
        store = tracer.store_path  # a postgresql:// URL stays a string: Path would fold its "//"
        return store if is_database_url(store) else Path(store)

    return router
