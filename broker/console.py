"""Reads of the operator console: an operator's clusters with what is leased on them now, a cluster's
islands and utilisation over time, the usage reported on it, and the operator's leases.

Everything is scoped to one operator organisation; another operator's cluster or lease raises the
not-found errors of the federation and broker selectors (a 404 in the portal), so existence does not leak.

"Leased now" counts the cards of *active* capacity holds whose window contains the instant: the capacity
calendar the broker itself checks. Utilisation divides it by the *sellable* cards (the islands' cards less
their unhealthy cards), the same capacity ``lease_accept`` admits holds against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

import numpy as np
from django.conf import settings
from django.db.models import (
    Count,
    DecimalField,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from broker.models import HOLDING_STATES, CapacityHold, Lease, LeaseTransition
from broker.selectors import lease_get_for_operator, lease_list_for_operator, lease_transitions
from core.models import Organisation
from federation.models import Cluster, ClusterStatus, ClusterStatusChange, Island
from federation.selectors import cluster_get_for_operator, cluster_list_for_operator, cluster_status_history
from metering.models import PriceCard, RatedSegment, UsageRecord

PERCENT_QUANTUM = Decimal("0.1")
CARDS_QUANTUM = Decimal("0.01")
HISTORY_HOURS = 7 * 24
FORECAST_HOURS = 2 * 24
USAGE_DAYS = 7
STATUS_HISTORY_LIMIT = 20
USAGE_RECORDS_LIMIT = 50


def heartbeat_timeout() -> timedelta:
    """How old a heartbeat may be before the monitor takes the cluster offline."""
    return timedelta(
        seconds=settings.CARDHOUR_HEARTBEAT_INTERVAL_SECONDS * settings.CARDHOUR_HEARTBEAT_MISSED_LIMIT
    )


def heartbeat_is_late(*, cluster: Cluster, now: datetime | None = None) -> bool:
    """Whether a cluster that is not retired has gone longer than the heartbeat timeout without a beat."""
    if cluster.status == ClusterStatus.RETIRED:
        return False
    late_before = (now or timezone.now()) - heartbeat_timeout()
    return cluster.last_heartbeat_at is None or cluster.last_heartbeat_at < late_before


def utilisation_percent(*, leased: int | Decimal, sellable: int) -> Decimal | None:
    """``leased`` as a percentage of ``sellable`` cards (one decimal), None when nothing is sellable."""
    if sellable <= 0:
        return None
    return (Decimal(leased) * 100 / Decimal(sellable)).quantize(PERCENT_QUANTUM)


def _held_now(*, now: datetime) -> Q:
    return Q(active=True, start_at__lte=now, end_at__gt=now)


# --- Clusters ---------------------------------------------------------------------------------------


def cluster_console_list(
    *, operator: Organisation, status: str | None = None, hub: str | None = None, now: datetime | None = None
) -> QuerySet[Cluster]:
    """The operator's clusters with ``unhealthy_cards``, ``leased_now`` (cards of holds in force at
    ``now``) and ``rate_now`` (the rate per card-hour of the price card in force, or None) annotated as
    correlated subqueries: one query for a page however many rows it has."""
    now = now or timezone.now()
    unhealthy = (
        Island.objects.filter(cluster=OuterRef("pk"))
        .order_by()
        .values("cluster")
        .annotate(n=Sum("unhealthy_cards"))
        .values("n")
    )
    leased = (
        CapacityHold.objects.filter(_held_now(now=now), island__cluster=OuterRef("pk"))
        .order_by()
        .values("island__cluster")
        .annotate(n=Sum("cards"))
        .values("n")
    )
    rate = (
        PriceCard.objects.filter(cluster=OuterRef("pk"), effective_from__lte=now)
        .order_by("-effective_from", "-version")
        .values("rate_per_card_hour")[:1]
    )
    clusters = cluster_list_for_operator(operator=operator)
    if status:
        clusters = clusters.filter(status=status)
    if hub:
        clusters = clusters.filter(hub__code=hub)
    return clusters.annotate(
        unhealthy_cards=Coalesce(Subquery(unhealthy, output_field=IntegerField()), Value(0)),
        leased_now=Coalesce(Subquery(leased, output_field=IntegerField()), Value(0)),
        rate_now=Subquery(rate, output_field=DecimalField(max_digits=12, decimal_places=4)),
    ).order_by("hub__sort_order", "cpi")


@dataclass(frozen=True)
class ClusterRow:
    """A cluster of :func:`cluster_console_list` with what the console derives from it."""

    cluster: Cluster
    sellable_cards: int
    leased_now: int
    utilisation: Decimal | None
    rate_now: Decimal | None
    heartbeat_late: bool

    @property
    def unhealthy_cards(self) -> int:
        return int(getattr(self.cluster, "unhealthy_cards", 0))


def cluster_console_rows(*, clusters: Sequence[Cluster], now: datetime | None = None) -> list[ClusterRow]:
    """Rows for clusters annotated by :func:`cluster_console_list` (no further queries)."""
    now = now or timezone.now()
    rows = []
    for cluster in clusters:
        unhealthy = int(getattr(cluster, "unhealthy_cards", 0))
        leased = int(getattr(cluster, "leased_now", 0))
        sellable = max(cluster.total_cards - unhealthy, 0)
        rows.append(
            ClusterRow(
                cluster=cluster,
                sellable_cards=sellable,
                leased_now=leased,
                utilisation=utilisation_percent(leased=leased, sellable=sellable),
                rate_now=getattr(cluster, "rate_now", None),
                heartbeat_late=heartbeat_is_late(cluster=cluster, now=now),
            )
        )
    return rows


@dataclass(frozen=True)
class FleetSummary:
    """The operator's fleet at a glance. Cards, sellable cards and leased cards leave retired clusters out."""

    clusters: int
    online: int  # active or draining
    offline: int
    retired: int
    cards: int
    sellable_cards: int
    leased_now: int
    utilisation: Decimal | None


