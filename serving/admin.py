"""The /admin routes: list, promote and roll back adapter versions; stage a candidate team, set its canary
share, promote it atomically or abandon it; read served episodes back (admin key; serving/auth.py).

A push is validated by the registry (serving/registry.py) before anything changes; a refused version
is a 400 `adapter_rejected` and the serving version stays. serving/admin_client.py is their HTTP client;
`teamtr improve` (training/improve/) drives the candidate routes.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends

from teamtr.serving.auth import KeyCheck
from teamtr.serving.canary import Candidate
from teamtr.serving.errors import ERROR_RESPONSES, APIError
from teamtr.serving.protocol import (
    AdapterListResponse,
    AdapterPushRequest,
    AdapterRollbackRequest,
    AdapterVersionInfo,
    CanaryShareRequest,
    CandidateDecision,
    CandidateInfo,
    CandidateStageRequest,
    ServedEpisodesResponse,
)
from teamtr.serving.registry import AdapterError, AdapterRegistry, AdapterVersion, UnknownAdapterError
from teamtr.serving.served_episodes import served_episodes
from teamtr.serving.tracing import TeamTracer


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
    registry: AdapterRegistry, admin_key: KeyCheck, tracer: TeamTracer | None = None
) -> APIRouter:
    router = APIRouter(dependencies=[Depends(admin_key)], responses=ERROR_RESPONSES)

    @router.get("/admin/adapters", response_model=AdapterListResponse)
    async def list_adapters() -> AdapterListResponse:
        return AdapterListResponse(
            roles={a: [version_info(registry, v) for v in registry.versions(a)] for a in registry.adapters()},
            current=registry.current_versions(),
            candidate=candidate_info(registry.candidate),
        )

    @router.post("/admin/adapters", response_model=AdapterVersionInfo)
    async def push_adapter(body: AdapterPushRequest) -> AdapterVersionInfo:
        _require_known(registry, body.role)
        try:
            return version_info(registry, await registry.push(body.role, body.path, body.version))
        except AdapterError as e:
            raise APIError(400, str(e), param="path", code="adapter_rejected") from None

    @router.post("/admin/adapters/rollback", response_model=AdapterVersionInfo)
    async def rollback_adapter(body: AdapterRollbackRequest) -> AdapterVersionInfo:
        _require_known(registry, body.role)
        try:
            return version_info(registry, await registry.rollback(body.role))
        except (AdapterError, UnknownAdapterError) as e:
            raise APIError(400, str(e), param="role", code="rollback_refused") from None

    @router.get("/admin/candidate", response_model=CandidateInfo | None)
    async def get_candidate() -> CandidateInfo | None:
        return candidate_info(registry.candidate)

    @router.post("/admin/candidate", response_model=CandidateInfo)
    async def stage_candidate(body: CandidateStageRequest) -> CandidateInfo:
        for adapter in body.versions:
            _require_known(registry, adapter)
        try:
            candidate = await registry.stage_candidate(
                {a: (v.path, v.version) for a, v in body.versions.items()}, body.lineage
            )
            registry.set_canary_share(body.share)
        except AdapterError as e:
            raise APIError(400, str(e), param="versions", code="candidate_rejected") from None
        return candidate_info(candidate)  # type: ignore[return-value]

    @router.post("/admin/candidate/share", response_model=CandidateInfo)
    async def set_share(body: CanaryShareRequest) -> CandidateInfo:
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
    async def abandon() -> CandidateDecision:
        return await decide("abandoned", registry.abandon_candidate, "no_candidate")

    @router.post("/admin/candidate/rollback", response_model=CandidateDecision)
    async def rollback_promotion() -> CandidateDecision:
        """The last promoted candidate team, undone for all its roles at once."""
        return await decide("rolled_back", registry.rollback_promotion, "rollback_refused")

    @router.get("/admin/episodes", response_model=ServedEpisodesResponse)
    async def episodes(
        team: str | None = None, since_ns: int = 0, limit: int | None = None
    ) -> ServedEpisodesResponse:
        if tracer is None or tracer.store_path is None:
            raise APIError(
                409,
                "this server keeps no span store, so it has no served episodes to give",
                code="tracing_disabled",
            )
        await asyncio.to_thread(tracer.flush)  # spans still in the batch processor's queue
        found = await asyncio.to_thread(
            served_episodes, tracer.store_path, team=team, since_ns=since_ns, limit=limit
        )
        return ServedEpisodesResponse(episodes=found)

    return router
