"""A small typed HTTP client of a running server's /admin endpoints (the `teamtr adapters` commands use it).

The endpoints and their bodies are serving/protocol.py's; the server side is serving/admin.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from teamtr.serving.protocol import AdapterListResponse, AdapterVersionInfo

DEFAULT_URL = "http://127.0.0.1:8000"


class ServerUnreachableError(Exception):
    """No HTTP answer at all (wrong URL, server down)."""


class AdminRequestError(Exception):
    """The server answered with an error (4xx/5xx); `message` is the OpenAI-shaped error's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class AdminClient:
    def __init__(
        self, url: str = DEFAULT_URL, admin_key: str | None = None, timeout_s: float = 120.0
    ) -> None:
        self.url, self.admin_key, self.timeout_s = url.rstrip("/"), admin_key, timeout_s

    def push(self, role: str, path: str | Path, version: int | None = None) -> AdapterVersionInfo:
        """Validate and promote the adapter at `path` (a directory on the server's machine)."""
        body = {"role": role, "path": str(path), "version": version}
        return AdapterVersionInfo.model_validate(self._request("POST", "/admin/adapters", body))

    def rollback(self, role: str) -> AdapterVersionInfo:
        """The previously promoted version of `role`'s adapter serves again; returns it."""
        return AdapterVersionInfo.model_validate(
            self._request("POST", "/admin/adapters/rollback", {"role": role})
        )

    def list_versions(self) -> AdapterListResponse:
        return AdapterListResponse.model_validate(self._request("GET", "/admin/adapters"))

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        try:
            r = httpx.request(method, self.url + path, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise ServerUnreachableError(f"cannot reach {self.url}: {e}") from None
        is_json = r.headers.get("content-type", "").startswith("application/json")
        data = r.json() if is_json else {}
        if r.status_code >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            message = error.get("message", r.text) if isinstance(error, dict) else r.text
            raise AdminRequestError(r.status_code, message)
        return data
