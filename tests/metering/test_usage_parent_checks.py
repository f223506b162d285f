"""The usage table's foreign keys, checked per statement on PostgreSQL (migration 0015): a record naming an
operator, buyer, cluster or price card that does not exist is refused with nothing written; a row usage
records name cannot be deleted; and the locks hold under a real race (a delete beside an insert, either
first). The batch service's own checks (unknown cluster or buyer) are in test_usage_batch."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, connections, transaction

from core.models import Organisation
from federation.models import Cluster
from metering.models import PriceCard, UsageKey, UsagePending, UsageRecord
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_price_card

pytestmark = pytest.mark.postgres

CPI = "cpi:cucc:nx:zw-ai01"
NOW = datetime(2027, 7, 3, 12, tzinfo=UTC)


def world() -> tuple[Organisation, Cluster, PriceCard, Organisation]:
    from metering.services.tariffs import tariff_presets_install

    seller = OperatorFactory(slug="cucc", name="China Unicom")
    cluster = make_cluster(operator=seller, islands=[("isl-01", 64)])
    tariff_presets_install()
    card = make_price_card(cluster=cluster, rate="10.0000", tariff_code="cn-gd")
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    return seller, cluster, card, buyer


def report(operator: Organisation, key: str = "k-1") -> None:
    start = NOW - timedelta(hours=2)
    usage_record_create_batch(
        operator=operator,
        records=[
            UsageRecordInput(
                idempotency_key=key,
                cluster=CPI,
                buyer="acme",
                cards=8,
                start_at=start,
                end_at=start + timedelta(hours=1),
                price_card_version=1,
                reference="lease:1",
            )
        ],
        now=NOW,
    )


def insert_raw(*, operator_id: int, cluster_id: int, buyer_id: int, price_card_id: int, key: str) -> None:
    """A usage row as the batch service's statement writes it, past the service's own look-ups."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO metering_usagerecord (id, operator_id, cluster_id, buyer_id, cards, start_at, end_at,"
            " price_card_id, idempotency_key, reference, body_hash, received_at)"
            " VALUES (nextval('metering_usagerecord_id_seq'), %s, %s, %s, 8, %s, %s, %s, %s, '', '', %s)",
            [operator_id, cluster_id, buyer_id, NOW - timedelta(hours=2), NOW - timedelta(hours=1),
             price_card_id, key, NOW],
        )  # fmt: skip


def delete_raw(table: str, pk: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id = %s", [pk])  # noqa: S608


@pytest.mark.django_db
@pytest.mark.parametrize("missing", ["operator", "buyer", "cluster", "price_card"])
def test_a_record_naming_a_missing_row_is_refused_and_nothing_is_written(missing: str) -> None:
    seller, cluster, card, buyer = world()
    ids = {"operator_id": seller.pk, "cluster_id": cluster.pk, "buyer_id": buyer.pk, "price_card_id": card.pk}
    insert_raw(**ids, key="fine")  # the same statement with every row present passes
    ids[f"{missing}_id"] = 999_999
    with pytest.raises(IntegrityError, match="names no"), transaction.atomic():
        insert_raw(**ids, key="bad")
    assert list(UsageRecord.objects.values_list("idempotency_key", flat=True)) == ["fine"]


@pytest.mark.django_db
@pytest.mark.parametrize("parent", ["operator", "buyer", "cluster", "price_card"])
def test_a_row_named_by_usage_cannot_be_deleted(parent: str) -> None:
    seller, cluster, card, buyer = world()
    report(seller)
    table, pk = {
        "operator": ("core_organisation", seller.pk),
        "buyer": ("core_organisation", buyer.pk),
        "cluster": ("federation_cluster", cluster.pk),
        "price_card": ("metering_pricecard", card.pk),
    }[parent]
    with pytest.raises(IntegrityError, match="still named by usage records"), transaction.atomic():
        delete_raw(table, pk)
    assert UsageRecord.objects.count() == UsageKey.objects.count() == UsagePending.objects.count() == 1


@pytest.mark.django_db
def test_rows_no_usage_names_can_be_deleted() -> None:
    seller, _, _, _ = world()
    report(seller)
    other = make_cluster(operator=seller, hub="gz", name="gy-01", islands=[("isl-01", 8)])
    spare = make_price_card(cluster=other)
    stranger = BuyerFactory(slug="nobody", name="Nobody")
    delete_raw("metering_pricecard", spare.pk)
    delete_raw("core_organisation", stranger.pk)
    assert not PriceCard.objects.filter(pk=spare.pk).exists()
    assert not Organisation.objects.filter(pk=stranger.pk).exists()


def _race(first: Callable[[], None], second: Callable[[], None]) -> BaseException | None:
    """Run ``first`` in an open transaction on this thread, ``second`` on another thread (its own
    connection) while ``first`` holds its locks; commit ``first``; return what ``second`` raised."""
    outcome: list[BaseException | None] = []
    started = threading.Event()

    def other() -> None:
        try:
            started.set()
            with transaction.atomic():
                second()
            outcome.append(None)
        except BaseException as error:  # handed to the test
            outcome.append(error)
        finally:
            connections.close_all()

    with transaction.atomic():
        first()
        thread = threading.Thread(target=other)
        thread.start()
        started.wait(5)
        thread.join(0.5)
        assert thread.is_alive(), "the second transaction should wait for the first's locks"
    thread.join(20)
    assert not thread.is_alive()
    return outcome[0]


@pytest.mark.django_db(transaction=True)
def test_a_delete_racing_an_insert_waits_for_it_and_is_refused() -> None:
    seller, cluster, _, _ = world()
    error = _race(lambda: report(seller), lambda: delete_raw("federation_cluster", cluster.pk))
    assert isinstance(error, IntegrityError)
    assert Cluster.objects.filter(pk=cluster.pk).exists()
    assert UsageRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_insert_racing_a_delete_waits_for_it_and_is_refused() -> None:
    seller, cluster, card, buyer = world()
    spare = make_price_card(cluster=make_cluster(operator=seller, hub="gz", name="gy-01", islands=[("i", 8)]))

    def insert() -> None:
        insert_raw(
            operator_id=seller.pk,
            cluster_id=spare.cluster_id,
            buyer_id=buyer.pk,
            price_card_id=spare.pk,
            key="x",
        )

    error = _race(lambda: delete_raw("metering_pricecard", spare.pk), insert)
    assert isinstance(error, IntegrityError)
    assert not UsageRecord.objects.exists()
    assert cluster.pk and card.pk
