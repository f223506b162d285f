"""The staff dashboard: cards federated by hub and chip, utilisation, revenue by band, offline clusters
and the ledger's reconciliation status, with links into the admin for drill-down."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from decimal import Decimal

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from broker.market import (
    clusters_offline,
    month_start_of,
    reconciliation_last,
    revenue_by_band,
    staff_capacity,
    utilisation_hourly,
)
from core.charts import Bar, line_svg, stacked_bars_svg
from core.portal import portal_view
from metering.services.maintenance import ledger_reconcile

UTILISATION_HOURS = 7 * 24


def _month(value: str | None, *, today: date) -> date:
    """``YYYY-MM`` from the query string as the first of that month; this month when absent or invalid
    (or in the future)."""
    this_month = today.replace(day=1)
    if not value:
        return this_month
    try:
        chosen = datetime.strptime(value, "%Y-%m").date()  # noqa: DTZ007 (a calendar month, not an instant)
    except ValueError:
        return this_month
    return min(chosen, this_month)


@require_http_methods(["GET", "HEAD"])
@portal_view("staff")
def staff_dashboard(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    this_month = month_start_of(now)
    month = _month(request.GET.get("month"), today=timezone.localdate(now))
    capacity = staff_capacity(at=now)
    sellable = capacity.utilisation.overall.sellable_cards
    points = utilisation_hourly(end=now, hours=UTILISATION_HOURS, sellable_cards=sellable)
    line = line_svg(
        [
            (
                date_format(timezone.localtime(p.hour_start), "D H:i"),
                (p.utilisation * 100).quantize(Decimal("0.1")),
            )
            for p in points
        ],
        title=_("Utilisation per hour over the last 7 days, as a percentage of the cards sellable now"),
        unit="%",
        maximum=Decimal(100),
    )
    revenue = revenue_by_band(month_start=month)
    bars = stacked_bars_svg(
        [Bar(label=str(day.day), values=revenue.per_day.get(day, {})) for day in revenue.days],
        title=_("Gross revenue per day by band, %(month)s (CNY)") % {"month": month.strftime("%Y-%m")},
        series=revenue.bands,
        unit="CNY",
    )
    previous_month = (month - timedelta(days=1)).replace(day=1)
    next_month = (month.replace(day=28) + timedelta(days=4)).replace(day=1)
    peak = max(points, key=lambda p: p.utilisation, default=None)
    return render(
        request,
        "staff/dashboard.html",
        {
            "now": now,
            "capacity": capacity,
            "matrix_rows": capacity.matrix.rows(),
            "utilisation_line": line,
            "utilisation_peak": peak,
            "revenue": revenue,
            "revenue_chart": bars,
            "month": month,
            "previous_month": previous_month.strftime("%Y-%m"),
            "next_month": next_month.strftime("%Y-%m") if next_month <= this_month else None,
            "offline": clusters_offline(),
            "reconciliation": reconciliation_last(),
        },
    )


@require_POST
@portal_view("staff")
def staff_reconcile(request: HttpRequest) -> HttpResponse:
    """Run the ledger reconciliation now (staff only) and go back to the dashboard."""
    report = ledger_reconcile()
    if report.ok:
        messages.success(request, _("The ledger reconciles: no breach."))
    else:
        messages.error(
            request,
            _("The ledger has breaches: %(codes)s. They are logged on cardhour.ledger.")
            % {"codes": ", ".join(report.codes())},
        )
    return redirect("staff-dashboard")


urlpatterns = [
    path("staff/", staff_dashboard, name="staff-dashboard"),
    path("staff/reconcile/", staff_reconcile, name="staff-reconcile"),
]
