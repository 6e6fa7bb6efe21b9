"""Fixtures of the serving tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.services import postgres_server


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server for one test module (tests/support/services.py); its URL."""
    with postgres_server() as url:
        yield url
