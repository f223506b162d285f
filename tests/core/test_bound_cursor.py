"""core.db.bound_cursor: statements bound by PostgreSQL (and prepared, with a threshold) give what Django's
cursor gives, inside the caller's transaction, counted as queries."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from core.db import bound_cursor
from core.models import Organisation
from core.services import _active_token_by_prefix, api_token_create
from tests.factories import BuyerFactory

pytestmark = pytest.mark.django_db


def test_a_bound_cursor_reads_what_djangos_cursor_reads(prepare_threshold) -> None:
    buyer = BuyerFactory()
    sql = 'SELECT "id", "slug", "created_at" FROM "core_organisation" WHERE "id" = %s'
    with connection.cursor() as cursor:
        cursor.execute(sql, [buyer.pk])
        expected = cursor.fetchall()
    with CaptureQueriesContext(connection) as queries:
        for _ in range(4):  # past the threshold: prepared, then run prepared
            with bound_cursor() as cursor:
                cursor.execute(sql, [buyer.pk])
                assert cursor.fetchall() == expected
    assert len(queries) == 4


def test_the_token_lookup_finds_a_live_token_again_and_again(prepare_threshold) -> None:
    buyer = BuyerFactory()
    token, _raw = api_token_create(organisation=buyer, name="t")
    for _ in range(4):
        found = _active_token_by_prefix(prefix=token.prefix)
        assert found is not None and found.pk == token.pk
        assert found.organisation == buyer and isinstance(found.organisation, Organisation)
    token.revoked_at = token.created_at
    token.save(update_fields=["revoked_at"])
    assert _active_token_by_prefix(prefix=token.prefix) is None  # revocation is seen at once


def test_a_bound_cursor_writes_in_the_callers_transaction_and_errors_are_djangos(prepare_threshold) -> None:
    buyer = BuyerFactory()
    with transaction.atomic():
        with bound_cursor() as cursor:
            cursor.execute(
                'UPDATE "core_organisation" SET "name" = %s WHERE "id" = %s', ["renamed", buyer.pk]
            )
        transaction.set_rollback(True)
    buyer.refresh_from_db()
    assert buyer.name != "renamed"
    other = BuyerFactory()
    with pytest.raises(IntegrityError), transaction.atomic(), bound_cursor() as cursor:
        cursor.execute('UPDATE "core_organisation" SET "slug" = %s WHERE "id" = %s', [buyer.slug, other.pk])
