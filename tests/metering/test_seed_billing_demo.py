"""The billing half of the demo: prices every demo cluster, fills the catalogue, gives the demo buyer packs
and rated usage, and a second run changes nothing."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from federation.models import Cluster
from metering.models import LedgerEntry, Pack, PackProduct, PriceCard, RatedSegment, UsageRecord
from metering.services.maintenance import ledger_reconcile


@pytest.mark.django_db
def test_seed_billing_demo_is_complete_and_idempotent(tmp_path: Path) -> None:
    call_command("seed_demo", tokens_file=tmp_path / "tokens.json", stdout=StringIO())
    call_command("seed_billing_demo", stdout=StringIO())

    assert PriceCard.objects.count() == Cluster.objects.count() > 0
    assert PackProduct.objects.filter(accelerator__isnull=True).exists()
    assert Pack.objects.filter(buyer__slug="demo-buyer").count() == 2
    assert UsageRecord.objects.filter(rated_at__isnull=True).count() == 0
    assert (
        RatedSegment.objects.filter(band="peak").exists()
        and RatedSegment.objects.filter(band="valley").exists()
    )
    report = ledger_reconcile()
    assert report.ok, report

    counts = [m.objects.count() for m in (PriceCard, Pack, UsageRecord, RatedSegment, LedgerEntry)]
    call_command("seed_billing_demo", stdout=StringIO())
    assert [m.objects.count() for m in (PriceCard, Pack, UsageRecord, RatedSegment, LedgerEntry)] == counts
