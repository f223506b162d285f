"""Portal pages for a buyer's invoices: list, detail with its lines, CSV and PDF; nobody else's."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from core.models import Organisation
from federation.models import Cluster
from metering import rendering
from metering.models import Invoice, InvoiceLine

pytestmark = pytest.mark.django_db

SHANGHAI = ZoneInfo("Asia/Shanghai")


def make_invoice(
    buyer: Organisation, *, period: date, cluster: Cluster | None = None, due: str = "0.00"
) -> Invoice:
    """An issued invoice as the month-end close writes it: a pack bought, usage by cluster and band."""
    following = date(period.year + period.month // 12, period.month % 12 + 1, 1)
    invoice = Invoice.objects.create(
        buyer=buyer,
        period_start=period,
        period_end=following,
        number=f"INV-{period:%Y%m}-{buyer.slug}",
        packs_amount=Decimal("9000.00"),
        total_paid=Decimal("9000.00"),
        usage_value=Decimal("153.00"),
        arrears_amount=Decimal(due),
        amount_due=Decimal(due),
        issued_at=datetime(following.year, following.month, 1, 0, 30, tzinfo=SHANGHAI),
    )
    InvoiceLine.objects.create(
        invoice=invoice,
        seq=1,
        kind=InvoiceLine.Kind.PACK_PURCHASE,
        description="Pack: A800 × 1000, 1000 card-hours of nvidia-a800-sxm4-80gb, paid 2026-03-02",
        amount=Decimal("9000.00"),
    )
    if cluster is not None:
        InvoiceLine.objects.create(
            invoice=invoice,
            seq=2,
            kind=InvoiceLine.Kind.USAGE,
            description="Card-hours used from nvidia-a800-sxm4-80gb packs",
            cluster=cluster,
            band="valley",
            card_seconds=36000,
            card_hours_drawn=Decimal("10.000000"),
            amount=Decimal("63.00"),
        )
        InvoiceLine.objects.create(
            invoice=invoice,
            seq=3,
            kind=InvoiceLine.Kind.USAGE,
            description="Card-hours used from nvidia-a800-sxm4-80gb packs",
            cluster=cluster,
            band="peak",
            card_seconds=5400,
            card_hours_drawn=Decimal("1.500000"),
            amount=Decimal("90.00"),
        )
        if due != "0.00":
            InvoiceLine.objects.create(
                invoice=invoice,
                seq=4,
                kind=InvoiceLine.Kind.ARREARS,
                description="Card-hours used with no pack (owed)",
                cluster=cluster,
                band="flat",
                card_seconds=7200,
                amount=Decimal(due),
            )
    return invoice


@pytest.fixture
def march(buyer: Organisation, east_cluster: Cluster) -> Invoice:
    return make_invoice(buyer, period=date(2026, 3, 1), cluster=east_cluster, due="24.00")


def test_invoice_list_shows_period_state_and_totals(
    buyer: Organisation, buyer_client: Client, march: Invoice, east_cluster: Cluster
) -> None:
    make_invoice(buyer, period=date(2025, 12, 1))

    response = buyer_client.get(reverse("invoice-list"))

    assert response.status_code == 200
    page = response.content.decode()
    assert [i.number for i in response.context["page"]] == ["INV-202603-acme", "INV-202512-acme"]
    assert '<td class="num"><strong>¥24.00</strong></td>' in page
    assert '<span class="badge warn">Amount due</span>' in page
    assert '<span class="badge good">Nothing due</span>' in page
    assert "¥9,000.00" in page and "¥153.00" in page
    assert reverse("invoice-csv", args=[march.pk]) in page and reverse("invoice-pdf", args=[march.pk]) in page

    filtered = buyer_client.get(reverse("invoice-list"), {"year": "2025"})
    assert [i.number for i in filtered.context["page"]] == ["INV-202512-acme"]
    assert '<option value="2026">2026</option>' in filtered.content.decode()


def test_invoice_list_is_the_buyers_own_paginated_with_a_fixed_query_count(
    buyer: Organisation, other_buyer: Organisation, buyer_client: Client
) -> None:
    make_invoice(other_buyer, period=date(2026, 3, 1))
    for n in range(60):
        make_invoice(buyer, period=date(2021 + n // 12, n % 12 + 1, 1))

    with CaptureQueriesContext(connection) as first_page:
        response = buyer_client.get(reverse("invoice-list"))
    assert len(response.context["page"].object_list) == 50
    assert "globex" not in response.content.decode()
    second = buyer_client.get(reverse("invoice-list"), {"page": 2})
    assert len(second.context["page"].object_list) == 10
    assert len(first_page) <= 10
    with CaptureQueriesContext(connection) as few:
        buyer_client.get(reverse("invoice-list"), {"year": "2021"})
    assert len(few) == len(first_page)


def test_invoice_detail_shows_lines_by_cluster_and_band_and_the_totals(
    buyer_client: Client, march: Invoice, east_cluster: Cluster
) -> None:
    response = buyer_client.get(reverse("invoice-detail", args=[march.pk]))

    assert response.status_code == 200
    page = response.content.decode()
    sections = response.context["line_sections"]
    assert [(s.kind, len(s.lines), s.total) for s in sections] == [
        ("pack_purchase", 1, Decimal("9000.00")),
        ("usage", 2, Decimal("153.00")),
        ("arrears", 1, Decimal("24.00")),
    ]
    usage = sections[1].lines
    assert [(line.cluster.cpi, line.band, line.card_hours) for line in usage] == [
        (east_cluster.cpi, "valley", Decimal(10)),
        (east_cluster.cpi, "peak", Decimal("1.5")),
    ]
    assert "Invoice INV-202603-acme" in page
    assert "2026-03-01 – 2026-04-01" in page
    assert "Card-hours used from packs" in page and "Card-hours used with no pack (owed)" in page
    assert '<td class="num">10.00</td>' in page and '<td class="num">1.50</td>' in page
    assert '<tr class="grand"><th scope="row">Amount due</th><td class="num">¥24.00</td></tr>' in page


def test_csv_and_pdf_are_the_rendered_statement(buyer_client: Client, march: Invoice) -> None:
    csv_response = buyer_client.get(reverse("invoice-csv", args=[march.pk]))
    assert csv_response.status_code == 200
    assert csv_response["Content-Type"] == "text/csv; charset=utf-8"
    assert csv_response["Content-Disposition"] == 'attachment; filename="INV-202603-acme.csv"'
    assert csv_response.content == rendering.invoice_csv(invoice=Invoice.objects.get(pk=march.pk))
    assert csv_response.content.startswith(b"\xef\xbb\xbfinvoice,seq,kind")

    pdf_response = buyer_client.get(reverse("invoice-pdf", args=[march.pk]))
    assert pdf_response.status_code == 200
    assert pdf_response["Content-Type"] == "application/pdf"
    assert pdf_response["Content-Disposition"] == 'attachment; filename="INV-202603-acme.pdf"'
    assert pdf_response.content.startswith(b"%PDF-")


@pytest.mark.parametrize(
    "name", ["invoice-detail", "invoice-csv", "invoice-pdf", "invoice-fapiao-csv", "invoice-fapiao-json"]
)
def test_another_buyers_invoice_is_404(other_buyer: Organisation, buyer_client: Client, name: str) -> None:
    theirs = make_invoice(other_buyer, period=date(2026, 3, 1))
    assert buyer_client.get(reverse(name, args=[theirs.pk])).status_code == 404
    assert buyer_client.get(reverse(name, args=[999999])).status_code == 404


@pytest.mark.parametrize(
    "name",
    [
        "invoice-list",
        "invoice-detail",
        "invoice-csv",
        "invoice-pdf",
        "invoice-fapiao-csv",
        "invoice-fapiao-json",
    ],
)
def test_anonymous_is_sent_to_log_in_and_an_operator_is_refused(
    client: Client, operator_client: Client, march: Invoice, name: str
) -> None:
    url = reverse(name) if name == "invoice-list" else reverse(name, args=[march.pk])
    anonymous = client.get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    assert operator_client.get(url).status_code == 403


def test_no_invoices_yet(buyer_client: Client) -> None:
    response = buyer_client.get(reverse("invoice-list"))
    assert response.status_code == 200
    assert "No invoices yet" in response.content.decode()
