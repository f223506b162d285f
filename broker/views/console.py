"""The operator console: the operator's clusters and islands with what is leased on them now and over time,
and the leases on its clusters. Read-only: clusters change through the cluster API and the fleet import,
leases through the operator's agents (start, stop and usage are theirs to report)."""

from __future__ import annotations

from decimal import Decimal

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext as _

from broker import console
from broker.forms.console import ClusterFilterForm, LeaseFilterForm
from core.charts import Bar, band_sort_key, line_svg, stacked_bars_svg
from core.portal import portal_view
from metering.errors import PriceCardNotFoundError
from metering.selectors.tariffs import price_card_current

PAGE_SIZE = 50


def _hour_label(point: console.UtilisationPoint) -> str:
    return timezone.localtime(point.start_at).strftime("%m-%d %H:00")


@portal_view("operator")
def cluster_list(request: HttpRequest) -> HttpResponse:
    operator = request.portal.organisation  # type: ignore[attr-defined]
    now = timezone.now()
    filters = ClusterFilterForm(request.GET)
    clusters = console.cluster_console_list(
        operator=operator, status=filters.value("status"), hub=filters.value("hub"), now=now
    )
    page = Paginator(clusters, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "broker/console/cluster_list.html",
        {
            "filters": filters,
            "page": page,
            "rows": console.cluster_console_rows(clusters=list(page.object_list), now=now),
            "summary": console.fleet_summary(operator=operator, now=now),
            "heartbeat_timeout": int(console.heartbeat_timeout().total_seconds()),
        },
    )


@portal_view("operator")
def cluster_detail(request: HttpRequest, cpi: str) -> HttpResponse:
    operator = request.portal.organisation  # type: ignore[attr-defined]
    now = timezone.now()
    cluster = console.cluster_console_get(operator=operator, cpi=cpi)
    try:
        price_card = price_card_current(cluster=cluster, at=now)
    except PriceCardNotFoundError:
        price_card = None
    islands = console.island_console_rows(cluster=cluster, now=now)
    leased_now = sum(row.leased_now for row in islands)
    sellable = sum(row.sellable_cards for row in islands)
    series = console.cluster_utilisation(cluster=cluster, now=now)
    usage = console.cluster_usage_recent(cluster=cluster, now=now)
    bands = sorted(usage.bands, key=band_sort_key)
    hundred = Decimal(100)
    return render(
        request,
        "broker/console/cluster_detail.html",
        {
            "cluster": cluster,
            "price_card": price_card,
            "islands": islands,
            "unhealthy_cards": sum(row.island.unhealthy_cards for row in islands),
            "leased_now": leased_now,
            "sellable_cards": sellable,
            "utilisation_now": console.utilisation_percent(leased=leased_now, sellable=sellable),
            "heartbeat_late": console.heartbeat_is_late(cluster=cluster, now=now),
            "heartbeat_timeout": int(console.heartbeat_timeout().total_seconds()),
            "history": console.cluster_status_recent(cluster=cluster),
            "series": series,
            "history_chart": line_svg(
                [(_hour_label(p), p.percent or Decimal(0)) for p in series.history],
                title=_("Utilisation of %(cpi)s, hourly, last 7 days (%%)") % {"cpi": cluster.cpi},
                unit="%",
                maximum=hundred,
            ),
            "forecast_chart": line_svg(
                [(_hour_label(p), p.percent or Decimal(0)) for p in series.forecast],
                title=_("Reserved utilisation of %(cpi)s, hourly, next 48 hours (%%)") % {"cpi": cluster.cpi},
                unit="%",
                maximum=hundred,
                colour="#7a4fa8",
            ),
            "usage": usage,
            "usage_bands": bands,
            "usage_rows": [
                (day, [day.card_hours_by_band.get(band, Decimal(0)) for band in bands]) for day in usage.days
            ],
            "usage_totals": [
                sum((day.card_hours_by_band.get(band, Decimal(0)) for day in usage.days), Decimal(0))
                for band in bands
            ],
            "usage_chart": stacked_bars_svg(
                [Bar(day.day.strftime("%m-%d"), day.card_hours_by_band) for day in usage.days],
                title=_("Card-hours used on %(cpi)s per day by tariff band, last 7 days")
                % {"cpi": cluster.cpi},
                series=bands,
                unit=_("card-hours"),
            )
            if bands
            else None,
            "live_leases": console.lease_console_live_on(cluster=cluster),
        },
    )


@portal_view("operator")
def lease_list(request: HttpRequest) -> HttpResponse:
    operator = request.portal.organisation  # type: ignore[attr-defined]
    filters = LeaseFilterForm(request.GET, operator=operator)
    leases = console.lease_console_list(
        operator=operator, state=filters.value("state"), cluster=filters.value("cluster")
    )
    page = Paginator(leases, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "broker/console/lease_list.html", {"filters": filters, "page": page})


@portal_view("operator")
def lease_detail(request: HttpRequest, lease_id: int) -> HttpResponse:
    operator = request.portal.organisation  # type: ignore[attr-defined]
    lease = console.lease_console_get(operator=operator, lease_id=lease_id)
    usage = console.lease_usage(lease=lease)
    return render(
        request,
        "broker/console/lease_detail.html",
        {
            "lease": lease,
            "transitions": console.lease_console_transitions(lease=lease),
            "usage": usage,
            "usage_rows": [(record, console.record_card_hours(record)) for record in usage.records],
        },
    )


urlpatterns = [
    path("operator/clusters/", cluster_list, name="operator-cluster-list"),
    path("operator/clusters/<str:cpi>/", cluster_detail, name="operator-cluster-detail"),
    path("operator/leases/", lease_list, name="operator-lease-list"),
    path("operator/leases/<int:lease_id>/", lease_detail, name="operator-lease-detail"),
]
