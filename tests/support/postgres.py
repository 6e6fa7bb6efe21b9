"""A real PostgreSQL 15 server for the tests of the replicas' shared store (serving/pg_store.py).

`postgres_server()` runs Debian's `initdb` and `pg_ctl` (/usr/lib/postgresql/15/bin, or TEAMTR_PG_BIN) in
a fresh data directory on a free loopback port and yields its URL; the server stops when the block ends.
PostgreSQL refuses to run as root: as root (CI), the data directory is given to the `postgres` user and
the commands run as that user (`runuser`). Where PostgreSQL is not installed the tests skip with "PostgreSQL
is not installed", which tests/support/ci_strict.py turns into a failure under CI=true.
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

import pytest

from teamtr.engines.vllm_server import free_port

PG_BIN = Path(os.environ.get("TEAMTR_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"  # the non-root user the server runs as when the tests run as root


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", PG_USER, "--", *command]


def require_postgres() -> None:
    if not (PG_BIN / "initdb").is_file() or not (PG_BIN / "pg_ctl").is_file():
        pytest.skip(f"PostgreSQL is not installed (no initdb / pg_ctl in {PG_BIN}; apt-get install postgresql-15)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("PostgreSQL is not installed for root use: runuser is missing")


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
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"

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
            assert time.monotonic() < deadline, f"PostgreSQL at {url} did not accept connections"
            time.sleep(0.2)


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server (one per test: no test sees another's rows); its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
