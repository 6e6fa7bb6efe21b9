"""ASGI middleware: a request cancelled by the server's shutdown gets a 503 in OpenAI's shape.

On shutdown, `teamtr serve` lets requests in flight finish for `drain_timeout_s` (uvicorn's graceful
shutdown), then cancels them; without this, uvicorn would answer a bare 500 to each.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teamtr.serving.errors import error_response


class CancelledAnswer:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if not started:
                answer = error_response(
                    503,
                    "the server is shutting down and this request outlived its drain deadline; retry",
                    "server_error",
                    code="server_shutting_down",
                )
                await answer(scope, receive, send)
            raise
