"""Usage history partitioned by month (PostgreSQL): months created ahead by the beat's service, idempotently;
a record and its segments land in their month's partition; idempotency keys unique across months; a month's
close prunes later months; retention refuses what is not closed; the migration moves rows losslessly (and
back). Key semantics and the migration's backfill are checked on SQLite too."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from core.models import Organisation
from federation.models import Cluster
from metering.errors import PartitionNotRetainableError
from metering.models import PriceCard, RatedSegment, UsageKey, UsagePending, UsageRecord
from metering.services import partitions
from metering.services.billing import _uninvoiced_segments
from metering.services.maintenance import ledger_reconcile
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_price_card

SHANGHAI = ZoneInfo("Asia/Shanghai")
CPI = "cpi:cucc:nx:zw-ai01"


def sh(*args: int) -> datetime:
    return datetime(*args, tzinfo=SHANGHAI)


def record(key: str, start: datetime, *, minutes: int = 60, cards: int = 8) -> UsageRecordInput:
    return UsageRecordInput(
        idempotency_key=key,
        cluster=CPI,
        buyer="acme",
        cards=cards,
        start_at=start,
        end_at=start + timedelta(minutes=minutes),
        price_card_version=1,
        reference="lease:1",
    )


@pytest.fixture
def world(db: None) -> tuple[Organisation, Cluster, PriceCard]:
    from metering.services.tariffs import tariff_presets_install

    seller = OperatorFactory(slug="cucc", name="China Unicom")
    cluster = make_cluster(operator=seller, islands=[("isl-01", 64)])
    tariff_presets_install()
    card = make_price_card(cluster=cluster, rate="10.0000", tariff_code="cn-gd")
    BuyerFactory(slug="acme", name="Acme AI")
    return seller, cluster, card


def partition_of(table: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE id = %s", [pk])  # noqa: S608
        return cursor.fetchone()[0]


def children(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
            [table],
        )
        return {name for (name,) in cursor.fetchall()}


# --- Keys: unique per operator across months (both databases) -------------------------------------------


def test_the_same_key_in_another_month_is_still_a_duplicate_or_a_conflict(
    world: tuple[Organisation, Cluster, PriceCard],
) -> None:
    seller, _, _ = world
    now = sh(2027, 7, 3, 12)
    if connection.vendor == "postgresql":
        partitions.usage_partitions_ensure(now=now)
    june = record("k-1", sh(2027, 6, 29, 10))
    july = replace(june, start_at=sh(2027, 7, 2, 10), end_at=sh(2027, 7, 2, 11))

    first = usage_record_create_batch(operator=seller, records=[june], now=now)
    again = usage_record_create_batch(operator=seller, records=[june, july], now=now)
    # And the other way round: a July key first, then a June body under it.
    usage_record_create_batch(operator=seller, records=[replace(july, idempotency_key="k-2")], now=now)
    late = usage_record_create_batch(operator=seller, records=[replace(june, idempotency_key="k-2")], now=now)

    [created] = first.outcomes
    assert created.status == "created"
    assert [(o.status, o.record_id) for o in again.outcomes] == [
        ("duplicate", created.record_id),
        ("conflict", created.record_id),
    ]
    assert [o.status for o in late.outcomes] == ["conflict"]
    assert UsageRecord.objects.count() == 2 == UsageKey.objects.count()
    assert UsagePending.objects.count() == 2
    stored = UsageKey.objects.get(operator=seller, idempotency_key="k-1")
    assert (stored.usage_record_id, stored.start_at) == (created.record_id, june.start_at)
    if connection.vendor == "postgresql":
        assert partition_of("metering_usagerecord", created.record_id) == "metering_usagerecord_p202706"
    assert ledger_reconcile().ok


def test_another_operator_may_use_the_same_key(world: tuple[Organisation, Cluster, PriceCard]) -> None:
    seller, _, _ = world
    other = OperatorFactory(slug="ctyun", name="China Telecom")
    other_cluster = make_cluster(operator=other, hub="gz", name="gy-01", islands=[("isl-01", 64)])
    make_price_card(cluster=other_cluster)
    now = sh(2027, 7, 3, 12)
    if connection.vendor == "postgresql":
        partitions.usage_partitions_ensure(now=now)
    mine = usage_record_create_batch(operator=seller, records=[record("k-1", sh(2027, 7, 1, 10))], now=now)
    theirs = usage_record_create_batch(
        operator=other,
        records=[replace(record("k-1", sh(2027, 7, 1, 10)), cluster=other_cluster.cpi)],
        now=now,
    )
    assert mine.created == theirs.created == 1


# --- Partitions (PostgreSQL) ------------------------------------------------------------------------------


@pytest.mark.postgres
def test_months_are_created_ahead_and_a_second_run_creates_nothing(db: None) -> None:
    now = sh(2031, 5, 20, 12)
    created = partitions.usage_partitions_ensure(now=now, months_ahead=2)
    # From the month the 35-day late window reaches back to (April) to two months after May.
    assert sorted(created) == sorted(
        f"{table}_p{year}{month}"
        for table in partitions.PARTITIONED_TABLES
        for year, month in (("2031", "04"), ("2031", "05"), ("2031", "06"), ("2031", "07"))
    )
    assert partitions.usage_partitions_ensure(now=now, months_ahead=2) == []
    assert {"metering_usagerecord_p203104", "metering_usagerecord_p203107"} <= children(
        "metering_usagerecord"
    )
    assert "metering_ratedsegment_p203107" in children("metering_ratedsegment")
    # Bounds are local midnights of the billing zone, the same as the billing period's.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'metering_usagerecord_p203105'"
        )
        bound = cursor.fetchone()[0]
    assert "2031-04-30 16:00:00+00" in bound and "2031-05-31 16:00:00+00" in bound


@pytest.mark.postgres
def test_a_record_of_a_new_month_and_its_segments_land_in_that_months_partition(
    world: tuple[Organisation, Cluster, PriceCard],
) -> None:
    seller, _, _ = world
    now = sh(2031, 5, 2, 12)
    partitions.usage_partitions_ensure(now=now)
    # Starts 30 April 23:00 and runs into May: one record, April's month.
    result = usage_record_create_batch(
        operator=seller, records=[record("k-1", sh(2031, 4, 30, 23), minutes=120)], now=now
    )
    [outcome] = result.outcomes
    assert partition_of("metering_usagerecord", outcome.record_id) == "metering_usagerecord_p203104"
    assert usage_rate_pending(now=now) == 1
    segments = list(RatedSegment.objects.filter(usage_record_id=outcome.record_id).order_by("seq"))
    assert len(segments) >= 2 and segments[-1].start_at >= sh(2031, 5, 1)
    # Every segment sits with its record (partitioned by the record's start), even the one in May.
    assert {partition_of("metering_ratedsegment", s.pk) for s in segments} == {
        "metering_ratedsegment_p203104"
    }
    assert all(s.record_start_at == sh(2031, 4, 30, 23) for s in segments)
    assert sum(s.card_seconds for s in segments) == 8 * 7200
    assert ledger_reconcile().ok


@pytest.mark.postgres
def test_rows_caught_by_the_default_partition_move_into_their_month_when_it_is_created(
    world: tuple[Organisation, Cluster, PriceCard],
) -> None:
    seller, _, _ = world
    now = sh(2032, 3, 10, 12)
    result = usage_record_create_batch(operator=seller, records=[record("k-1", sh(2032, 3, 9, 10))], now=now)
    [outcome] = result.outcomes
    assert partition_of("metering_usagerecord", outcome.record_id) == "metering_usagerecord_default"
    usage_rate_pending(now=now)
    before = list(RatedSegment.objects.order_by("id").values_list())

    created = partitions.usage_partitions_ensure(now=now, months_ahead=0)

    assert "metering_usagerecord_p203203" in created and "metering_ratedsegment_p203203" in created
    assert partition_of("metering_usagerecord", outcome.record_id) == "metering_usagerecord_p203203"
    assert list(RatedSegment.objects.order_by("id").values_list()) == before
    assert {partition_of("metering_ratedsegment", pk) for pk, *_ in before} == {
        "metering_ratedsegment_p203203"
    }
    again = usage_record_create_batch(operator=seller, records=[record("k-1", sh(2032, 3, 9, 10))], now=now)
    assert [o.status for o in again.outcomes] == ["duplicate"]
    assert ledger_reconcile().ok


@pytest.mark.postgres
def test_a_months_close_reads_no_partition_after_the_period(db: None) -> None:
    now = sh(2031, 5, 20, 12)
    partitions.usage_partitions_ensure(now=now, months_ahead=2)
    _, end_at = partitions.partition_bounds(date(2031, 5, 1))
    plan = _uninvoiced_segments(end_at=end_at).explain()
    assert "metering_ratedsegment_p203105" in plan and "metering_ratedsegment_p203104" in plan
    assert "metering_ratedsegment_p203106" not in plan and "metering_ratedsegment_p203107" not in plan


@pytest.mark.postgres
def test_retention_refuses_a_month_inside_the_late_window_or_still_pending(
    world: tuple[Organisation, Cluster, PriceCard],
) -> None:
    seller, _, _ = world
    then = sh(2031, 1, 20, 12)
    partitions.usage_partitions_ensure(now=then, months_ahead=0)
    usage_record_create_batch(operator=seller, records=[record("k-1", sh(2031, 1, 19, 10))], now=then)

    with pytest.raises(PartitionNotRetainableError, match="late window"):
        partitions.usage_partition_detach(month=date(2031, 1, 1), now=sh(2031, 2, 10))
    with pytest.raises(PartitionNotRetainableError, match="waits for rating"):
        partitions.usage_partition_detach(month=date(2031, 1, 1), now=sh(2031, 6, 1))
    usage_rate_pending(now=then)
    with pytest.raises(PartitionNotRetainableError, match="no issued statement"):
        partitions.usage_partition_detach(month=date(2031, 1, 1), now=sh(2031, 6, 1))
    assert "metering_usagerecord_p203101" in children("metering_usagerecord")


@pytest.mark.postgres
def test_retention_detaches_a_closed_month_of_both_tables_and_its_keys(
    world: tuple[Organisation, Cluster, PriceCard],
) -> None:
    seller, _, _ = world
    then = sh(2030, 12, 20, 12)
    partitions.usage_partitions_ensure(now=then, months_ahead=0)
    [old] = usage_record_create_batch(
        operator=seller, records=[record("k-old", sh(2030, 12, 19, 10))], now=then
    ).outcomes
    usage_rate_pending(now=then)
    # Stand-in for the close (covered by its own tests): every segment of the month on a statement.
    from metering.models import Invoice, Settlement

    invoice = Invoice.objects.create(
        buyer=Organisation.objects.get(slug="acme"),
        period_start=date(2030, 12, 1),
        period_end=date(2031, 1, 1),
        number="INV-203012-1",
        issued_at=sh(2031, 1, 1, 1),
    )
    settlement = Settlement.objects.create(
        operator=seller,
        period_start=date(2030, 12, 1),
        period_end=date(2031, 1, 1),
        number="STL-203012-1",
        issued_at=sh(2031, 1, 1, 1),
    )
    RatedSegment.objects.update(invoice=invoice, settlement=settlement)

    names = partitions.usage_partition_detach(month=date(2030, 12, 1), now=sh(2031, 6, 1))

    assert names == ["metering_usagerecord_p203012", "metering_ratedsegment_p203012"]
    assert "metering_usagerecord_p203012" not in children("metering_usagerecord")
    assert not UsageRecord.objects.filter(pk=old.record_id).exists()
    assert not UsageKey.objects.filter(idempotency_key="k-old").exists()
    with connection.cursor() as cursor:  # kept as a plain table, to archive
        cursor.execute("SELECT count(*) FROM metering_usagerecord_p203012")
        assert cursor.fetchone()[0] == 1
    with pytest.raises(PartitionNotRetainableError, match="No attached partitions"):
        partitions.usage_partition_detach(month=date(2030, 12, 1), now=sh(2031, 6, 1))


# --- The migration (both databases; partitions on PostgreSQL) -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_existing_rows_losslessly_and_back(
    world: tuple[Organisation, Cluster, PriceCard],
) -> None:
    seller, cluster, card = world
    buyer = Organisation.objects.get(slug="acme")
    before_state = ("metering", "0013_sla_credits")
    after_state = ("metering", "0014_usage_partitions")
    executor = MigrationExecutor(connection)
    executor.migrate([before_state])
    old = executor.loader.project_state(before_state).apps
    OldRecord = old.get_model("metering", "UsageRecord")
    OldSegment = old.get_model("metering", "RatedSegment")
    OldPending = old.get_model("metering", "UsagePending")
    LedgerTransfer = old.get_model("metering", "LedgerTransfer")
    transfer = LedgerTransfer.objects.create(
        kind="usage",
        idempotency_key="usage:test",
        description="t",
        posted_by="test",
        posted_at=sh(2026, 3, 5),
    )
    starts = [sh(2026, 3, 4, 10), sh(2026, 10, 31, 23, 30), sh(2026, 11, 2, 8)]
    records = [
        OldRecord.objects.create(
            operator_id=seller.pk,
            cluster_id=cluster.pk,
            buyer_id=buyer.pk,
            cards=4,
            start_at=start,
            end_at=start + timedelta(hours=1),
            price_card_id=card.pk,
            idempotency_key=f"k-{n}",
            reference="lease:1",
            body_hash=f"{n:064d}",
            received_at=start + timedelta(hours=2),
        )
        for n, start in enumerate(starts)
    ]
    for r in records[:2]:
        for seq, (low, high) in enumerate(((0, 30), (30, 60))):
            OldSegment.objects.create(
                usage_record_id=r.pk,
                buyer_id=buyer.pk,
                operator_id=seller.pk,
                seq=seq,
                start_at=r.start_at + timedelta(minutes=low),
                end_at=r.start_at + timedelta(minutes=high),
                band="flat",
                multiplier="1.0000",
                card_seconds=4 * 1800,
                pack_class="a800",
                pack_draw=2_000_000,
                gross=20_000_000,
                commission=2_000_000,
                buyer_value=20_000_000,
                transfer_id=transfer.pk,
            )
    r = records[2]
    OldPending.objects.create(
        usage_record_id=r.pk,
        operator_id=seller.pk,
        cluster_id=cluster.pk,
        buyer_id=buyer.pk,
        price_card_id=card.pk,
        cards=4,
        start_at=r.start_at,
        end_at=r.end_at,
    )
    record_rows = list(OldRecord.objects.order_by("id").values_list())
    segment_rows = list(OldSegment.objects.order_by("id").values_list())
    segment_ids = [row[0] for row in segment_rows]

    executor = MigrationExecutor(connection)
    executor.migrate([after_state])

    assert list(
        UsageRecord.objects.order_by("id").values_list(*[f.attname for f in OldRecord._meta.fields])
    ) == (record_rows)
    assert (
        list(RatedSegment.objects.order_by("id").values_list(*[f.attname for f in OldSegment._meta.fields]))
        == segment_rows
    )
    assert [s.record_start_at for s in RatedSegment.objects.order_by("id")] == [starts[0]] * 2 + [
        starts[1]
    ] * 2
    assert sorted(UsageKey.objects.values_list("usage_record_id", "idempotency_key", "start_at")) == [
        (r.pk, r.idempotency_key, r.start_at) for r in records
    ]
    assert list(UsagePending.objects.values_list("usage_record_id", flat=True)) == [records[2].pk]
    if connection.vendor == "postgresql":
        # Months from the oldest row's; 31 Oct 23:30 local is in October (the billing zone's months).
        assert partition_of("metering_usagerecord", records[0].pk) == "metering_usagerecord_p202603"
        assert partition_of("metering_usagerecord", records[1].pk) == "metering_usagerecord_p202610"
        assert partition_of("metering_ratedsegment", segment_ids[2]) == "metering_ratedsegment_p202610"
        assert partition_of("metering_usagerecord", records[2].pk) == "metering_usagerecord_p202611"
        with connection.cursor() as cursor:
            cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'metering_usagerecord'")
            assert cursor.fetchone()[0] == "p"
    # Ids continue after the moved rows.
    [fresh] = usage_record_create_batch(
        operator=seller,
        records=[record("k-new", sh(2026, 11, 20, 10))],
        now=sh(2026, 11, 21),
    ).outcomes
    assert fresh.status == "created" and fresh.record_id > max(r.pk for r in records)
