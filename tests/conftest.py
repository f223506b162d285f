"""Shared fixtures. Tests run on SQLite by default and on PostgreSQL when DATABASE_URL is set (CI)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.db import connection
from rest_framework.test import APIClient

from core.models import Organisation
from core.services import api_token_create
from tests.factories import OperatorFactory


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import os

    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    skip_pg = pytest.mark.skip(
        reason="needs PostgreSQL (row locks and real concurrency); set DATABASE_URL to a PostgreSQL database"
    )
    skip_trace = pytest.mark.skip(
        reason="reads ../shared/data reference traces; set CARDHOUR_TRACES=1 to run"
    )
    for item in items:
        if "postgres" in item.keywords and "postgresql" not in engine:
            item.add_marker(skip_pg)
        if "trace" in item.keywords and os.environ.get("CARDHOUR_TRACES") != "1":
            item.add_marker(skip_trace)


@pytest.fixture(autouse=True)
def _reference_data(request: pytest.FixtureRequest) -> None:
    """Reference rows (hubs, catalog) come from a data migration; a transactional test's flush removes
    them, so tests that touch the database get them back if they are missing."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None and not {"db", "transactional_db"} & set(request.fixturenames):
        return
    request.getfixturevalue("transactional_db" if marker and marker.kwargs.get("transaction") else "db")
    from django.apps import apps

    from federation.catalog import load_reference_data
    from federation.models import Hub

    if not Hub.objects.exists():
        load_reference_data(apps)

    from metering.models import Tariff
    from metering.services.tariffs import tariff_presets_load

    if not Tariff.objects.filter(owner__isnull=True).exists():
        tariff_presets_load(apps)


@pytest.fixture
def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture(params=[None, 1], ids=["bound", "prepared"])
def prepare_threshold(request: pytest.FixtureRequest) -> Iterator[int | None]:
    """On PostgreSQL, psycopg's prepare threshold on the test connection, for statements run through
    core.db.bound_cursor: bound on the server and never prepared (None, as in the other tests), or prepared
    at their first run (1), as production prepares them (at its threshold). Elsewhere nothing changes."""
    if connection.vendor != "postgresql":
        yield None
        return
    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold
    raw.prepare_threshold = request.param
    yield request.param
    raw.prepare_threshold = before


@pytest.fixture
def token_client() -> Callable[[Organisation], APIClient]:
    """A factory of API clients authenticated with a fresh read-write token of an organisation."""

    def make(
        organisation: Organisation, scope: str = "read_write", can_manage_tokens: bool = False
    ) -> APIClient:
        _, secret = api_token_create(
            organisation=organisation, name="test", scope=scope, can_manage_tokens=can_manage_tokens
        )
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return client

    return make


@pytest.fixture
def operator(db: None) -> Organisation:
    return OperatorFactory(slug="cucc", name="China Unicom")


@pytest.fixture
def other_operator(db: None) -> Organisation:
    return OperatorFactory(slug="cmcc", name="China Mobile")


@pytest.fixture
def api(operator: Organisation, token_client: Callable[[Organisation], APIClient]) -> APIClient:
    return token_client(operator)


@pytest.fixture
def other_api(other_operator: Organisation, token_client: Callable[[Organisation], APIClient]) -> APIClient:
    return token_client(other_operator)
