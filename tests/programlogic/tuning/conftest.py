"""The tuning tests' fixtures: a PostgreSQL cluster for studies shared between tuners."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.programlogic.tuning.postgres_cluster import postgres_cluster


@pytest.fixture(scope="session")
def postgresql_url() -> Iterator[str]:
    """The SQLAlchemy URL of a database on a cluster of the test session's own."""
    with postgres_cluster() as url:
        yield url
