"""Ledger reconciliation: a clean ledger is ok; each injected breach is named, counted and logged at ERROR
on ``cardhour.ledger``."""

from __future__ import annotations

import logging
from datetime import date
from decimal import Decimal

import pytest
from django.db import connection

from metering.models import (
    LedgerAccount,
    LedgerTransfer,
    PackOrder,
    RatedSegment,
    UsagePending,
    UsageRecord,
)
from metering.services.billing import billing_close_period
from metering.services.maintenance import ledger_reconcile, packs_expire_due
from tests.metering.test_billing_close import World, sh

pytestmark = pytest.mark.django_db


@pytest.fixture
def ledger(db: None) -> World:
    """Packs bought, usage from packs and in arrears, a month closed, a pack expired."""
    world = World()
    world.march_usage()
    billing_close_period(period_start=date(2026, 3, 1), now=sh(2026, 4, 1, 0, 30))
    packs_expire_due(now=sh(2027, 3, 3))
    return world


def test_clean_ledger_is_ok(ledger: World, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cardhour.ledger"):
        report = ledger_reconcile()
    assert report.ok, report.breaches
    assert report.breaches == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_edited_account_balance_is_reported(ledger: World, caplog: pytest.LogCaptureFixture) -> None:
    account = LedgerAccount.objects.get(key=f"operator_earnings:{ledger.operator.pk}")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE metering_ledgeraccount SET balance = balance + 1 WHERE id = %s", [account.pk])

    with caplog.at_level(logging.ERROR, logger="cardhour.ledger"):
        report = ledger_reconcile()

    assert not report.ok
    assert report.codes() == ["account_balance_mismatch"]
    [breach] = report.breaches
    assert breach.count == 1
    assert breach.sample[0]["key"] == account.key
    assert breach.sample[0]["balance"] == breach.sample[0]["entries_total"] + 1
    errors = [r for r in caplog.records if r.name == "cardhour.ledger" and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "account_balance_mismatch" in errors[0].getMessage()


def test_unbalanced_entry_is_reported(ledger: World, is_postgres: bool) -> None:
    """An entry slipped into an existing transfer by hand. On PostgreSQL the deferred balance trigger
    checks each transfer inserted in the transaction when constraints are checked; firing the fixture's
    pending checks first means the tampered transfer is not checked again when the test ends."""
    transfer = LedgerTransfer.objects.filter(kind="usage").first()
    account = LedgerAccount.objects.get(key="platform_commission")
    with connection.cursor() as cursor:
        if is_postgres:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "INSERT INTO metering_ledgerentry (transfer_id, account_id, unit, amount) VALUES (%s, %s, %s, %s)",
            [transfer.pk, account.pk, "CNY", 5],
        )
    report = ledger_reconcile()
    assert {
        "unit_not_zero",
        "transfer_unbalanced",
        "account_balance_mismatch",
        "usage_transfer_mismatch",
    } <= set(report.codes())


def test_segment_that_disagrees_with_its_transfer_is_reported(ledger: World) -> None:
    segment = RatedSegment.objects.filter(pack__isnull=False).first()
    RatedSegment.objects.filter(pk=segment.pk).update(
        pack_draw=segment.pack_draw + 7, gross=segment.gross + 1
    )
    report = ledger_reconcile()
    assert set(report.codes()) == {"usage_transfer_mismatch", "pack_balance_mismatch"}
    mismatch = next(b for b in report.breaches if b.code == "usage_transfer_mismatch")
    assert mismatch.sample[0]["transfer_id"] == segment.transfer_id


def test_segment_card_seconds_must_add_up(ledger: World) -> None:
    segment = RatedSegment.objects.first()
    RatedSegment.objects.filter(pk=segment.pk).update(card_seconds=segment.card_seconds + 1)
    report = ledger_reconcile()
    assert report.codes() == ["record_card_seconds_mismatch"]
    assert report.breaches[0].sample[0]["id"] == segment.usage_record_id


def test_paid_order_without_pack_or_credit_is_reported(ledger: World) -> None:
    PackOrder.objects.create(
        buyer=ledger.beta,
        product=ledger.pack.order.product,
        card_hours=100,
        amount=Decimal("1000.00"),
        validity_days=365,
        idempotency_key="ghost",
        status=PackOrder.Status.PAID,
        paid_at=sh(2026, 3, 5),
    )
    report = ledger_reconcile()
    assert report.codes() == ["paid_order_without_pack", "paid_order_without_purchase"]


def test_negative_pack_is_reported(ledger: World, is_postgres: bool) -> None:
    if is_postgres:
        pytest.skip("PostgreSQL's check constraint refuses a negative pack balance outright")
    account = LedgerAccount.objects.filter(kind="pack").first()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA ignore_check_constraints = ON")
        cursor.execute("UPDATE metering_ledgeraccount SET balance = -1 WHERE id = %s", [account.pk])
        cursor.execute("PRAGMA ignore_check_constraints = OFF")
    report = ledger_reconcile()
    assert "account_negative" in report.codes()
    assert "account_balance_mismatch" in report.codes()


def test_segment_whose_record_is_gone_is_reported(ledger: World) -> None:
    """Segments keep no database foreign key to their record, pack or transfer (rating writes millions):
    the reconciliation checks what those keys guarded."""
    segment = RatedSegment.objects.filter(pack__isnull=False).first()
    RatedSegment.objects.filter(pk=segment.pk).update(usage_record_id=10**9)
    report = ledger_reconcile()
    assert "segment_dangling_reference" in report.codes()
    dangling = next(b for b in report.breaches if b.code == "segment_dangling_reference")
    assert dangling.count == 1 and dangling.sample[0]["id"] == segment.pk


def test_segment_on_a_missing_transfer_or_pack_or_another_buyers_pack_is_reported(ledger: World) -> None:
    first, second, third = RatedSegment.objects.filter(pack__isnull=False).order_by("id")[:3]
    RatedSegment.objects.filter(pk=first.pk).update(transfer_id=10**9)
    RatedSegment.objects.filter(pk=second.pk).update(pack_id=10**9)
    # The segment claims another buyer (one that holds no pack at all): its pack is not that buyer's.
    RatedSegment.objects.filter(pk=third.pk).update(buyer_id=ledger.beta.pk)
    report = ledger_reconcile()
    dangling = next(b for b in report.breaches if b.code == "segment_dangling_reference")
    assert {row["id"] for row in dangling.sample} == {first.pk, second.pk, third.pk}


def test_segment_with_another_buyer_than_its_record_is_reported(ledger: World) -> None:
    segment = RatedSegment.objects.first()
    RatedSegment.objects.filter(pk=segment.pk).update(buyer_id=ledger.operator.pk)
    report = ledger_reconcile()
    assert "segment_dangling_reference" in report.codes()


def test_pending_row_that_differs_from_its_record_or_was_rated_is_reported(ledger: World) -> None:
    rated = UsageRecord.objects.rated().order_by("id")[:2]
    for record in rated:
        UsagePending.objects.create(
            usage_record=record,
            operator_id=record.operator_id,
            cluster_id=record.cluster_id,
            buyer_id=record.buyer_id,
            price_card_id=record.price_card_id,
            cards=record.cards + (1 if record == rated[1] else 0),
            start_at=record.start_at,
            end_at=record.end_at,
        )
    report = ledger_reconcile()
    pending = next(b for b in report.breaches if b.code == "pending_record_mismatch")
    assert [row["usage_record_id"] for row in pending.sample] == [r.pk for r in rated]


def test_record_rated_without_segments_is_reported(ledger: World) -> None:
    record = UsageRecord.objects.rated().first()
    RatedSegment.objects.filter(usage_record=record).update(usage_record_id=10**9)
    report = ledger_reconcile()
    assert {"rated_record_without_segments", "segment_dangling_reference"} <= set(report.codes())
    missing = next(b for b in report.breaches if b.code == "rated_record_without_segments")
    assert missing.sample[0]["id"] == record.pk
