"""Bearer keys as FastAPI dependencies: the chat API's keys, the admin key, and the pages' key check.

The chat API is open when no API key is configured, and the admin key is accepted there too. The admin
endpoints answer 403 while no admin key is configured, and 403 (not 401) to a valid API key, so a caller
can tell "wrong key" from "right key, wrong endpoint". With `protect_pages` (the production preset)
/docs, /redoc, /openapi.json, /health and /metrics want any configured key, API or admin.

A conversation belongs to the key that created it (`key_owner`: a digest of the key, never the key):
serving/conversations.py stores it, serving/service.py answers another key's continuation or feedback
with a 404. On an open chat API (no API keys) there are no owners.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from teamtr.serving.errors import APIError
from teamtr.serving.settings import ServeSettings

KeyCheck = Callable[..., Awaitable[None]]

_bearer = HTTPBearer(auto_error=False)  # no key is our 401 in OpenAI's shape, not FastAPI's 403


def _matches(key: str, accepted: tuple[str, ...]) -> bool:
    return any(hmac.compare_digest(key, k) for k in accepted)


def api_key_check(settings: ServeSettings) -> KeyCheck:
    """The dependency of the chat routes."""

    async def api_key(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        if not settings.api_keys:
            return
        if credentials is None:
            raise APIError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                "authentication_error",
                code="invalid_api_key",
            )
        if not _matches(credentials.credentials, (*settings.api_keys, settings.admin_key or "")):
            raise APIError(401, "incorrect API key", "authentication_error", code="invalid_api_key")

    return api_key


def key_owner(authorization: str | None, settings: ServeSettings) -> str | None:
    """Whose conversations a request may see: the digest of its bearer key, on a keyed chat API (the key
    was checked by `api_key_check` already); None on an open one."""
    if not settings.api_keys or not authorization or not authorization.lower().startswith("bearer "):
        return None
    return hashlib.sha256(authorization[7:].strip().encode()).hexdigest()[:32]


def pages_key_check(settings: ServeSettings) -> KeyCheck:
    """The dependency of /docs, /openapi.json, /health and /metrics: any configured key, when protected."""

    async def pages_key(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        if not settings.protect_pages:
            return
        keys = (*settings.api_keys, *((settings.admin_key,) if settings.admin_key else ()))
        if credentials is None or not _matches(credentials.credentials, keys):
            raise APIError(
                401,
                "this page needs a key on this server: send 'Authorization: Bearer <key>'",
                "authentication_error",
                code="invalid_api_key",
            )

    return pages_key


def admin_key_check(settings: ServeSettings) -> KeyCheck:
    """The dependency of the /admin routes."""

    async def admin_key(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        if settings.admin_key is None:
            raise APIError(
                403,
                "admin endpoints are disabled: start the server with an admin key",
                "permission_error",
                code="admin_disabled",
            )
        if credentials is None:
            raise APIError(
                401,
                "missing admin key: send 'Authorization: Bearer <admin key>'",
                "authentication_error",
                code="invalid_api_key",
            )
        key = credentials.credentials
        if not hmac.compare_digest(key, settings.admin_key):
            if _matches(key, settings.api_keys):
                raise APIError(
                    403,
                    "this API key may not use admin endpoints",
                    "permission_error",
                    code="insufficient_permissions",
                )
            raise APIError(401, "incorrect admin key", "authentication_error", code="invalid_api_key")

    return admin_key
