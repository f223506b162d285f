"""The billing half of the demo: prices every demo cluster on its hub's default preset, fills the catalogue,
gives the demo buyer packs and rated usage, and a second run changes nothing (tests/core/test_demo_seeds.py
has the rule that seeds touch only their own objects)."""

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
from metering.tariffs import PRESETS, preset_default_code


@pytest.mark.django_db
def test_seed_billing_demo_is_complete_and_idempotent(tmp_path: Path) -> None:
    call_command("seed_demo", tokens_file=tmp_path / "tokens.json", stdout=StringIO())
    call_command("seed_billing_demo", stdout=StringIO())

    assert PriceCard.objects.count() == Cluster.objects.count() > 0
    # On the preset each hub offers by default (flat where no official preset is confirmed, and for the
    # chips without figures): never an unconfirmed preset presented as official.
    for card in PriceCard.objects.select_related(
        "cluster__hub", "cluster__accelerator", "tariff_version__tariff"
    ):
        tariff = card.tariff_version.tariff
        unknown_chip = card.cluster.accelerator.dense_fp16_tflops is None
        assert tariff.owner_id is None
        assert tariff.code == ("flat" if unknown_chip else preset_default_code(hub=card.cluster.hub.code))
        assert tariff.code == "flat" or PRESETS[tariff.code].selectable_by_default
    assert PriceCard.objects.filter(tariff_version__tariff__code="cn-gd").exists()
    assert PackProduct.objects.filter(accelerator__isnull=True).exists()
    assert Pack.objects.filter(buyer__slug="demo-buyer").count() == 3
    assert UsageRecord.objects.unrated().count() == 0
    assert (
        RatedSegment.objects.filter(band="peak").exists()
        and RatedSegment.objects.filter(band="valley").exists()
    )
    report = ledger_reconcile()
    assert report.ok, report

    # One closed month to open: last month's invoice with the arrears and the pack that settled them,
    # and the operator's settlement — the demo's only: the month's close for everyone is beat's.
    last_month = billing_previous_period_start()
    assert not BillingCloseRun.objects.exists()
    invoice = Invoice.objects.get(buyer__slug="demo-buyer", period_start=last_month)
    kinds = list(invoice.lines.order_by("seq").values_list("kind", flat=True))
    assert "arrears" in kinds and "arrears_paid" in kinds and "pack_purchase" in kinds
    assert invoice.arrears_amount > 0 and invoice.arrears_settled == -invoice.arrears_amount
    assert invoice.amount_due == 0 and invoice.frozen_at is not None
    assert invoice.parties["buyer"]["unified_social_credit_code"] == "91350100M000100Y43"
    settled = ArrearsSettlement.objects.get(buyer__slug="demo-buyer")
    assert settled.invoice == invoice and settled.factor is not None
    assert Settlement.objects.filter(period_start=last_month).count() == 1

    models = (PriceCard, Pack, UsageRecord, RatedSegment, LedgerEntry, Invoice, Settlement, ArrearsSettlement)
    counts = [m.objects.count() for m in models]
    call_command("seed_billing_demo", stdout=StringIO())
    assert [m.objects.count() for m in models] == counts