def fleet_summary(*, operator: Organisation, now: datetime | None = None) -> FleetSummary:
    """Counts by status, cards and cards leased now over all the operator's clusters: three queries."""
    now = now or timezone.now()
    by_status = dict(
        Cluster.objects.filter(operator=operator)
        .order_by()
        .values("status")
        .annotate(n=Count("pk"))
        .values_list("status", "n")
    )
    cards = Island.objects.filter(cluster__operator=operator).exclude(cluster__status=ClusterStatus.RETIRED)
    totals = cards.aggregate(cards=Coalesce(Sum("cards"), 0), unhealthy=Coalesce(Sum("unhealthy_cards"), 0))
    leased = (
        CapacityHold.objects.filter(_held_now(now=now), island__cluster__operator=operator)
        .exclude(island__cluster__status=ClusterStatus.RETIRED)
        .aggregate(n=Coalesce(Sum("cards"), 0))["n"]
    )
    sellable = totals["cards"] - totals["unhealthy"]
    return FleetSummary(
        clusters=sum(by_status.values()),
        online=by_status.get(ClusterStatus.ACTIVE, 0) + by_status.get(ClusterStatus.DRAINING, 0),
        offline=by_status.get(ClusterStatus.OFFLINE, 0),
        retired=by_status.get(ClusterStatus.RETIRED, 0),
        cards=totals["cards"],
        sellable_cards=sellable,
        leased_now=leased,
        utilisation=utilisation_percent(leased=leased, sellable=sellable),
    )


def cluster_console_get(*, operator: Organisation, cpi: str) -> Cluster:
    """One of the operator's clusters; ClusterNotFoundError (404) for anyone else's."""
    return cluster_get_for_operator(operator=operator, cpi=cpi)


@dataclass(frozen=True)
class IslandRow:
    island: Island
    leased_now: int
    sellable_cards: int
    utilisation: Decimal | None


def island_console_rows(*, cluster: Cluster, now: datetime | None = None) -> list[IslandRow]:
    """The cluster's islands with the cards held on each now: one query."""
    now = now or timezone.now()
    leased = (
        CapacityHold.objects.filter(_held_now(now=now), island=OuterRef("pk"))
        .order_by()
        .values("island")
        .annotate(n=Sum("cards"))
        .values("n")
    )
    islands = (
        Island.objects.filter(cluster=cluster)
        .annotate(leased_now=Coalesce(Subquery(leased, output_field=IntegerField()), Value(0)))
        .order_by("name")
    )
    rows = []
    for island in islands:
        sellable = island.cards - island.unhealthy_cards
        leased_now = int(island.leased_now)
        rows.append(
            IslandRow(
                island=island,
                leased_now=leased_now,
                sellable_cards=sellable,
                utilisation=utilisation_percent(leased=leased_now, sellable=sellable),
            )
        )
    return rows


def cluster_status_recent(
    *, cluster: Cluster, limit: int = STATUS_HISTORY_LIMIT
) -> list[ClusterStatusChange]:
    return list(cluster_status_history(cluster=cluster)[:limit])


# --- Utilisation over time --------------------------------------------------------------------------


@dataclass(frozen=True)
class UtilisationPoint:
    start_at: datetime  # the hour's start, in the current time zone
    leased_cards: Decimal  # cards held on average over the hour
    percent: Decimal | None


