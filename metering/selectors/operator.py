"""What an operator's portal pages read: which price each cluster charges, price-card histories, and
earnings by period, cluster, band and day.

Earnings use the settlement's own arithmetic (metering.services.billing.settlement_issue): exact integer
micro-CNY per (prior period?, cluster, band), quantised once per line to the fen, half to even, with
``payable = gross − commission`` per line and totals as sums of lines. A month already settled is read
from its settlement; an open month from the rated segments its settlement will take (not yet settled, and
starting before the month's end), so the page shows the figures the statement will carry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from django.db.models import Max, OuterRef, Prefetch, QuerySet, Subquery, Sum
from django.db.models.functions import TruncDate, TruncMonth
from django.utils import timezone

from core.models import Organisation
from core.money import micros_to_fen
from federation.models import Cluster
from metering.models import (
    Band,
    PriceCard,
    RatedSegment,
    Settlement,
    Tariff,
    TariffBand,
    TariffVersion,
    TariffWindow,
    UsageRecord,
)
from metering.selectors.tariffs import tariff_list_for
from metering.services.billing import billing_period_bounds, billing_period_end, billing_zone

_SECONDS_PER_HOUR = Decimal(3600)
_BAND_ORDER = {band.value: position for position, band in enumerate(Band)}


# --- Price cards ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterPrice:
    """A cluster of the operator and the price card in force for it now (None: not priced yet)."""

    cluster: Cluster
    card: PriceCard | None
    scheduled: PriceCard | None  # the next card, when one is set to take effect later


def operator_price_overview(*, operator: Organisation, at: datetime | None = None) -> list[ClusterPrice]:
    """Every cluster of ``operator`` (by CPI) with its price card in force at ``at`` (default now) and the
    next one scheduled after it, if any. Two queries whatever the number of clusters and cards."""
    at = at or timezone.now()
    clusters = list(
        Cluster.objects.filter(operator=operator).select_related("hub", "accelerator").order_by("cpi")
    )
    cards = (
        PriceCard.objects.filter(cluster__operator=operator)
        .select_related("tariff_version__tariff")
        .order_by("cluster_id", "effective_from", "version")
    )
    current: dict[int, PriceCard] = {}
    scheduled: dict[int, PriceCard] = {}
    for card in cards:
        if card.effective_from <= at:
            current[card.cluster_id] = card  # ascending order: the last one at or before ``at`` wins
        elif card.cluster_id not in scheduled:
            scheduled[card.cluster_id] = card
    return [ClusterPrice(cluster=c, card=current.get(c.pk), scheduled=scheduled.get(c.pk)) for c in clusters]


def price_card_history(*, cluster: Cluster) -> QuerySet[PriceCard]:
    """Every price-card version of ``cluster``, newest first, each annotated with ``until``: when the next
    version takes over (None for the newest). Versions take effect in version order (price_card_set
    refuses a card that would start before the newest one), so the next version is the successor."""
    following = PriceCard.objects.filter(cluster=OuterRef("cluster"), version__gt=OuterRef("version"))
    return (
        PriceCard.objects.filter(cluster=cluster)
        .select_related("tariff_version__tariff")
        .annotate(until=Subquery(following.order_by("version").values("effective_from")[:1]))
        .order_by("-version")
    )


# --- Earnings ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EarningsLine:
    """One (cluster, band, late?) line of a period, as the settlement states it."""

    cluster_id: int
    cpi: str
    band: str
    prior_period: bool
    card_seconds: int
    gross: Decimal
    commission: Decimal
    payable: Decimal

    @property
    def card_hours(self) -> Decimal:
        return Decimal(self.card_seconds) / _SECONDS_PER_HOUR


@dataclass(frozen=True)
class EarningsTotal:
    """A sum of lines: by cluster, by band, or a whole period."""

    key: str
    card_seconds: int
    gross: Decimal
    commission: Decimal
    payable: Decimal

    @property
    def card_hours(self) -> Decimal:
        return Decimal(self.card_seconds) / _SECONDS_PER_HOUR


def _total(key: str, lines: Iterable[EarningsLine]) -> EarningsTotal:
    rows = list(lines)
    zero = Decimal("0.00")
    return EarningsTotal(
        key=key,
        card_seconds=sum(line.card_seconds for line in rows),
        gross=sum((line.gross for line in rows), zero),
        commission=sum((line.commission for line in rows), zero),
        payable=sum((line.payable for line in rows), zero),
    )


@dataclass(frozen=True)
class PeriodEarnings:
    """A month's earnings: its lines and totals. ``settlement`` is None while the month is open."""

    period_start: date
    period_end: date
    settlement: Settlement | None
    lines: tuple[EarningsLine, ...]

    @property
    def is_open(self) -> bool:
        return self.settlement is None

    @property
    def total(self) -> EarningsTotal:
        return _total("total", self.lines)

    @property
    def by_cluster(self) -> list[EarningsTotal]:
        groups: dict[str, list[EarningsLine]] = defaultdict(list)
        for line in self.lines:
            groups[line.cpi].append(line)
        return [_total(cpi, rows) for cpi, rows in sorted(groups.items())]

    @property
    def by_band(self) -> list[EarningsTotal]:
        groups: dict[str, list[EarningsLine]] = defaultdict(list)
        for line in self.lines:
            groups[line.band].append(line)
        return [
            _total(band, rows)
            for band, rows in sorted(groups.items(), key=lambda i: _BAND_ORDER.get(i[0], 99))
        ]

    @property
    def has_late_lines(self) -> bool:
        return any(line.prior_period for line in self.lines)


