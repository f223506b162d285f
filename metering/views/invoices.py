"""Portal pages for a buyer's invoices: the list, one invoice with its lines, its CSV and PDF.

The files are metering.rendering's, byte for byte what the API's downloads serve. Another buyer's invoice
is looked up inside the caller's organisation and answers 404 like a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, path
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET

from core.portal import portal_view
from metering import fapiao, rendering
from metering.forms.invoices import InvoiceFilterForm
from metering.models import Invoice, InvoiceLine
from metering.selectors import billing as selectors
from metering.services import statements

PAGE_SIZE = 50
SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True)
class LineSection:
    """The invoice's lines of one kind, in their order on the invoice."""

    kind: str
    title: str
    lines: list[InvoiceLine]
    total: Decimal
    net: Decimal | None
    tax: Decimal | None


# The order and the titles of an invoice's sections.
_SECTIONS = (
    (InvoiceLine.Kind.PACK_PURCHASE, _("Packs bought")),
    (InvoiceLine.Kind.USAGE, _("Card-hours used from packs")),
    (InvoiceLine.Kind.ARREARS, _("Card-hours used with no pack (owed)")),
    (InvoiceLine.Kind.PRIOR_PERIOD, _("Late usage from earlier periods")),
    (InvoiceLine.Kind.ARREARS_PAID, _("Arrears paid from new packs")),
    (InvoiceLine.Kind.REFUND, _("Refunds (credit)")),
    (InvoiceLine.Kind.SLA_CREDIT, _("SLA credits")),
    (InvoiceLine.Kind.SLA_REVERSAL, _("SLA credits reversed after a dispute")),
)


@require_GET
@portal_view("buyer")
def invoice_list(request: HttpRequest) -> HttpResponse:
    """The buyer's invoices, newest period first, 50 a page, filterable by year."""
    invoices = selectors.invoice_list_for(buyer=request.portal.organisation).prefetch_related(None)  # type: ignore[attr-defined]
    years = [day.year for day in invoices.dates("period_start", "year", order="DESC")]
    form = InvoiceFilterForm(request.GET or None, years=years)
    if form.is_valid() and form.cleaned_data.get("year"):
        invoices = invoices.filter(period_start__year=form.cleaned_data["year"])
    page = Paginator(invoices, PAGE_SIZE).get_page(request.GET.get("page"))
    filtered = any(key != "page" for key in request.GET)
    return render(request, "metering/invoices/list.html", {"page": page, "form": form, "filtered": filtered})


def _sections(invoice: Invoice) -> list[LineSection]:
    lines = list(invoice.lines.all())  # prefetched with their clusters by the selector
    for line in lines:
        line.card_hours = Decimal(line.card_seconds) / SECONDS_PER_HOUR  # type: ignore[attr-defined]
        line.vat_percent = rendering.vat_percent(line.vat_rate)  # type: ignore[attr-defined]
    sections = []
    for kind, title in _SECTIONS:
        of_kind = [line for line in lines if line.kind == kind]
        if of_kind:
            total = sum((line.amount for line in of_kind), Decimal("0.00"))
            with_vat = all(line.net_amount is not None for line in of_kind)
            net = (
                sum((line.net_amount or Decimal(0) for line in of_kind), Decimal("0.00"))
                if with_vat
                else None
            )
            tax = (
                sum((line.tax_amount or Decimal(0) for line in of_kind), Decimal("0.00"))
                if with_vat
                else None
            )
            sections.append(
                LineSection(kind=str(kind), title=str(title), lines=of_kind, total=total, net=net, tax=tax)
            )
    return sections


@require_GET
@portal_view("buyer")
def invoice_detail(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """One invoice: its totals, then its lines by kind (usage by cluster and band)."""
    invoice = selectors.invoice_get_for(buyer=request.portal.organisation, invoice_id=invoice_id)  # type: ignore[attr-defined]
    # The buyer as frozen on the invoice at issue (an invoice issued before freezing: as it is today).
    frozen = (invoice.parties or {}).get("buyer") or {}
    billed_to = {
        "name": frozen.get("legal_name") or frozen.get("name") or invoice.buyer.name,
        "tax_id": frozen.get("tax_id", ""),
        "unified_social_credit_code": frozen.get("unified_social_credit_code", ""),
        "invoice_title": frozen.get("invoice_title", ""),
    }
    context: dict[str, Any] = {
        "invoice": invoice,
        "line_sections": _sections(invoice),
        "billed_to": billed_to,
    }
    return render(request, "metering/invoices/detail.html", context)


def _attachment(content: bytes, *, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@require_GET
@portal_view("buyer")
def invoice_csv(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = selectors.invoice_get_for(buyer=request.portal.organisation, invoice_id=invoice_id)  # type: ignore[attr-defined]
    return _attachment(
        rendering.invoice_csv(invoice=invoice),
        content_type="text/csv; charset=utf-8",
        filename=f"{invoice.number}.csv",
    )


@require_GET
@portal_view("buyer")
def invoice_pdf(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = selectors.invoice_get_for(buyer=request.portal.organisation, invoice_id=invoice_id)  # type: ignore[attr-defined]
    document = statements.invoice_document(invoice=invoice)
    response = _attachment(document.content, content_type=document.media_type, filename=document.filename)
    response["ETag"] = f'"{document.sha256}"'
    return response


@require_GET
@portal_view("buyer")
def invoice_fapiao_csv(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """The invoice's fapiao data (metering.fapiao) as CSV: for an issuing system, not a fapiao."""
    invoice = selectors.invoice_get_for(buyer=request.portal.organisation, invoice_id=invoice_id)  # type: ignore[attr-defined]
    invoice = statements.invoice_frozen(invoice=invoice)
    return _attachment(
        fapiao.fapiao_csv(invoices=[invoice]),
        content_type="text/csv; charset=utf-8",
        filename=f"{invoice.number}-fapiao.csv",
    )


@require_GET
@portal_view("buyer")
def invoice_fapiao_json(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """The invoice's fapiao data as JSON (layout ``cardhour-fapiao/1``)."""
    invoice = selectors.invoice_get_for(buyer=request.portal.organisation, invoice_id=invoice_id)  # type: ignore[attr-defined]
    invoice = statements.invoice_frozen(invoice=invoice)
    return _attachment(
        fapiao.fapiao_json(invoice=invoice),
        content_type="application/json; charset=utf-8",
        filename=f"{invoice.number}-fapiao.json",
    )


urlpatterns: list[URLPattern] = [
    path("invoices/", invoice_list, name="invoice-list"),
    path("invoices/<int:invoice_id>/", invoice_detail, name="invoice-detail"),
    path("invoices/<int:invoice_id>/csv/", invoice_csv, name="invoice-csv"),
    path("invoices/<int:invoice_id>/pdf/", invoice_pdf, name="invoice-pdf"),
    path("invoices/<int:invoice_id>/fapiao.csv", invoice_fapiao_csv, name="invoice-fapiao-csv"),
    path("invoices/<int:invoice_id>/fapiao.json", invoice_fapiao_json, name="invoice-fapiao-json"),
]
