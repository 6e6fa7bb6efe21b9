"""ASGI middleware: 413 for request bodies over the limit, whether or not they declare a Content-Length.

A declared length over the limit is refused before the body is read; an undeclared (chunked) body is
counted as it arrives and refused once it passes the limit.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teamtr.serving.errors import error_response


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            response = error_response(
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