def _sort_lines(lines: list[EarningsLine]) -> tuple[EarningsLine, ...]:
    return tuple(sorted(lines, key=lambda li: (li.prior_period, li.cpi, _BAND_ORDER.get(li.band, 99))))


def _line(*, cpi: str, cluster_id: int, band: str, prior: bool, sums: list[int]) -> EarningsLine:
    card_seconds, gross_micros, commission_micros = sums
    gross = micros_to_fen(gross_micros)
    commission = micros_to_fen(commission_micros)
    return EarningsLine(
        cluster_id=cluster_id,
        cpi=cpi,
        band=band,
        prior_period=prior,
        card_seconds=card_seconds,
        gross=gross,
        commission=commission,
        payable=gross - commission,
    )


def _month_of(value: datetime | date) -> date:
    if isinstance(value, datetime):
        value = timezone.localtime(value, billing_zone()).date() if timezone.is_aware(value) else value.date()
    return value.replace(day=1)


def billing_month_of(*, at: datetime) -> date:
    """The first day of the billing month ``at`` falls in (billing zone)."""
    return _month_of(at)


def settlement_of_period(*, operator: Organisation, period_start: date) -> PeriodEarnings | None:
    """The settled month ``period_start`` of ``operator`` from its settlement (lines prefetched), or None."""
    settlement = (
        Settlement.objects.filter(operator=operator, period_start=period_start)
        .prefetch_related("lines__cluster")
        .first()
    )
    if settlement is None:
        return None
    return _settled(settlement)


def _settled(settlement: Settlement) -> PeriodEarnings:
    lines = [
        EarningsLine(
            cluster_id=line.cluster_id,
            cpi=line.cluster.cpi,
            # An SLA credit line has no band: it is named by what it is, in the reader's language.
            band=line.band or f"{line.get_kind_display()} SLA-{line.sla_credit_id}",
            prior_period=line.prior_period,
            card_seconds=line.card_seconds,
            gross=line.gross,
            commission=line.commission,
            payable=line.payable,
        )
        for line in settlement.lines.all()
    ]
    return PeriodEarnings(
        period_start=settlement.period_start,
        period_end=settlement.period_end,
        settlement=settlement,
        lines=_sort_lines(lines),
    )


def operator_open_earnings(*, operator: Organisation, now: datetime | None = None) -> list[PeriodEarnings]:
    """The months of ``operator`` not settled yet, oldest first, up to the current one (always included):
    what each of their settlements will state from the usage rated so far.

    The months run from the one after the newest settlement (or the oldest unsettled usage) to now. As a
    close would, the first of them also takes every older unsettled segment (usage reported late for a
    settled month) as late, ``prior_period`` lines. Three queries.
    """
    now = now or timezone.now()
    current = _month_of(now)
    _, current_end = billing_period_bounds(period_start=current)
    latest_settled = Settlement.objects.filter(operator=operator).aggregate(p=Max("period_start"))["p"]
    records = UsageRecord.objects.filter(operator=operator, start_at__lt=current_end)
    rows = (
        RatedSegment.objects.filter(
            usage_record_id__in=Subquery(records.values("pk")),
            settlement__isnull=True,
            start_at__lt=current_end,
        )
        .annotate(month=TruncMonth("start_at", tzinfo=billing_zone()))
        .order_by()
        .values("month", "usage_record__cluster_id", "band")
        .annotate(s_card_seconds=Sum("card_seconds"), s_gross=Sum("gross"), s_commission=Sum("commission"))
    )
    grouped = [
        (
            _month_of(row["month"]),
            row["usage_record__cluster_id"],
            row["band"],
            int(row["s_card_seconds"]),
            int(row["s_gross"]),
            int(row["s_commission"]),
        )
        for row in rows
    ]
    if latest_settled is not None:
        first = billing_period_end(period_start=latest_settled)
    else:
        first = min((month for month, *_ in grouped), default=current)
    first = min(first, current)
    # Exact micro sums per (period, prior?, cluster, band), exactly as settlement_issue merges them.
    sums: dict[tuple[date, bool, int, str], list[int]] = {}
    for month, cluster_id, band, card_seconds, gross, commission in grouped:
        period = max(month, first)
        key = (period, month < period, cluster_id, band)
        acc = sums.setdefault(key, [0, 0, 0])
        acc[0] += card_seconds
        acc[1] += gross
        acc[2] += commission
    cpis = dict(
        Cluster.objects.filter(pk__in={key[2] for key in sums}).values_list("pk", "cpi") if sums else []
    )
    periods: list[PeriodEarnings] = []
    month = first
    while month <= current:
        lines = [
            _line(
                cpi=cpis.get(cluster_id, str(cluster_id)),
                cluster_id=cluster_id,
                band=band,
                prior=prior,
                sums=acc,
            )
            for (period, prior, cluster_id, band), acc in sums.items()
            if period == month
        ]
        if lines or month == current:
            periods.append(
                PeriodEarnings(
                    period_start=month,
                    period_end=billing_period_end(period_start=month),
                    settlement=None,
                    lines=_sort_lines(lines),
                )
            )
        month = billing_period_end(period_start=month)
    return periods


