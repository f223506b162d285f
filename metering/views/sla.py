"""Portal pages for SLA credit notes (issue 16 item 3): a buyer's notes and one note in full; an operator's
notes against it. Read only: notes are issued by the platform and disputes are decided by staff.

A note another organisation is party to answers 404 like a missing one; the buyer's pages and the
operator's are separate URLs, so a buyer page is never an operator's and the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.core.paginator import Paginator
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, path
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from core.money import lines_total, micros_to_fen
from core.portal import portal_view
from metering.models import SlaCredit
from metering.selectors import sla as selectors
from metering.selectors.spend import buyer_spend_rows
from metering.services.sla import percent_text, sla_credit_reason
from metering.sla import sla_schedule_parse

PAGE_SIZE = 50


@dataclass(frozen=True)
class TimelinePart:
    kind: str  # delivered / lost / buyer / maintenance
    label: str
    start_at: datetime
    end_at: datetime
    percent: Decimal  # of the window's width

    @property
    def minutes(self) -> Decimal:
        return (Decimal((self.end_at - self.start_at).total_seconds()) / 60).quantize(Decimal("0.1"))


def _timeline(credit: SlaCredit) -> list[TimelinePart]:
    """The window cut into consecutive parts by what the attribution made of them (drawn as one bar)."""
    labels = {
        "lost": _("Lost to the operator"),
        "excluded_buyer": _("Your side (stopped, cancelled or ended)"),
        "excluded_maintenance": _("Maintenance announced ahead"),
        "delivered": _("Served"),
    }
    marks: list[tuple[datetime, datetime, str]] = []
    for kind in ("lost", "excluded_buyer", "excluded_maintenance"):
        for start, end in credit.intervals.get(kind, []):
            marks.append((datetime.fromisoformat(start), datetime.fromisoformat(end), kind))
    marks.sort()
    start, end = credit.window_start_at, credit.window_end_at
    width = Decimal((end - start).total_seconds()) or Decimal(1)
    parts: list[TimelinePart] = []
    cursor = start

    def add(kind: str, a: datetime, b: datetime) -> None:
        if b > a:
            share = (Decimal((b - a).total_seconds()) * 100 / width).quantize(Decimal("0.01"))
            parts.append(TimelinePart(kind=kind, label=labels[kind], start_at=a, end_at=b, percent=share))

    for a, b, kind in marks:
        a, b = max(a, cursor), min(b, end)
        if b <= a:
            continue
        add("delivered", cursor, a)
        add(kind, a, b)
        cursor = b
    add("delivered", cursor, end)
    return parts


def _context(credit: SlaCredit, *, side: str) -> dict[str, object]:
    counted = credit.window_seconds - credit.excluded_buyer_seconds - credit.excluded_maintenance_seconds
    applied = (credit.tier_below_percent, credit.credit_percent)
    schedule = [
        {
            "below": percent_text(tier.below_percent),
            "credit": percent_text(tier.credit_percent),
            "applied": (tier.below_percent, tier.credit_percent) == applied,
        }
        for tier in sla_schedule_parse(credit.price_card.sla_credit_schedule)
    ]
    dispute = getattr(credit, "dispute", None)
    return {
        "credit": credit,
        "side": side,
        "reason": sla_credit_reason(credit),
        "lines": selectors.sla_credit_lines(credit),
        "timeline": _timeline(credit),
        "schedule": schedule,
        "minutes": {
            "window": Decimal(credit.window_seconds) / 60,
            "lost": Decimal(credit.lost_seconds) / 60,
            "buyer": Decimal(credit.excluded_buyer_seconds) / 60,
            "maintenance": Decimal(credit.excluded_maintenance_seconds) / 60,
            "counted": Decimal(counted) / 60,
            "delivered": Decimal(counted - credit.lost_seconds) / 60,
        },
        "service_level": percent_text(credit.service_level_percent),
        "tier_below": percent_text(credit.tier_below_percent),
        "credit_percent": percent_text(credit.credit_percent),
        "charge": micros_to_fen(credit.charge_gross),
        # What the buyer paid for the lease: the same figure its usage page, budgets and invoice use (prepaid
        # value drawn plus arrears), not the operator's list price above.
        "paid": lines_total(
            row.value_micros
            for row in buyer_spend_rows(buyer_id=credit.buyer_id, references=[credit.reference])
        ),
        "credited": micros_to_fen(credit.credit_gross),
        "buyer_value": micros_to_fen(credit.credit_buyer_value),
        "payable_debited": micros_to_fen(credit.credit_gross - credit.credit_commission),
        "commission_returned": micros_to_fen(credit.credit_commission),
        "dispute": dispute,
    }


def _list(request: HttpRequest, *, side: str) -> HttpResponse:
    organisation = request.portal.organisation  # type: ignore[attr-defined]
    credits = selectors.sla_credit_list_for(organisation=organisation, role=side)
    totals = credits.aggregate(credited=Sum("credit_gross"), value=Sum("credit_buyer_value"))
    page = Paginator(credits, PAGE_SIZE).get_page(request.GET.get("page"))
    for credit in page:
        credit.credited_cny = micros_to_fen(credit.credit_gross)  # type: ignore[attr-defined]
        credit.value_cny = micros_to_fen(credit.credit_buyer_value)  # type: ignore[attr-defined]
    return render(
        request,
        "metering/sla/list.html",
        {
            "page": page,
            "side": side,
            "count": credits.count(),
            "total_credited": micros_to_fen(totals["credited"] or 0),
            "total_value": micros_to_fen(totals["value"] or 0),
        },
    )


@require_GET
@portal_view("buyer")
def sla_credit_list(request: HttpRequest) -> HttpResponse:
    """The buyer's SLA credit notes, newest first."""
    return _list(request, side=selectors.ROLE_BUYER)


@require_GET
@portal_view("buyer")
def sla_credit_detail(request: HttpRequest, credit_id: int) -> HttpResponse:
    """One of the buyer's credit notes: the lease, the window, the time lost, availability against the
    service level, the tier, and what came back (card-hours and CNY) by which ledger transfer."""
    credit = selectors.sla_credit_get_for(
        organisation=request.portal.organisation,  # type: ignore[attr-defined]
        credit_id=credit_id,
        role=selectors.ROLE_BUYER,
    )
    return render(request, "metering/sla/detail.html", _context(credit, side=selectors.ROLE_BUYER))


@require_GET
@portal_view("operator")
def operator_sla_credit_list(request: HttpRequest) -> HttpResponse:
    """SLA credit notes issued against the operator's clusters, newest first."""
    return _list(request, side=selectors.ROLE_OPERATOR)


@require_GET
@portal_view("operator")
def operator_sla_credit_detail(request: HttpRequest, credit_id: int) -> HttpResponse:
    credit = selectors.sla_credit_get_for(
        organisation=request.portal.organisation,  # type: ignore[attr-defined]
        credit_id=credit_id,
        role=selectors.ROLE_OPERATOR,
    )
    return render(request, "metering/sla/detail.html", _context(credit, side=selectors.ROLE_OPERATOR))


urlpatterns: list[URLPattern] = [
    path("sla-credits/", sla_credit_list, name="sla-credit-list"),
    path("sla-credits/<int:credit_id>/", sla_credit_detail, name="sla-credit-detail"),
    path("operator/sla-credits/", operator_sla_credit_list, name="operator-sla-credit-list"),
    path(
        "operator/sla-credits/<int:credit_id>/", operator_sla_credit_detail, name="operator-sla-credit-detail"
    ),
]