@dataclass(frozen=True)
class UtilisationSeries:
    """Hourly utilisation of a cluster: ``history`` is the last 7 days of whole hours before the current
    hour, ``forecast`` the current hour and the 47 after it, from the holds reserved so far."""

    sellable_cards: int
    history: list[UtilisationPoint]
    forecast: list[UtilisationPoint]

    @property
    def history_peak(self) -> Decimal | None:
        return max((p.percent for p in self.history if p.percent is not None), default=None)

    @property
    def history_average(self) -> Decimal | None:
        values = [p.percent for p in self.history if p.percent is not None]
        if not values:
            return None
        return (sum(values, Decimal(0)) / len(values)).quantize(PERCENT_QUANTUM)

    @property
    def forecast_peak(self) -> Decimal | None:
        return max((p.percent for p in self.forecast if p.percent is not None), default=None)


def current_hour(*, now: datetime | None = None) -> datetime:
    """The start of the hour containing ``now``, in the current time zone."""
    local = timezone.localtime(now or timezone.now())
    return local.replace(minute=0, second=0, microsecond=0)


def _hourly_card_seconds(intervals: list[tuple[float, float, int]], edges: np.ndarray) -> np.ndarray:
    """Card-seconds held in each bucket between consecutive ``edges`` (seconds), for ``intervals``
    (start, end, cards) in the same seconds: the integral of the held-cards step function, read at the
    edges. Exact for any number of holds in O(n log n), no loop over hours."""
    buckets = len(edges) - 1
    if not intervals:
        return np.zeros(buckets)
    starts = np.array([s for s, _, _ in intervals], dtype=float)
    ends = np.array([e for _, e, _ in intervals], dtype=float)
    cards = np.array([c for _, _, c in intervals], dtype=float)
    times = np.concatenate([starts, ends])
    steps = np.concatenate([cards, -cards])
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    rate = np.cumsum(steps)  # cards held just after each event
    integral = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(times))])
    at_edges = np.interp(edges, times, integral, left=0.0, right=float(integral[-1]))
    return np.diff(at_edges)


def cluster_utilisation(*, cluster: Cluster, now: datetime | None = None) -> UtilisationSeries:
    """Hourly leased cards ÷ sellable cards for the last 7 days and the next 2 (see UtilisationSeries).

    A hold counts over its window while active; a hold released when its lease ended (completed,
    cancelled, failed) counts up to the lease's end. One query for the holds, then numpy. The sellable
    cards are today's (the islands' cards less unhealthy ones): the platform keeps no history of them.
    """
    hour = current_hour(now=now)
    window_start = hour - timedelta(hours=HISTORY_HOURS)
    window_end = hour + timedelta(hours=FORECAST_HOURS)
    sellable = (
        Island.objects.filter(cluster=cluster).aggregate(
            n=Coalesce(Sum(F("cards") - F("unhealthy_cards")), 0)
        )["n"]
        or 0
    )
    holds = (
        CapacityHold.objects.filter(island__cluster=cluster, start_at__lt=window_end, end_at__gt=window_start)
        .filter(Q(active=True) | Q(lease__ended_at__gt=F("start_at")))
        .values_list("start_at", "end_at", "cards", "active", "lease__ended_at")
    )
    intervals = []
    for start_at, end_at, cards, active, ended_at in holds:
        if not active and ended_at is not None:
            end_at = min(end_at, ended_at)
        start = max((start_at - window_start).total_seconds(), 0.0)
        end = min((end_at - window_start).total_seconds(), (window_end - window_start).total_seconds())
        if end > start:
            intervals.append((start, end, cards))
    edges = np.arange(HISTORY_HOURS + FORECAST_HOURS + 1, dtype=float) * 3600.0
    held = _hourly_card_seconds(intervals, edges) / 3600.0
    points = []
    for index, value in enumerate(held):
        leased = Decimal(str(round(float(value), 4))).quantize(CARDS_QUANTUM)
        points.append(
            UtilisationPoint(
                start_at=window_start + timedelta(hours=index),
                leased_cards=leased,
                percent=utilisation_percent(leased=leased, sellable=sellable),
            )
        )
    return UtilisationSeries(
        sellable_cards=sellable, history=points[:HISTORY_HOURS], forecast=points[HISTORY_HOURS:]
    )


# --- Usage reported ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageDay:
    day: date
    card_hours_by_band: dict[str, Decimal]

    @property
    def card_hours(self) -> Decimal:
        return sum(self.card_hours_by_band.values(), Decimal(0))


@dataclass(frozen=True)
class ClusterUsage:
    """Rated card-hours by local day and tariff band over the last 7 days (today included), and how
    many records of the period rating has not reached yet."""

    days: list[UsageDay]
    bands: list[str]
    unrated_records: int

    @property
    def card_hours(self) -> Decimal:
        return sum((d.card_hours for d in self.days), Decimal(0))


