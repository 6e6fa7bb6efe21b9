"""A real HAProxy (Debian's package) in front of `teamtr serve` replicas, on loopback ports, with the
configuration docs/scale.md recommends (serving/haproxy.py writes it).

Where HAProxy is not installed the tests skip with "HAProxy is not installed", which tests/support/ci_strict.py
turns into a failure under CI=true (scripts/setup_services.sh installs it there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from teamtr.engines.vllm_server import free_port
from teamtr.serving.haproxy import haproxy_config

HAPROXY = "haproxy"


@contextmanager
def haproxy(backends: list[str]) -> Iterator[str]:
    """HAProxy balancing over `backends` (host:port each); yields its URL once it answers."""
    binary = shutil.which(HAPROXY)
    if binary is None:
        pytest.skip("HAProxy is not installed (apt-get install haproxy; scripts/setup_services.sh)")
    folder = Path(tempfile.mkdtemp(prefix="teamtr-haproxy-"))
    port = free_port()
    config = folder / "haproxy.cfg"
    config.write_text(haproxy_config(f"127.0.0.1:{port}", backends, folder))
    check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, f"haproxy refused its config:\n{check.stdout}{check.stderr}"
    log = open(os.environ.get("TEAMTR_HAPROXY_LOG", os.devnull), "ab")  # its request log, for debugging
    process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "haproxy exited (TEAMTR_HAPROXY_LOG=FILE keeps its output)"
            assert time.monotonic() < deadline, "haproxy did not start answering"
            try:
                if httpx.get(url + "/health/live", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
