"""Statements over REST: each organisation sees only its own; downloads as CSV and PDF."""

from __future__ import annotations

from datetime import date

import pytest
from rest_framework.test import APIClient

from metering.models import BillingProfile, Invoice, Settlement
from metering.services.billing import billing_close_period
from tests.factories import OperatorFactory
from tests.metering.test_billing_close import World, sh

pytestmark = pytest.mark.django_db


@pytest.fixture
def closed(db: None) -> World:
    world = World()
    BillingProfile.objects.create(
        organisation=world.acme,
        legal_name="艾克米人工智能有限公司",
        tax_id="91310000X",
        address="上海市浦东新区",
    )
    world.march_usage()
    billing_close_period(period_start=date(2026, 3, 1), now=sh(2026, 4, 1, 0, 30))
    return world


def invoice_of(slug: str) -> Invoice:
    return Invoice.objects.get(buyer__slug=slug)


def test_buyer_lists_and_reads_only_its_invoices(closed: World, token_client) -> None:
    client = token_client(closed.acme)
    listed = client.get("/api/v1/invoices")
    assert listed.status_code == 200
    assert [row["number"] for row in listed.json()["results"]] == ["INV-202603-acme"]
    assert client.get("/api/v1/invoices", {"period_start": "2026-04-01"}).json()["count"] == 0

    own = invoice_of("acme")
    detail = client.get(f"/api/v1/invoices/{own.pk}")
    assert detail.status_code == 200
    body = detail.json()
    assert body["usage_value"] == str(own.usage_value)
    assert [line["kind"] for line in body["lines"]] == ["pack_purchase", "usage", "usage", "usage"]
    assert body["lines"][1]["cluster"] == "cpi:cucc:nx:zw-ai01"


@pytest.mark.parametrize("suffix", ["", ".csv", ".pdf"])
def test_another_buyers_invoice_is_404(closed: World, token_client, suffix: str) -> None:
    other = invoice_of("beta")
    response = token_client(closed.acme).get(f"/api/v1/invoices/{other.pk}{suffix}")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["code"] == "invoice_not_found"


@pytest.mark.parametrize(
    "url", ["/api/v1/invoices", "/api/v1/invoices/1", "/api/v1/invoices/1.pdf", "/api/v1/settlements/1.csv"]
)
def test_anonymous_is_401(closed: World, url: str) -> None:
    response = APIClient().get(url)
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_operator_cannot_see_invoices_and_buyer_cannot_see_settlements(closed: World, token_client) -> None:
    operator = token_client(closed.operator)
    for url in ("/api/v1/invoices", f"/api/v1/invoices/{invoice_of('acme').pk}"):
        response = operator.get(url)
        assert response.status_code == 403
        assert response.json()["code"] == "not_a_buyer"
    settlement = Settlement.objects.get()
    response = token_client(closed.acme).get(f"/api/v1/settlements/{settlement.pk}")
    assert response.status_code == 403
    assert response.json()["code"] == "not_an_operator"


def test_operator_sees_only_its_settlements(closed: World, token_client) -> None:
    settlement = Settlement.objects.get()
    own = token_client(closed.operator)
    assert [row["number"] for row in own.get("/api/v1/settlements").json()["results"]] == ["STL-202603-cucc"]
    body = own.get(f"/api/v1/settlements/{settlement.pk}").json()
    assert body["payable"] == str(settlement.payable)
    assert {line["band"] for line in body["lines"]} == {"valley", "flat", "peak"}

    other = token_client(OperatorFactory(slug="cmcc", name="China Mobile"))
    assert other.get("/api/v1/settlements").json()["count"] == 0
    for suffix in ("", ".csv", ".pdf"):
        response = other.get(f"/api/v1/settlements/{settlement.pk}{suffix}")
        assert response.status_code == 404
        assert response.json()["code"] == "settlement_not_found"


def test_downloads(closed: World, token_client) -> None:
    invoice = invoice_of("acme")
    client = token_client(closed.acme)
    # The Accept header does not matter: a download has one representation.
    csv_response = client.get(f"/api/v1/invoices/{invoice.pk}.csv", HTTP_ACCEPT="application/json")
    assert csv_response.status_code == 200
    assert csv_response["Content-Type"] == "text/csv; charset=utf-8"
    assert csv_response["Content-Disposition"] == 'attachment; filename="INV-202603-acme.csv"'
    assert csv_response.content.startswith(b"\xef\xbb\xbfinvoice,seq,kind")

    pdf_response = client.get(f"/api/v1/invoices/{invoice.pk}.pdf")
    assert pdf_response.status_code == 200
    assert pdf_response["Content-Type"] == "application/pdf"
    assert pdf_response["Content-Disposition"] == 'attachment; filename="INV-202603-acme.pdf"'
    assert pdf_response.content.startswith(b"%PDF-") and b"INV-202603-acme" in pdf_response.content

    settlement = Settlement.objects.get()
    operator = token_client(closed.operator)
    s_csv = operator.get(f"/api/v1/settlements/{settlement.pk}.csv")
    assert s_csv.status_code == 200 and s_csv["Content-Type"] == "text/csv; charset=utf-8"
    s_pdf = operator.get(f"/api/v1/settlements/{settlement.pk}.pdf")
    assert s_pdf.status_code == 200 and s_pdf.content.startswith(b"%PDF-")
