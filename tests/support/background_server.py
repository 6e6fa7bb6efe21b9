"""A real uvicorn server on a free localhost port, in a thread of its own: a helper of the tests (nothing
the package serves runs a server in a thread; benchmarks run `teamtr serve` as its own process).

The server is built by an async factory run on the server's own event loop, because the engine's tasks
and the registry's locks belong to the loop that serves the app. `teamtr serve`'s `build_server`
(serving/server.py) is such a factory; tests/support/serving.py wraps it as `serve_in_background`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

import uvicorn


class HostedApp(Protocol):
    """What the factory builds: an ASGI app and how to release what it runs on."""

    app: Any

    async def aclose(self) -> None: ...


H = TypeVar("H", bound=HostedApp)


class BackgroundServer(Generic[H]):
    """`server.url` answers HTTP once the constructor returns; `server.server` is what `build` returned.

    `call(coro_fn, *args)` runs a coroutine on the server's event loop (e.g. a registry push)."""

    def __init__(self, build: Callable[[], Awaitable[H]], startup_timeout_s: float = 600.0) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server: H | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._uvicorn: uvicorn.Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            try:
                self.server = await build()
                settings = getattr(getattr(self.server.app, "state", None), "settings", None)
                drain = getattr(settings, "drain_timeout_s", None)  # as `teamtr serve` drains on shutdown
                self._uvicorn = uvicorn.Server(
                    uvicorn.Config(
                        self.server.app,
                        host="127.0.0.1",
                        port=port,
                        log_level="warning",
                        timeout_graceful_shutdown=drain,
                    )
                )
            except BaseException as e:
                self._error = e
                self._ready.set()
                raise
            self._ready.set()
            try:
                await self._uvicorn.serve()
            finally:
                await self.server.aclose()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self._thread.start()
        self._ready.wait(startup_timeout_s)
        if self._error is not None:
            raise RuntimeError(f"server failed to start: {self._error}") from self._error
        deadline = time.monotonic() + 60
        while not (self._uvicorn and self._uvicorn.started):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    def call(
        self,
        coro_fn: Callable[..., Coroutine[Any, Any, Any]],
        *args: Any,
        timeout: float = 120.0,
        **kwargs: Any,
    ) -> Any:
        assert self.loop is not None, "the server is not running"
        return asyncio.run_coroutine_threadsafe(coro_fn(*args, **kwargs), self.loop).result(timeout)

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        self._thread.join(60)

    def __enter__(self) -> BackgroundServer[H]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
