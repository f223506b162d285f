"""Rating: band splitting, exact prices, pack draws, arrears and flags, idempotency, crash and concurrency."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, connections
from django.db.models import Sum

from core.models import Organisation
from federation.models import Cluster
from metering.models import (
    BuyerExhaustion,
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    PriceCard,
    RatedSegment,
    UsagePending,
    UsageRecord,
)
from metering.services import rating
from metering.services.maintenance import ledger_reconcile
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.factories import BuyerFactory
from tests.metering.conftest import local
from tests.metering.factories import make_paid_pack

CPI = "cpi:cucc:nx:zw-ai01"
A800 = "nvidia-a800-sxm4-80gb"
M = 1_000_000


def report(
    operator: Organisation, *records: tuple[str, int, object, object], buyer: str = "acme"
) -> list[int]:
    result = usage_record_create_batch(
        operator=operator,
        records=[
            UsageRecordInput(
                idempotency_key=key,
                cluster=CPI,
                buyer=buyer,
                cards=cards,
                start_at=start,
                end_at=end,
                price_card_version=1,
            )
            for key, cards, start, end in records
        ],
    )
    return [o.record_id for o in result.outcomes]


def balances() -> dict[str, int]:
    return dict(LedgerAccount.objects.values_list("key", "balance"))


def assert_ledger_balanced() -> None:
    per_unit = LedgerEntry.objects.values("unit").annotate(total=Sum("amount"))
    assert {row["unit"]: row["total"] for row in per_unit} == {row["unit"]: 0 for row in per_unit}
    for account in LedgerAccount.objects.all():
        total = LedgerEntry.objects.filter(account=account).aggregate(t=Sum("amount"))["t"] or 0
        assert account.balance == total, account.key


@pytest.fixture
def world(
    seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard, buyer: Organisation
) -> tuple[Organisation, Organisation]:
    return seller, buyer


def test_one_record_across_two_bands(world: tuple[Organisation, Organisation]) -> None:
    """07:00–09:00 in Guangdong: one valley hour (0.38) and one flat hour (1.0), 8 A800 cards at 10 CNY."""
    seller, buyer = world
    pack = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", paid_at=local(5, 0))
    (record_id,) = report(seller, ("r-1", 8, local(3, 7), local(3, 9)))

    assert usage_rate_pending() == 1

    segments = list(RatedSegment.objects.filter(usage_record_id=record_id).order_by("seq"))
    assert [(s.band, s.multiplier, s.card_seconds) for s in segments] == [
        ("valley", Decimal("0.3800"), 8 * 3600),
        ("flat", Decimal("1.0000"), 8 * 3600),
    ]
    assert [(s.start_at, s.end_at) for s in segments] == [
        (local(3, 7), local(3, 8)),
        (local(3, 8), local(3, 9)),
    ]
    # gross = 10 CNY × 8 card-hours × multiplier; commission 10 %; the pack draws card-hours × multiplier,
    # worth 10 CNY each (1000 CNY / 100 card-hours).
    assert [(s.pack_draw, s.gross, s.commission, s.buyer_value) for s in segments] == [
        (3_040_000, 30_400_000, 3_040_000, 30_400_000),
        (8_000_000, 80_000_000, 8_000_000, 80_000_000),
    ]
    assert all(s.pack_id == pack.pk for s in segments)
    b = balances()
    assert b[f"pack:{pack.pk}"] == 100 * M - 11_040_000
    assert b[f"operator_earnings:{seller.pk}"] == -(27_360_000 + 72_000_000)
    assert b["platform_commission"] == -11_040_000
    assert b.get("platform_spread", 0) == 0
    assert b[f"buyer_money:{buyer.pk}"] == -1000 * M + 110_400_000
    assert UsageRecord.objects.get(pk=record_id).rated_at is not None
    assert not BuyerExhaustion.objects.exists()
    assert_ledger_balanced()


def test_a_peak_hour_costs_more_than_a_valley_hour(world: tuple[Organisation, Organisation]) -> None:
    seller, buyer = world
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", paid_at=local(5, 0))
    valley, peak = report(seller, ("v", 1, local(3, 3), local(3, 4)), ("p", 1, local(3, 10), local(3, 11)))
    usage_rate_pending()
    drawn = dict(RatedSegment.objects.values_list("usage_record_id", "pack_draw"))
    assert drawn[valley] == 380_000 and drawn[peak] == 1_700_000


def test_a_standard_pack_draws_at_the_chips_factor(world: tuple[Organisation, Organisation]) -> None:
    """A800: 312 dense FP16 TFLOPS / 400 = 0.78 standard cards per card."""
    seller, buyer = world
    pack = make_paid_pack(buyer=buyer, accelerator=None, card_hours=50, price="600.00", paid_at=local(5, 0))
    report(seller, ("r", 10, local(3, 12), local(3, 13)))  # flat hour
    usage_rate_pending()
    (segment,) = RatedSegment.objects.all()
    assert segment.pack_id == pack.pk and segment.standard_factor == Decimal("0.7800")
    assert segment.pack_class == "std"
    assert segment.pack_draw == 7_800_000  # 10 card-hours × 1.0 × 0.78
    assert segment.buyer_value == 93_600_000  # 7.8 standard card-hours × 12 CNY
    assert segment.gross == 100_000_000
    assert balances()["platform_spread"] == -(93_600_000 - 100_000_000)
    assert_ledger_balanced()


def test_the_pack_that_expires_first_is_drawn_first(world: tuple[Organisation, Organisation]) -> None:
    seller, buyer = world
    late = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=10, price="100", paid_at=local(5, 0), validity_days=300
    )
    soon = make_paid_pack(
        buyer=buyer, accelerator=None, card_hours=10, price="100", paid_at=local(5, 0), validity_days=30
    )
    report(seller, ("r", 1, local(3, 12), local(3, 13)))
    usage_rate_pending()
    assert RatedSegment.objects.get().pack_id == soon.pk != late.pk


def test_a_pack_that_runs_out_mid_slice_hands_over_to_the_next(
    world: tuple[Organisation, Organisation],
) -> None:
    seller, buyer = world
    first = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=1, price="10", paid_at=local(5, 0), validity_days=30
    )
    second = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=10, price="100", paid_at=local(5, 0), validity_days=60
    )
    (record_id,) = report(seller, ("r", 2, local(3, 12), local(3, 13)))  # 2 card-hours, flat
    usage_rate_pending()

    rows = list(RatedSegment.objects.filter(usage_record_id=record_id).order_by("seq"))
    assert [(r.pack_id, r.card_seconds, r.pack_draw) for r in rows] == [
        (first.pk, 3600, 1_000_000),
        (second.pk, 3600, 1_000_000),
    ]
    assert rows[0].start_at == rows[1].start_at  # the same time slice, split between the packs
    assert Pack.objects.get(pk=first.pk).status == Pack.Status.EXHAUSTED
    assert balances()[f"pack:{first.pk}"] == 0
    assert not BuyerExhaustion.objects.exists()


def test_usage_beyond_the_packs_is_arrears_and_flags_the_buyer_at_once(
    world: tuple[Organisation, Organisation],
) -> None:
    seller, buyer = world
    pack = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="10", paid_at=local(5, 0))
    (record_id,) = report(seller, ("r", 3, local(3, 12), local(3, 13)))
    usage_rate_pending()

    rows = list(RatedSegment.objects.filter(usage_record_id=record_id).order_by("seq"))
    assert [(r.pack_id, r.card_seconds) for r in rows] == [(pack.pk, 3600), (None, 7200)]
    arrears = rows[1]
    assert arrears.pack_draw == 2 * M and arrears.buyer_value == arrears.gross == 20 * M
    flag = BuyerExhaustion.objects.get()
    assert (flag.buyer, flag.pack_class, flag.shortfall, flag.cleared_at) == (buyer, A800, 2 * M, None)
    b = balances()
    assert b[f"pack:{pack.pk}"] == 0  # never below zero
    assert b[f"arrears:{buyer.pk}:{A800}"] == -2 * M
    assert_ledger_balanced()

    # A new pack of the class clears the flag.
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="100", paid_at=local(0, 0))
    assert BuyerExhaustion.objects.get().cleared_at is not None


def test_a_pack_used_up_exactly_flags_the_buyer_before_any_arrears(
    world: tuple[Organisation, Organisation],
) -> None:
    seller, buyer = world
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1, price="10", paid_at=local(5, 0))
    report(seller, ("r", 1, local(3, 12), local(3, 13)))
    usage_rate_pending()
    flag = BuyerExhaustion.objects.get()
    assert flag.shortfall == 0 and flag.cleared_at is None


def test_a_buyer_without_packs_is_flagged(world: tuple[Organisation, Organisation]) -> None:
    seller, _buyer = world
    report(seller, ("r", 1, local(3, 12), local(3, 13)))
    usage_rate_pending()
    assert BuyerExhaustion.objects.get().shortfall == M


def test_rating_twice_changes_nothing(world: tuple[Organisation, Organisation]) -> None:
    seller, buyer = world
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000", paid_at=local(5, 0))
    report(seller, *[(f"r{n}", 2, local(3, n), local(3, n + 1)) for n in range(20)])
    assert usage_rate_pending(batch_size=7) == 20
    snapshot = (balances(), LedgerEntry.objects.count(), RatedSegment.objects.count())
    assert usage_rate_pending() == 0
    assert (balances(), LedgerEntry.objects.count(), RatedSegment.objects.count()) == snapshot


def test_a_thousand_duplicate_reports_are_billed_once(world: tuple[Organisation, Organisation]) -> None:
    seller, buyer = world
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000", paid_at=local(5, 0))
    for _ in range(1000 // 100):
        report(seller, *[("same-key", 4, local(3, 12), local(3, 13))] * 100)
    usage_rate_pending()
    assert UsageRecord.objects.count() == 1
    assert RatedSegment.objects.aggregate(d=Sum("pack_draw"))["d"] == 4 * M


def _run(
    seller: Organisation, buyer: Organisation, *, crash_at: int | None
) -> tuple[dict[str, int], list[tuple]]:
    """20 records over a day for ``buyer`` (2 batches of 10), optionally killed at the ``crash_at``-th
    record priced, then rated to the end. Returns the buyer's balances and its segments by record index."""
    pack = make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=30, price="300", paid_at=local(5, 0), key=f"{buyer.slug}-p"
    )
    ids = report(
        seller,
        *[(f"{buyer.slug}-{n}", 1 + n % 3, local(3, n), local(3, n + 1)) for n in range(20)],
        buyer=buyer.slug,
    )
    if crash_at is not None:
        calls = Counter[str]()

        def crash(record_id: int) -> None:
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise RuntimeError("worker killed")

        rating._before_record = crash
        try:
            with pytest.raises(RuntimeError):
                usage_rate_pending(batch_size=10, buyer=buyer)
        finally:
            rating._before_record = None
        assert UsageRecord.objects.filter(buyer=buyer).rated().count() == 10  # batch 1 kept
    usage_rate_pending(batch_size=10, buyer=buyer)
    segments = [
        (ids.index(r), seq, band, pack_draw, gross, commission, value)
        for r, seq, band, pack_draw, gross, commission, value in RatedSegment.objects.filter(
            usage_record__buyer=buyer
        )
        .order_by("usage_record_id", "seq")
        .values_list("usage_record_id", "seq", "band", "pack_draw", "gross", "commission", "buyer_value")
    ]
    own = {
        "pack": LedgerAccount.objects.get(pack=pack).balance,
        "buyer_money": LedgerAccount.objects.get(key=f"buyer_money:{buyer.pk}").balance,
        "arrears": LedgerAccount.objects.filter(key__startswith=f"arrears:{buyer.pk}:").aggregate(
            t=Sum("balance")
        )["t"],
    }
    return own, segments


