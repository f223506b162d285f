"""The usage table's foreign keys, checked per statement on PostgreSQL (migration 0015): a record naming an
operator, buyer, cluster or price card that does not exist is refused with nothing written; a row usage
records name cannot be deleted; and the locks hold under a real race (a delete beside an insert, either
first). The batch service's own checks (unknown cluster or buyer) are in test_usage_batch."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

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


def insert_many(rows: list[dict[str, int]]) -> None:
    """One statement of several usage rows (as the batch service writes them: one statement per batch)."""
    values = ", ".join(
        ["(nextval('metering_usagerecord_id_seq'), %s, %s, %s, 8, %s, %s, %s, %s, '', '', %s)"] * len(rows)
    )
    params: list[object] = []
    for n, row in enumerate(rows):
        params += [row["operator_id"], row["cluster_id"], row["buyer_id"], NOW - timedelta(hours=2),
                   NOW - timedelta(hours=1), row["price_card_id"], f"many-{n}", NOW]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO metering_usagerecord (id, operator_id, cluster_id, buyer_id, cards, start_at, end_at,"  # noqa: S608
            " price_card_id, idempotency_key, reference, body_hash, received_at) VALUES " + values,
            params,
        )  # placeholders only: the values are parameters


@pytest.mark.django_db
def test_a_statement_naming_several_missing_rows_names_each_once_in_order_and_writes_nothing() -> None:
    seller, cluster, card, buyer = world()
    good = {
        "operator_id": seller.pk,
        "cluster_id": cluster.pk,
        "buyer_id": buyer.pk,
        "price_card_id": card.pk,
    }
    rows = [
        good,
        {**good, "cluster_id": 999_998},
        {**good, "cluster_id": 999_997},
        {**good, "cluster_id": 999_998},
    ]
    with pytest.raises(IntegrityError, match=r"names no cluster 999997, 999998(\n|$)"), transaction.atomic():
        insert_many(rows)
    rows = [good, {**good, "buyer_id": 999_996}, {**good, "operator_id": 999_995}]
    with (
        pytest.raises(IntegrityError, match=r"names no organisation 999995, 999996(\n|$)"),
        transaction.atomic(),
    ):
        insert_many(rows)
    assert not UsageRecord.objects.exists()


@pytest.mark.django_db
def test_the_parent_checks_probe_each_named_row_by_its_key_in_id_order() -> None:
    """The check's statements, as PostgreSQL ran them (auto_explain, nested statements, as notices): on
    every parent table a primary-key probe per distinct id, in the order of the sorted ids, never a read of
    the whole table (0015 hashed the statement's rows against a Seq Scan of each parent, then sorted)."""
    seller, cluster, card, _ = world()
    clusters = [cluster] + [
        make_cluster(operator=seller, hub="gz", name=f"gy-{n:02d}", islands=[("i", 8)]) for n in range(5)
    ]
    cards = [card] + [make_price_card(cluster=c) for c in clusters[1:]]
    buyers = [BuyerFactory(slug=f"b{n}", name=f"Buyer {n}") for n in range(4)]
    rows = [
        {"operator_id": seller.pk, "cluster_id": c.pk, "buyer_id": b.pk, "price_card_id": p.pk}
        for c, p in zip(clusters, cards, strict=True)
        for b in buyers
    ]
    notices: list[str] = []
    with transaction.atomic(), connection.cursor() as cursor:
        try:
            with transaction.atomic():
                cursor.execute("LOAD 'auto_explain'")
        except Exception as error:  # a server without the module, or a role that may not load it
            pytest.skip(f"auto_explain cannot be loaded here: {error}")
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            cursor.execute(f"SET LOCAL auto_explain.{setting}")

        def keep(diagnostic: Any) -> None:
            notices.append(diagnostic.message_primary or "")

        connection.connection.add_notice_handler(keep)
        try:
            insert_many(rows)
        finally:
            connection.connection.remove_notice_handler(keep)
    assert UsageRecord.objects.count() == len(rows)
    for table in ("core_organisation", "federation_cluster", "metering_pricecard"):
        plans = [n for n in notices if "FOR KEY SHARE" in n and f"FROM {table}" in n]
        assert len(plans) == 1, (table, notices)
        text = plans[0].split("FOR KEY SHARE", 1)[1]  # the plan, after the statement's text
        assert "Seq Scan" not in text and "Hash" not in text and "Sort" not in text, text
        assert f"Index Scan using {table}_pkey" in text, text
        assert text.index("Function Scan") < text.index("LockRows"), text  # locks follow the sorted ids
