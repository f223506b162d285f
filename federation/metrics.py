"""Federation's gauges for /metrics (core.observability), read from the database at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric

from core.observability import gauge_source
from federation.models import Cluster, ClusterStatus
from federation.selectors import heartbeat_monitor_assess


@gauge_source("federation")
def cluster_gauges() -> Iterator[Metric]:
    clusters = GaugeMetricFamily("cardhour_clusters", "Registered clusters by status.", labels=["status"])
    counts = dict(Cluster.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    for status in ClusterStatus.values:
        clusters.add_metric([status], counts.get(status, 0))
    yield clusters
    yield GaugeMetricFamily(
        "cardhour_clusters_offline",
        "Clusters offline (missed heartbeats): their leases are failed over.",
        value=counts.get(ClusterStatus.OFFLINE, 0),
    )
    assessment = heartbeat_monitor_assess()
    yield GaugeMetricFamily(
        "cardhour_clusters_heartbeat_overdue",
        "Active or draining clusters past their missed-heartbeat limit and not yet offline (the monitor runs "
        "every 10 s; more than a moment means it is holding or not running).",
        value=assessment.overdue,
    )
    yield GaugeMetricFamily(
        "cardhour_heartbeat_monitor_holding",
        "1 while the mass-miss hold applies: most of the fleet is missing heartbeats at once and the monitor "
        "takes no cluster offline.",
        value=int(assessment.holding),
    )