@dataclass(frozen=True)
class DayEarnings:
    """One local day of a month: the operator's share (payable) and card-hours per band."""

    day: date
    payable_by_band: dict[str, Decimal]
    card_hours_by_band: dict[str, Decimal]

    @property
    def payable(self) -> Decimal:
        return sum(self.payable_by_band.values(), Decimal("0.00"))

    @property
    def card_hours(self) -> Decimal:
        return sum(self.card_hours_by_band.values(), Decimal(0))


def operator_earnings_by_day(*, operator: Organisation, period_start: date) -> list[DayEarnings]:
    """Every day of the month ``period_start`` (billing zone), with the operator's share and card-hours of
    the segments that start that day, per band. Daily amounts are rounded to the fen for display only; the
    statement's figures are the lines'. One query."""
    start_at, end_at = billing_period_bounds(period_start=period_start)
    records = UsageRecord.objects.filter(operator=operator, start_at__lt=end_at)
    rows = (
        RatedSegment.objects.filter(
            usage_record_id__in=Subquery(records.values("pk")), start_at__gte=start_at, start_at__lt=end_at
        )
        .annotate(day=TruncDate("start_at", tzinfo=billing_zone()))
        .order_by()
        .values("day", "band")
        .annotate(s_card_seconds=Sum("card_seconds"), s_gross=Sum("gross"), s_commission=Sum("commission"))
    )
    payable: dict[date, dict[str, Decimal]] = defaultdict(dict)
    hours: dict[date, dict[str, Decimal]] = defaultdict(dict)
    for row in rows:
        day = row["day"] if isinstance(row["day"], date) else date.fromisoformat(str(row["day"]))
        payable[day][row["band"]] = micros_to_fen(int(row["s_gross"]) - int(row["s_commission"]))
        hours[day][row["band"]] = Decimal(int(row["s_card_seconds"])) / _SECONDS_PER_HOUR
    days = []
    day = period_start
    end = billing_period_end(period_start=period_start)
    while day < end:
        days.append(
            DayEarnings(day=day, payable_by_band=payable.get(day, {}), card_hours_by_band=hours.get(day, {}))
        )
        day = date.fromordinal(day.toordinal() + 1)
    return days


# --- Tariffs ----------------------------------------------------------------------------------------


def operator_tariffs(*, organisation: Organisation) -> QuerySet[Tariff]:
    """The presets and ``organisation``'s own tariffs (tariff_list_for), each with every version and its
    bands and windows prefetched: four queries for a page of tariffs."""
    return tariff_list_for(organisation=organisation).prefetch_related(
        Prefetch(
            "versions",
            queryset=TariffVersion.objects.order_by("version").prefetch_related(
                Prefetch("bands", queryset=TariffBand.objects.order_by("-multiplier", "band")),
                Prefetch("windows", queryset=TariffWindow.objects.order_by("start_minute", "id")),
            ),
        )
    )


def tariff_version_in_force(*, versions: Iterable[TariffVersion], at: datetime) -> TariffVersion | None:
    """Of prefetched ``versions``, the one in force at ``at`` (newest effective_from at or before it, the
    higher version on a tie), as metering.selectors.tariffs.tariff_version_current decides, without a
    query."""
    in_force = [v for v in versions if v.effective_from <= at]
    return max(in_force, key=lambda v: (v.effective_from, v.version), default=None)
