"""The billing half of the demo: prices every demo cluster, fills the catalogue, gives the demo buyer packs
and rated usage, and a second run changes nothing."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from federation.models import Cluster
from metering.models import (
    ArrearsSettlement,
    BillingCloseRun,
    Invoice,
    LedgerEntry,
    Pack,
    PackProduct,
    PriceCard,
    RatedSegment,
    Settlement,
    UsageRecord,
)
from metering.services.billing import billing_previous_period_start
from metering.services.maintenance import ledger_reconcile


@pytest.mark.django_db
def test_seed_billing_demo_is_complete_and_idempotent(tmp_path: Path) -> None:
    call_command("seed_demo", tokens_file=tmp_path / "tokens.json", stdout=StringIO())
    call_command("seed_billing_demo", stdout=StringIO())

    assert PriceCard.objects.count() == Cluster.objects.count() > 0
    assert PackProduct.objects.filter(accelerator__isnull=True).exists()
    assert Pack.objects.filter(buyer__slug="demo-buyer").count() == 3
    assert UsageRecord.objects.filter(rated_at__isnull=True).count() == 0
    assert (
        RatedSegment.objects.filter(band="peak").exists()
        and RatedSegment.objects.filter(band="valley").exists()
    )
    report = ledger_reconcile()
    assert report.ok, report

    # One closed month to open: last month's invoice with the arrears and the pack that settled them,
    # and the operator's settlement.
    last_month = billing_previous_period_start()
    run = BillingCloseRun.objects.get(period_start=last_month)
    assert run.finished_at is not None and run.settlements_issued >= 1
    invoice = Invoice.objects.get(buyer__slug="demo-buyer", period_start=last_month)
    kinds = list(invoice.lines.order_by("seq").values_list("kind", flat=True))
    assert "arrears" in kinds and "arrears_paid" in kinds and "pack_purchase" in kinds
    assert invoice.arrears_amount > 0 and invoice.arrears_settled == -invoice.arrears_amount
    assert invoice.amount_due == 0 and invoice.frozen_at is not None
    assert invoice.parties["buyer"]["unified_social_credit_code"] == "91350100M000100Y43"
    settled = ArrearsSettlement.objects.get(buyer__slug="demo-buyer")
    assert settled.invoice == invoice and settled.factor is not None
    assert Settlement.objects.filter(period_start=last_month).exists()

    models = (PriceCard, Pack, UsageRecord, RatedSegment, LedgerEntry, Invoice, Settlement, ArrearsSettlement)
    counts = [m.objects.count() for m in models]
    call_command("seed_billing_demo", stdout=StringIO())
    assert [m.objects.count() for m in models] == counts
