"""Metering's gauges for /metrics (core.observability), read from the database at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from core.observability import gauge_source
from metering.models import ReconciliationRun, UsageRecord


@gauge_source("metering")
def metering_gauges() -> Iterator[Metric]:
    unrated = UsageRecord.objects.unrated()  # the pending-rating queue, a small table
    yield GaugeMetricFamily(
        "cardhour_usage_unrated_records", "Usage records accepted and not yet rated.", value=unrated.count()
    )
    oldest = unrated.order_by("id").values_list("received_at", flat=True).first()
    yield GaugeMetricFamily(
        "cardhour_usage_unrated_oldest_age_seconds",
        "Age of the oldest unrated usage record (0 when none): rating is behind when this grows.",
        value=(timezone.now() - oldest).total_seconds() if oldest else 0.0,
    )
    run = ReconciliationRun.objects.order_by("-checked_at").first()
    if run is not None:
        yield GaugeMetricFamily(
            "cardhour_ledger_reconciliation_ok",
            "1 when the last ledger reconciliation was clean.",
            value=int(run.ok),
        )
        yield GaugeMetricFamily(
            "cardhour_ledger_reconciliation_breaches",
            "Invariant breaches the last ledger reconciliation found.",
            value=len(run.breaches or []),
        )
        yield GaugeMetricFamily(
            "cardhour_ledger_reconciliation_timestamp_seconds",
            "When the ledger was last reconciled (Unix time).",
            value=run.checked_at.timestamp(),
        )