def test_a_worker_killed_mid_rating_then_rerun_gives_the_identical_ledger(
    world: tuple[Organisation, Organisation],
) -> None:
    seller, buyer = world
    crashed = _run(seller, buyer, crash_at=15)  # half-way through the second batch of ten
    assert_ledger_balanced()

    twin = BuyerFactory(slug="twin")
    clean = _run(seller, twin, crash_at=None)  # the same story, never interrupted
    assert crashed == clean
    assert len(crashed[1]) >= 20 and crashed[0]["arrears"] < 0  # it ran out of card-hours: a real test
    assert_ledger_balanced()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_rating_never_posts_twice(
    seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard, buyer: Organisation
) -> None:
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1000, price="10000", paid_at=local(5, 0))
    report(
        seller,
        *[
            (f"r{n}", 1 + n % 5, local(3, 0) + timedelta(minutes=n), local(3, 0) + timedelta(minutes=n + 7))
            for n in range(400)
        ],
    )
    counts: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            barrier.wait()
            counts.append(usage_rate_pending(batch_size=50))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    assert sum(counts) == 400
    assert RatedSegment.objects.values("usage_record_id").distinct().count() == 400
    assert UsageRecord.objects.unrated().count() == 0
    assert LedgerTransfer.objects.filter(kind="usage").count() == len(
        set(RatedSegment.objects.values_list("transfer_id", flat=True))
    )
    assert_ledger_balanced()
    expected = sum(
        round(Decimal(1 + n % 5) * 7 * 60 * 10**6 / 3600 * Decimal("0.38")) for n in range(400)
    )  # all inside the valley (00:00–08:00)
    drawn = RatedSegment.objects.aggregate(d=Sum("pack_draw"))["d"]
    assert abs(drawn - expected) <= 400  # half-a-micro rounding per row at most


