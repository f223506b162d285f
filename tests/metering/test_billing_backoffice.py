"""Back office: closing a month from the admin (the beat task's service: refuses an open month, idempotent)
and previewing a buyer's invoice of the current month without writing anything."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from metering.models import (
    ArrearsSettlement,
    BillingCloseRun,
    Invoice,
    InvoiceLine,
    LedgerEntry,
    LedgerTransfer,
    RatedSegment,
    Settlement,
    StatementDocument,
)
from metering.services.billing import billing_close_period, billing_zone, invoice_preview
from tests.metering.factories import make_paid_pack
from tests.metering.test_billing_close import A800, CLOSE_MARCH_AT, MARCH, World, sh

pytestmark = pytest.mark.django_db

CLOSE_URL = "admin:metering_billingcloserun_close"
PREVIEW_URL = "admin:metering_invoice_preview"


@pytest.fixture
def world(db: None) -> World:
    world = World()
    world.march_usage()
    # Beta's arrears are paid by a pack bought on 31 March.
    make_paid_pack(
        buyer=world.beta, accelerator=A800, card_hours=10, price="100.00", paid_at=sh(2026, 3, 31, 13)
    )
    return world


def table_counts() -> dict[str, int]:
    return {
        "invoices": Invoice.objects.count(),
        "invoice_lines": InvoiceLine.objects.count(),
        "settlements": Settlement.objects.count(),
        "documents": StatementDocument.objects.count(),
        "close_runs": BillingCloseRun.objects.count(),
        "transfers": LedgerTransfer.objects.count(),
        "entries": LedgerEntry.objects.count(),
        "arrears_settlements": ArrearsSettlement.objects.count(),
        "segments_invoiced": RatedSegment.objects.filter(invoice__isnull=False).count(),
        "arrears_settlements_invoiced": ArrearsSettlement.objects.filter(invoice__isnull=False).count(),
    }


def _writes(queries: CaptureQueriesContext) -> list[str]:
    """Every statement that writes or locks: none may run for a preview."""
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) or "FOR UPDATE" in q["sql"]
    ]


# --- Preview ----------------------------------------------------------------------------------------


def test_the_preview_writes_nothing_and_is_what_issuing_then_produces(world: World) -> None:
    before = table_counts()
    with CaptureQueriesContext(connection) as queries:
        previews = {
            buyer.slug: invoice_preview(buyer=buyer, now=sh(2026, 3, 31, 14))
            for buyer in (world.acme, world.beta)
        }
    assert _writes(queries) == []
    assert table_counts() == before

    beta = previews["beta"]
    assert beta.invoice.pk is None and beta.invoice.number == "INV-202603-beta"
    assert [(line.kind, line.amount, line.net_amount, line.tax_amount) for line in beta.lines] == [
        ("pack_purchase", Decimal("100.00"), Decimal("94.34"), Decimal("5.66")),
        ("arrears", Decimal("15.56"), Decimal("14.68"), Decimal("0.88")),
        ("arrears_paid", Decimal("-15.56"), Decimal("-14.68"), Decimal("-0.88")),
    ]
    assert (beta.invoice.arrears_amount, beta.invoice.arrears_settled, beta.invoice.amount_due) == (
        Decimal("15.56"),
        Decimal("-15.56"),
        Decimal("0.00"),
    )

    billing_close_period(period_start=MARCH, now=CLOSE_MARCH_AT)
    for slug, preview in previews.items():
        issued = Invoice.objects.get(buyer__slug=slug, period_start=MARCH)
        fields = ("seq", "kind", "description", "amount", "vat_rate", "net_amount", "tax_amount")
        assert [tuple(getattr(line, f) for f in fields) for line in issued.lines.order_by("seq")] == [
            tuple(getattr(line, f) for f in fields) for line in preview.lines
        ]
        totals = (
            "packs_amount",
            "usage_value",
            "arrears_amount",
            "arrears_settled",
            "amount_due",
            "tax_amount",
        )
        assert [getattr(issued, f) for f in totals] == [getattr(preview.invoice, f) for f in totals]


def test_the_admin_preview_page_shows_the_invoice_and_writes_nothing(
    world: World, admin_client: Client
) -> None:
    # A pack bought now is on this month's invoice whatever today is.
    make_paid_pack(buyer=world.acme, accelerator=A800, card_hours=10, price="77.00", paid_at=timezone.now())
    before = table_counts()

    response = admin_client.get(reverse(PREVIEW_URL), {"buyer": "acme"})

    assert response.status_code == 200
    page = response.content.decode()
    month = timezone.now().astimezone(billing_zone())
    assert f"Preview — not issued.</strong> INV-{month:%Y%m}-acme for acme" in page
    assert "77.00" in page and "72.64" in page and "4.36" in page  # 77.00 = 72.64 net + 4.36 VAT
    assert table_counts() == before
    assert admin_client.get(reverse(PREVIEW_URL), {"buyer": "nobody"}).status_code == 200  # form error
    assert (
        admin_client.get(reverse("admin:metering_invoice_changelist"))
        .content.decode()
        .count(reverse(PREVIEW_URL))
        == 1
    )


# --- Close a month ----------------------------------------------------------------------------------


def test_the_admin_refuses_to_close_a_month_that_has_not_ended(world: World, admin_client: Client) -> None:
    current = timezone.now().astimezone(billing_zone())
    response = admin_client.post(reverse(CLOSE_URL), {"month": f"{current:%Y-%m}"})

    assert response.status_code == 200
    errors = response.context["form"].errors["month"]
    assert len(errors) == 1 and errors[0].startswith(f"The period {current:%Y-%m} ends at ")
    assert errors[0].endswith("it cannot be closed before.")
    assert BillingCloseRun.objects.count() == 0 and Invoice.objects.count() == 0

    bad = admin_client.post(reverse(CLOSE_URL), {"month": "2026-13"})
    assert bad.context["form"].errors["month"] == ["Write the month as YYYY-MM, e.g. 2026-10."]


def test_the_admin_closes_an_ended_month_once(world: World, admin_client: Client) -> None:
    response = admin_client.post(reverse(CLOSE_URL), {"month": "2026-03"})

    assert response.status_code == 302
    assert response["Location"] == reverse("admin:metering_billingcloserun_changelist")
    run = BillingCloseRun.objects.get()
    assert (run.period_start, run.invoices_issued, run.settlements_issued) == (MARCH, 2, 1)
    assert run.finished_at is not None
    issued = sorted(Invoice.objects.values_list("pk", "number"))
    documents = sorted(StatementDocument.objects.values_list("pk", "sha256"))

    again = admin_client.post(reverse(CLOSE_URL), {"month": "2026-03"}, follow=True)
    assert "2026-03 is closed: 2 invoice(s) and 1 settlement(s)" in again.content.decode()
    assert BillingCloseRun.objects.count() == 1
    assert sorted(Invoice.objects.values_list("pk", "number")) == issued
    assert sorted(StatementDocument.objects.values_list("pk", "sha256")) == documents


def test_closing_needs_the_permission(world: World, client: Client) -> None:
    from django.contrib.auth.models import Permission

    from tests.factories import UserFactory

    staff = UserFactory(username="viewer", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_billingcloserun"))
    client.force_login(staff)
    assert client.post(reverse(CLOSE_URL), {"month": "2026-03"}).status_code == 403
    assert BillingCloseRun.objects.count() == 0
