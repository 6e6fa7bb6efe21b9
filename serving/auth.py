"""Bearer keys as FastAPI dependencies: the chat API's keys and the admin key.

The chat API is open when no API key is configured, and the admin key is accepted there too. The admin
endpoints answer 403 while no admin key is configured, and 403 (not 401) to a valid API key, so a caller
can tell "wrong key" from "right key, wrong endpoint".
"""

from __future__ import annotations

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