def test_rating_takes_records_off_the_pending_queue_and_stamps_segments_with_the_parties(
    world: tuple[Organisation, Organisation],
) -> None:
    seller, buyer = world
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000", paid_at=local(2, 0))
    ids = report(seller, ("q-1", 2, local(3, 7), local(3, 9)), ("q-2", 1, local(3, 9), local(3, 10)))
    assert set(UsagePending.objects.values_list("usage_record_id", flat=True)) == set(ids)
    assert UsageRecord.objects.get(pk=ids[0]).rated_at is None

    assert usage_rate_pending() == 2

    assert not UsagePending.objects.exists()
    transfer = LedgerTransfer.objects.get(kind="usage")
    for record in UsageRecord.objects.filter(pk__in=ids):
        assert record.rating_transfer == transfer and record.rated_at == transfer.posted_at
    assert set(RatedSegment.objects.values_list("buyer_id", "operator_id", "transfer_id")) == {
        (buyer.pk, seller.pk, transfer.pk)
    }
    assert ledger_reconcile().ok


def test_a_crashed_batch_leaves_its_records_pending_and_nothing_posted(
    world: tuple[Organisation, Organisation],
) -> None:
    seller, buyer = world
    pack = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000", paid_at=local(2, 0))
    report(seller, *[(f"c-{n}", 1, local(3, n), local(3, n + 1)) for n in range(5)])
    before = balances()

    def crash(record_id: int) -> None:
        raise RuntimeError("worker killed")

    rating._before_record = crash
    try:
        with pytest.raises(RuntimeError):
            usage_rate_pending()
    finally:
        rating._before_record = None

    assert UsagePending.objects.count() == 5
    assert not RatedSegment.objects.exists() and not LedgerTransfer.objects.filter(kind="usage").exists()
    assert balances() == before and LedgerAccount.objects.get(pack=pack).balance == 100 * M
    assert usage_rate_pending() == 5
    assert not UsagePending.objects.exists()


