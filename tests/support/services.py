"""The replica tests' services (teamtr.serving.local_replicas): a real PostgreSQL 15 and a real HAProxy
(Debian's packages) on loopback. Where one is not installed the test skips with its reason ("PostgreSQL
is not installed", "HAProxy is not installed"), which tests/support/ci_strict.py turns into a failure
under CI=true (scripts/setup_services.sh installs them there)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from teamtr.serving import local_replicas
from teamtr.serving.local_replicas import ServiceMissing, require_haproxy, require_postgres


def _skip_if_missing(require: Callable[[], object]) -> None:
    try:
        require()
    except ServiceMissing as missing:
        pytest.skip(str(missing))


@contextmanager
def postgres_server() -> Iterator[str]:
    """`local_replicas.postgres_server`, skipping where PostgreSQL is not installed."""
    _skip_if_missing(require_postgres)
    with local_replicas.postgres_server() as url:
        yield url


@contextmanager
def haproxy(backends: list[str]) -> Iterator[str]:
    """`local_replicas.haproxy`, skipping where HAProxy is not installed."""
    _skip_if_missing(require_haproxy)
    with local_replicas.haproxy(backends) as url:
        yield url
