"""The buyer's usage and spend dashboard, and its numbers as CSV.

Reads only, through metering.selectors.usage_dashboard: card-hours per local day stacked by band, spend per
cluster, pack balances and expiry, the run-out forecast and the usage not rated yet. A fixed number of
queries whatever the number of usage records.
"""

from __future__ import annotations

import csv
from decimal import Decimal

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.translation import gettext as _

from core.charts import Bar, stacked_bars_svg
from core.models import Organisation
from core.portal import portal_view
from metering.forms.usage import UsageFilterForm
from metering.selectors.usage_dashboard import (
    FORECAST_TRAILING_DAYS,
    ClusterUsage,
    DayBar,
    UsagePeriod,
    UsedCluster,
    local_today,
    usage_by_day_band,
    usage_clusters_for,
    usage_dashboard_for,
    usage_forecast_for,
    usage_spend_lines,
)
from metering.selectors.usage_dashboard import dashboard_zone as _zone


def _buyer(request: HttpRequest) -> Organisation:
    return request.portal.organisation  # type: ignore[attr-defined]


def _filter_form(request: HttpRequest, clusters: list[UsedCluster]) -> UsageFilterForm:
    # A query string holding none of the filter's fields (say ?page=2) counts as no filter.
    fields = ("from", "to", "chip", "cluster")
    data = request.GET if any(name in request.GET for name in fields) else None
    return UsageFilterForm(data, clusters=clusters, today=local_today())


@portal_view("buyer")
def usage_dashboard(request: HttpRequest) -> HttpResponse:
    buyer = _buyer(request)
    clusters = usage_clusters_for(buyer=buyer)
    chip_names = {c.chip: c.chip_name for c in clusters}
    form = _filter_form(request, clusters)
    dashboard = None
    chart = None
    cluster_bars: list[tuple[ClusterUsage, Decimal]] = []
    day_table: list[tuple[DayBar, list[Decimal]]] = []
    if not form.is_bound or form.is_valid():
        dashboard = usage_dashboard_for(buyer=buyer, period=form.period(), chip_names=chip_names)
        period = dashboard.period
        chart = stacked_bars_svg(
            [Bar(f"{day.day:%m-%d}", day.card_hours_by_band) for day in dashboard.days],
            title=_("Card-hours per day by band, %(start)s to %(end)s")
            % {"start": period.start_date.isoformat(), "end": period.end_date.isoformat()},
            series=dashboard.bands,
            unit=_("card-hours"),
        )
        day_table = [
            (day, [day.card_hours_by_band.get(band, Decimal(0)) for band in dashboard.bands])
            for day in dashboard.days
        ]
        top = max((c.spend for c in dashboard.clusters), default=Decimal(0))
        cluster_bars = [
            (c, (c.spend * 100 / top).quantize(Decimal("0.1")) if top else Decimal(0))
            for c in dashboard.clusters
        ]
    forecasts = usage_forecast_for(buyer=buyer, now=timezone.now(), chip_names=chip_names)
    pack_rows = sorted(
        (row for forecast in forecasts for row in forecast.pack_rows),
        key=lambda r: (r.pack.expires_at, r.pack.pk),
    )
    return render(
        request,
        "metering/usage/dashboard.html",
        {
            "form": form,
            "dashboard": dashboard,
            "chart": chart,
            "cluster_bars": cluster_bars,
            "day_table": day_table,
            "forecasts": forecasts,
            "pack_rows": pack_rows,
            "trailing_days": FORECAST_TRAILING_DAYS,
            "zone_name": _zone().key,
            "has_clusters": bool(clusters),
            "query": request.GET.urlencode(),
        },
    )


def _csv_response(filename: str) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _period_or_error(request: HttpRequest) -> UsagePeriod | HttpResponse:
    buyer = _buyer(request)
    form = _filter_form(request, usage_clusters_for(buyer=buyer))
    if form.is_bound and not form.is_valid():
        errors = "; ".join(
            f"{name}: {' '.join(str(m) for m in messages)}" for name, messages in form.errors.items()
        )
        return HttpResponse(errors, status=400, content_type="text/plain; charset=utf-8")
    return form.period()


@portal_view("buyer")
def usage_csv(request: HttpRequest) -> HttpResponse:
    """One row per local day × band × pack class: exact card-seconds, card-hours to the micro-card-hour,
    card-hours drawn from packs (in the unit of ``pack_class``: standard card-hours for ``std``, the chip's
    otherwise), card-hours no pack covered (arrears, the chip's), and — exact, to 6 places, before the
    rounding of statement lines — what the buyer pays (``spend_cny_exact``) and the operators' list price
    (``operator_list_price_cny_exact``). The fen figures are in the per-line CSV."""
    period = _period_or_error(request)
    if isinstance(period, HttpResponse):
        return period
    rows = usage_by_day_band(buyer=_buyer(request), period=period)
    response = _csv_response(f"cardhour-usage-{period.start_date}-{period.end_date}.csv")
    writer = csv.writer(response)
    writer.writerow(
        [
            "date",
            "band",
            "pack_class",
            "card_seconds",
            "card_hours",
            "pack_draw_card_hours",
            "arrears_card_hours",
            "spend_cny_exact",
            "operator_list_price_cny_exact",
        ]
    )
    for row in rows:
        writer.writerow(
            [
                row.day.isoformat(),
                row.band,
                row.pack_class,
                row.card_seconds,
                row.card_hours,
                row.pack_draw,
                row.arrears,
                row.value,
                row.gross,
            ]
        )
    return response


@portal_view("buyer")
def usage_cluster_csv(request: HttpRequest) -> HttpResponse:
    """One row per statement line of the period — cluster × band × pack class, covered by a pack or not
    (``covered_by``: ``pack`` or ``none`` for arrears) — the grouping of an invoice's usage lines:
    card-seconds, card-hours, the pack draw in the unit of ``pack_class``, and the line's spend and the
    operators' list price, each rounded once to the fen (core.money). The spend column adds up to the
    dashboard's spend and, for a calendar month, to the invoice's usage and arrears lines."""
    period = _period_or_error(request)
    if isinstance(period, HttpResponse):
        return period
    lines = usage_spend_lines(buyer=_buyer(request), period=period)
    response = _csv_response(f"cardhour-usage-clusters-{period.start_date}-{period.end_date}.csv")
    writer = csv.writer(response)
    writer.writerow(
        [
            "cluster",
            "band",
            "pack_class",
            "covered_by",
            "card_seconds",
            "card_hours",
            "pack_draw_card_hours",
            "spend_cny",
            "operator_list_price_cny",
        ]
    )
    for line in lines:
        writer.writerow(
            [
                line.cpi,
                line.band,
                line.pack_class,
                "none" if line.arrears else "pack",
                line.card_seconds,
                line.card_hours,
                line.pack_draw,
                line.spend,
                line.list_price,
            ]
        )
    return response


urlpatterns: list[URLPattern] = [
    path("usage/", usage_dashboard, name="usage-dashboard"),
    path("usage.csv", usage_csv, name="usage-csv"),
    path("usage/clusters.csv", usage_cluster_csv, name="usage-cluster-csv"),
]