def test_a_record_queued_again_after_rating_is_refused_not_billed_twice(
    world: tuple[Organisation, Organisation],
) -> None:
    """If a pending row ever came back for a rated record, its segments' unique (record, seq) index stops
    the batch: nothing is posted twice (and the reconciliation names the row)."""
    seller, buyer = world
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000", paid_at=local(2, 0))
    (record_id,) = report(seller, ("d-1", 2, local(3, 7), local(3, 9)))
    usage_rate_pending()
    ledger_before = (balances(), LedgerEntry.objects.count(), RatedSegment.objects.count())
    record = UsageRecord.objects.get(pk=record_id)
    UsagePending.objects.create(
        usage_record=record,
        operator_id=record.operator_id,
        cluster_id=record.cluster_id,
        buyer_id=record.buyer_id,
        price_card_id=record.price_card_id,
        cards=record.cards,
        start_at=record.start_at,
        end_at=record.end_at,
    )
    assert ledger_reconcile().codes() == ["pending_record_mismatch"]

    with pytest.raises(IntegrityError):
        usage_rate_pending()

    assert (balances(), LedgerEntry.objects.count(), RatedSegment.objects.count()) == ledger_before


@pytest.mark.postgres
def test_rating_never_writes_the_usage_row(world: tuple[Organisation, Organisation]) -> None:
    """The wide usage row is written once, at ingest: rating neither updates nor locks it (no new tuple
    version, no locker in xmax)."""
    seller, buyer = world
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000", paid_at=local(2, 0))
    ids = report(seller, *[(f"x-{n}", 1, local(3, n), local(3, n + 1)) for n in range(3)])

    def versions() -> list[tuple]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, ctid::text, xmin::text, xmax::text FROM metering_usagerecord"
                " WHERE id = ANY(%s) ORDER BY id",
                [ids],
            )
            return cursor.fetchall()

    before = versions()
    assert usage_rate_pending() == 3
    assert versions() == before
    assert all(xmax == "0" for *_, xmax in before)


def _four_buyers_report(seller: Organisation, prefix: str = "shard") -> list[Organisation]:
    """Four buyers, each with a pack that runs out part-way, reporting the same 12 records: shards see
    draws, hand-overs and arrears."""
    buyers = [BuyerFactory(slug=f"{prefix}-{n}") for n in range(4)]
    for buyer in buyers:
        make_paid_pack(
            buyer=buyer,
            accelerator=A800,
            card_hours=9,
            price="90",
            paid_at=local(5, 0),
            key=f"{buyer.slug}-p",
        )
        report(
            seller,
            *[(f"{buyer.slug}-{n}", 1 + n % 3, local(3, n), local(3, n + 1)) for n in range(12)],
            buyer=buyer.slug,
        )
    return buyers