def _card_hours(card_seconds: int) -> Decimal:
    return (Decimal(card_seconds) / 3600).quantize(CARDS_QUANTUM)


def cluster_usage_recent(*, cluster: Cluster, now: datetime | None = None) -> ClusterUsage:
    """Usage reported on ``cluster`` by records that started in the last 7 local days: two queries
    (rated segments grouped by day and band in SQL; the count of records still unrated)."""
    local_now = timezone.localtime(now or timezone.now())
    first_day = local_now.date() - timedelta(days=USAGE_DAYS - 1)
    since = local_now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=USAGE_DAYS - 1)
    tz = timezone.get_current_timezone()
    rows = (
        RatedSegment.objects.filter(usage_record__cluster=cluster, usage_record__start_at__gte=since)
        .order_by()
        .annotate(day=TruncDate("start_at", tzinfo=tz))
        .values("day", "band")
        .annotate(card_seconds=Sum("card_seconds"))
        .values_list("day", "band", "card_seconds")
    )
    by_day: dict[date, dict[str, Decimal]] = {first_day + timedelta(days=i): {} for i in range(USAGE_DAYS)}
    bands: set[str] = set()
    for day, band, card_seconds in rows:
        if day not in by_day:  # a segment of a record that started in the window but ran on past today
            continue
        by_day[day][band] = by_day[day].get(band, Decimal(0)) + _card_hours(card_seconds)
        bands.add(band)
    unrated = UsageRecord.objects.filter(cluster=cluster, start_at__gte=since).unrated().count()
    return ClusterUsage(
        days=[UsageDay(day=day, card_hours_by_band=values) for day, values in by_day.items()],
        bands=sorted(bands),
        unrated_records=unrated,
    )


# --- Leases -----------------------------------------------------------------------------------------


def lease_console_list(
    *, operator: Organisation, state: str | None = None, cluster: str | None = None
) -> QuerySet[Lease]:
    """The operator's leases, newest window first, filtered by state and cluster CPI; cluster, buyer,
    price card and holds with their islands are loaded (a fixed number of queries per page)."""
    leases = lease_list_for_operator(operator=operator)
    if state:
        leases = leases.filter(state=state)
    if cluster:
        leases = leases.filter(cluster__cpi=cluster)
    return leases.order_by("-start_at", "-id")


def lease_console_live_on(*, cluster: Cluster, limit: int = 10) -> list[Lease]:
    """Leases still holding cards on ``cluster`` (reserved, running, asked to stop), soonest first."""
    return list(
        lease_list_for_operator(operator=cluster.operator)
        .filter(cluster=cluster, state__in=HOLDING_STATES)
        .order_by("start_at", "id")[:limit]
    )


def lease_console_get(*, operator: Organisation, lease_id: int) -> Lease:
    """One of the operator's leases; LeaseNotFoundError (404) for anyone else's."""
    return lease_get_for_operator(operator=operator, lease_id=lease_id)


def lease_console_transitions(*, lease: Lease) -> list[LeaseTransition]:
    return list(lease_transitions(lease=lease))


@dataclass(frozen=True)
class LeaseUsage:
    """Usage reported against a lease: the newest records, how many there are, and the rated card-hours."""

    records: list[UsageRecord]
    record_count: int
    unrated_records: int
    rated_card_hours: Decimal

    @property
    def more(self) -> bool:
        return self.record_count > len(self.records)


def lease_usage(*, lease: Lease, limit: int = USAGE_RECORDS_LIMIT) -> LeaseUsage:
    """The usage records reported against ``lease`` (by its metering reference, by its operator):
    three queries, whatever the number of records."""
    records = UsageRecord.objects.filter(operator_id=lease.operator_id, reference=lease.reference)
    counts = records.aggregate(total=Count("pk"), unrated=Count("pk", filter=Q(rating_pending__isnull=False)))
    rated = RatedSegment.objects.filter(
        usage_record__operator_id=lease.operator_id, usage_record__reference=lease.reference
    ).aggregate(n=Coalesce(Sum("card_seconds"), 0))["n"]
    return LeaseUsage(
        records=list(records.with_rated().order_by("-start_at", "-id")[:limit]),
        record_count=counts["total"],
        unrated_records=counts["unrated"],
        rated_card_hours=_card_hours(rated),
    )


def record_card_hours(record: UsageRecord) -> Decimal:
    """A usage record's card-hours: cards × its length."""
    return (
        Decimal(record.cards) * Decimal((record.end_at - record.start_at).total_seconds()) / 3600
    ).quantize(CARDS_QUANTUM)
