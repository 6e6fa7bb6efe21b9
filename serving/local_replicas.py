"""Several `teamtr serve` replicas on one machine, on loopback: a throwaway PostgreSQL 15 store, HAProxy
in front (serving/haproxy.py's configuration), and each replica in its own process. For trying the
replica set-up of docs/scale.md before deploying it, and for measuring it (benchmarks/replicas_load.py);
the replica tests start the same services.

`postgres_server()` runs Debian's `initdb` and `pg_ctl` (/usr/lib/postgresql/15/bin, or TEAMTR_PG_BIN) in
a fresh data directory on a free loopback port and yields its URL; the server stops when the block ends.
PostgreSQL refuses to run as root: as root, the data directory is given to the `postgres` user and the
commands run as that user (`runuser`). A service that is not installed raises `ServiceMissing`, saying
"PostgreSQL is not installed" or "HAProxy is not installed" and how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from teamtr.engines.vllm_server import free_port
from teamtr.serving.haproxy import haproxy_config

PG_BIN = Path(os.environ.get("TEAMTR_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"  # the non-root user the server runs as when started as root
HAPROXY = "haproxy"


class ServiceMissing(RuntimeError):
    """A service the replica set-up needs is not installed on this machine."""


class ServiceFailed(RuntimeError):
    """A service was installed but did not start (its output is in the message)."""


# ---- PostgreSQL -----------------------------------------------------------------------------------------


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", PG_USER, "--", *command]


def require_postgres() -> None:
    """Raise `ServiceMissing` unless `postgres_server` can start a server here."""
    if not (PG_BIN / "initdb").is_file() or not (PG_BIN / "pg_ctl").is_file():
        raise ServiceMissing(
            f"PostgreSQL is not installed (no initdb / pg_ctl in {PG_BIN}; apt-get install postgresql-15)"
        )
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        raise ServiceMissing("PostgreSQL is not installed for root use: runuser is missing")


@contextmanager
def postgres_server() -> Iterator[str]:
    """A running PostgreSQL server on 127.0.0.1, its URL (user `teamtr`, database `postgres`, trust
    authentication on loopback only)."""
    require_postgres()
    root = Path(tempfile.mkdtemp(prefix="teamtr-pg-"))
    data = root / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, PG_USER)
        shutil.chown(data, PG_USER)
    port = free_port()

    def run(*command: str) -> None:
        done = subprocess.run(_as_server_user(list(command)), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ServiceFailed(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")

    run(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "teamtr", "--no-sync")
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off"
    run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(data / "log"), "-w", "start")
    url = f"postgresql://teamtr@127.0.0.1:{port}/postgres"
    try:
        _wait_ready(url)
        yield url
    finally:
        subprocess.run(
            _as_server_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(url: str, timeout_s: float = 60) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise ServiceFailed(f"PostgreSQL at {url} did not accept connections") from None
            time.sleep(0.2)


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server (one per replica set or test: none sees another's rows); its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name


# ---- HAProxy --------------------------------------------------------------------------------------------


def require_haproxy() -> str:
    """HAProxy's binary; `ServiceMissing` where it is not installed."""
    binary = shutil.which(HAPROXY)
    if binary is None:
        raise ServiceMissing("HAProxy is not installed (apt-get install haproxy; scripts/setup_services.sh)")
    return binary


@contextmanager
def haproxy(backends: list[str]) -> Iterator[str]:
    """HAProxy balancing over `backends` (host:port each); yields its URL once it answers. TEAMTR_HAPROXY_LOG
    names a file for its request log (debugging)."""
    binary = require_haproxy()
    folder = Path(tempfile.mkdtemp(prefix="teamtr-haproxy-"))
    port = free_port()
    config = folder / "haproxy.cfg"
    config.write_text(haproxy_config(f"127.0.0.1:{port}", backends, folder))
    check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise ServiceFailed(f"haproxy refused its config:\n{check.stdout}{check.stderr}")
    log = open(os.environ.get("TEAMTR_HAPROXY_LOG", os.devnull), "ab")
    process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise ServiceFailed("haproxy exited (TEAMTR_HAPROXY_LOG=FILE keeps its output)")
            if time.monotonic() >= deadline:
                raise ServiceFailed("haproxy did not start answering")
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


# ---- the replicas ---------------------------------------------------------------------------------------


def start_serve(*args: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`teamtr serve ARGS --port PORT` in its own process (its output kept for a failure's message)."""
    return subprocess.Popen(
        [sys.executable, "-m", "teamtr.cli.main", "serve", *args, "--port", str(port)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float = 300) -> None:
    """Return once the replica at `url` answers /health; `ServiceFailed` (with its output) if it exits or
    does not answer within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise ServiceFailed(process.stdout.read().decode()[-3000:])  # type: ignore[union-attr]
        if time.monotonic() >= deadline:
            raise ServiceFailed("teamtr serve did not become healthy")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
