"""Metering's gauges for /metrics (core.observability), read from the database at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from core.observability import gauge_source
from metering.models import ReconciliationRun, UsagePending, UsageRecord


@gauge_source("metering")
def metering_gauges() -> Iterator[Metric]:
    # Read from the pending-rating queue (a small table: a row per record waiting), not from the usage
    # history: ``UsageRecord.objects.unrated()`` semi-joins every month's partition to the queue, ~90 ms
    # of PostgreSQL per scrape in the design-load soak and growing with the history (issue 14). A queue
    # row is exactly an unrated record (the reconciliation checks each row against its record).
    yield GaugeMetricFamily(
        "cardhour_usage_unrated_records",
        "Usage records accepted and not yet rated.",
        value=UsagePending.objects.count(),
    )
    # The oldest waiting record is the queue's smallest id (ids are handed out as records are received);
    # its receipt time is on the record, read by primary key in the one month its start names.
    first = (
        UsagePending.objects.order_by("usage_record_id").values_list("usage_record_id", "start_at").first()
    )
    oldest = (
        UsageRecord.objects.filter(pk=first[0], start_at=first[1])
        .values_list("received_at", flat=True)
        .first()
        if first is not None
        else None
    )
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
