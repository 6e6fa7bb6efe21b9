"""`teamtr serve ...` as a user runs it: its own process, on a free port, used once /health answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from teamtr.engines.vllm_server import free_port


def start_serve(*args: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`teamtr serve ARGS --port PORT` in its own process (its output kept for a failure's message)."""
    return subprocess.Popen(
        [sys.executable, "-m", "teamtr.cli.main", "serve", *args, "--port", str(port)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, process.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "teamtr serve did not become healthy"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)


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
