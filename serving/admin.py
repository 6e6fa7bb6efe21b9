"""The /admin routes: list, promote and roll back adapter versions (admin key; serving/auth.py).

A push is validated by the registry (serving/registry.py) before anything changes; a refused version
is a 400 `adapter_rejected` and the serving version stays. serving/admin_client.py is their HTTP client.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from teamtr.serving.auth import KeyCheck
from teamtr.serving.errors import ERROR_RESPONSES, APIError
from teamtr.serving.protocol import (
    AdapterListResponse,
    AdapterPushRequest,
    AdapterRollbackRequest,
    AdapterVersionInfo,
)
from teamtr.serving.registry import AdapterError, AdapterRegistry, AdapterVersion, UnknownAdapterError


def version_info(registry: AdapterRegistry, v: AdapterVersion) -> AdapterVersionInfo:
    return AdapterVersionInfo(
        role=v.adapter,
        version=v.version,
        engine_name=v.engine_name,
        path=str(v.path),
        live=v.live,
        in_flight=v.in_flight,
        current=registry.current(v.adapter).version == v.version,
    )


def _require_known(registry: AdapterRegistry, adapter: str) -> None:
    if adapter not in registry.adapters():
        raise APIError(
            404,
            f"unknown adapter {adapter!r}; registered: {registry.adapters()}",
            param="role",
            code="adapter_not_found",
        )


def admin_router(registry: AdapterRegistry, admin_key: KeyCheck) -> APIRouter:
    router = APIRouter(dependencies=[Depends(admin_key)], responses=ERROR_RESPONSES)

    @router.get("/admin/adapters", response_model=AdapterListResponse)
    async def list_adapters() -> AdapterListResponse:
        return AdapterListResponse(
            roles={a: [version_info(registry, v) for v in registry.versions(a)] for a in registry.adapters()},
            current=registry.current_versions(),
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

    return router
