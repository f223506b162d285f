"""The broker's gauges for /metrics (core.observability), read from the database at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric

from broker.catalog import market
from broker.models import LeaseEventDelivery
from core import wakeups
from core.observability import gauge_source


@gauge_source("broker")
def broker_gauges() -> Iterator[Metric]:
    counts = dict(
        LeaseEventDelivery.objects.filter(
            status__in=[LeaseEventDelivery.Status.PENDING, LeaseEventDelivery.Status.GAVE_UP]
        )
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    yield GaugeMetricFamily(
        "cardhour_lease_events_pending",
        "Lease events not yet delivered to operators' endpoints.",
        value=counts.get(LeaseEventDelivery.Status.PENDING, 0),
    )
    yield GaugeMetricFamily(
        "cardhour_lease_events_given_up",
        "Lease events given up after every retry (the operator must re-list its lease feed).",
        value=counts.get(LeaseEventDelivery.Status.GAVE_UP, 0),
    )
    age = market.catalogue_age
    yield GaugeMetricFamily(
        "cardhour_broker_catalogue_age_seconds",
        "Seconds since the island catalogue the process that answered this scrape quotes from was read "
        "(NaN: not loaded yet).",
        value=float("nan") if age is None else age,
    )
    yield GaugeMetricFamily(
        "cardhour_broker_market_inherited",
        "1 if the process that answered this scrape started with the market its server's master loaded "
        "before forking it (config/prefork.py), else 0.",
        value=1 if market.inherited else 0,
    )
    yield GaugeMetricFamily(
        "cardhour_long_polls_waiting",
        "Lease-feed long-polls waiting in the process that answered this scrape.",
        value=wakeups.waiting_count(),
    )