def _segments_of(buyer: Organisation) -> list[tuple]:
    """The buyer's segments with its record keys made buyer-neutral (``<n>``), in record order."""
    return [
        (key.rsplit("-", 1)[1], seq, band, draw, gross, value)
        for key, seq, band, draw, gross, value in RatedSegment.objects.filter(buyer_id=buyer.pk)
        .order_by("usage_record_id", "seq")
        .values_list("usage_record__idempotency_key", "seq", "band", "pack_draw", "gross", "buyer_value")
    ]


def test_a_shard_rates_only_its_buyers_and_the_shards_together_rate_as_one_worker(
    seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard
) -> None:
    buyers = _four_buyers_report(seller)
    odd = {b.pk for b in buyers if b.pk % 2 == 1}
    assert odd and len(odd) < 4  # both parts hold buyers

    rated = usage_rate_pending(batch_size=5, shard=rating.Shard(index=1, of=2))
    assert rated == 12 * len(odd)
    assert set(RatedSegment.objects.values_list("buyer_id", flat=True)) == odd
    assert set(UsagePending.objects.values_list("buyer_id", flat=True)) == {b.pk for b in buyers} - odd
    assert usage_rate_pending(batch_size=5, shard=rating.Shard(index=0, of=2)) == 12 * (4 - len(odd))
    assert_ledger_balanced()
    assert ledger_reconcile().ok

    # Twins reporting the same records, rated by one worker with no shard, get the same segments.
    twins = _four_buyers_report(seller, prefix="twin")
    assert usage_rate_pending(batch_size=5) == 48
    for buyer, twin in zip(buyers, twins, strict=True):
        sharded = _segments_of(buyer)
        assert sharded == _segments_of(twin)
        assert any(value for *_, value in sharded) and any(s[3] for s in sharded)  # real draws
    assert BuyerExhaustion.objects.count() == 8  # every pack ran out: hand-over to arrears seen
    assert_ledger_balanced()


def test_a_shard_must_be_one_of_its_parts() -> None:
    with pytest.raises(ValueError):
        rating.Shard(index=2, of=2)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_shards_rating_at_once_post_every_record_once_and_balance(
    seller: Organisation, a800_cluster: Cluster, gd_price_card: PriceCard
) -> None:
    buyers = _four_buyers_report(seller)
    counts: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(index: int) -> None:
        try:
            barrier.wait()
            counts.append(usage_rate_pending(batch_size=4, shard=rating.Shard(index=index, of=2)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    assert sum(counts) == 48 and len(buyers) == 4
    assert UsageRecord.objects.unrated().count() == 0
    assert RatedSegment.objects.values("usage_record_id").distinct().count() == 48
    assert_ledger_balanced()
    assert ledger_reconcile().ok
    assert BuyerExhaustion.objects.count() == 4  # every pack ran out, every buyer flagged once


def test_the_backlog_gauges_count_the_pending_queue_and_age_its_oldest_record(
    world: tuple[Organisation, Organisation],
) -> None:
    """/metrics' unrated count and oldest age come from the pending-rating queue (never a scan of the usage
    history): the records waiting, and how long ago the oldest of them was received."""
    from django.utils import timezone

    from metering.metrics import metering_gauges

    def gauges() -> dict[str, float]:
        return {metric.name: metric.samples[0].value for metric in metering_gauges() if metric.samples}

    seller, _buyer = world
    assert gauges()["cardhour_usage_unrated_records"] == 0
    assert gauges()["cardhour_usage_unrated_oldest_age_seconds"] == 0
    first = report(seller, ("g-1", 2, local(3, 7), local(3, 9)))
    UsageRecord.objects.filter(pk=first[0]).update(received_at=timezone.now() - timedelta(seconds=90))
    report(seller, ("g-2", 1, local(3, 9), local(3, 10)), ("g-3", 1, local(3, 10), local(3, 11)))

    seen = gauges()
    assert seen["cardhour_usage_unrated_records"] == 3
    assert 90 <= seen["cardhour_usage_unrated_oldest_age_seconds"] < 120

    usage_rate_pending()
    assert gauges()["cardhour_usage_unrated_records"] == 0
    assert gauges()["cardhour_usage_unrated_oldest_age_seconds"] == 0
