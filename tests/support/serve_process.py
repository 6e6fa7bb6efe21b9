"""`teamtr serve ...` as a user runs it: its own process (teamtr.serving.local_replicas `start_serve`), on a
free port, used once /health answers."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from teamtr.engines.vllm_server import free_port
from teamtr.serving.local_replicas import start_serve, wait_healthy


@contextmanager
def serve_process(
    *args: str,
    env: dict[str, str] | None = None,
    timeout_s: float = 300,
    stop_signal: int = signal.SIGTERM,
) -> Iterator[str]:
    """Run `teamtr serve ARGS --port P` until the block ends (then sent `stop_signal`: SIGKILL for a
    crash); yields the server's URL."""
    port = free_port()
    process = start_serve(*args, port=port, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, url, timeout_s)
        yield url
    finally:
        process.send_signal(stop_signal)
        process.wait(60)
