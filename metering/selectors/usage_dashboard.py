"""Reads for a buyer's usage and spend dashboard: card-hours per local day and band, spend per cluster,
pack balances with their expiry, a run-out forecast, and what is reported but not rated yet.

Every figure comes from the rated segments (what rating posted to the ledger) or from the packs' ledger
accounts, aggregated in SQL: the number of queries does not depend on how many records a buyer holds.
Amounts stay integer micro-units (core.money) until they are turned into Decimals here, so the dashboard,
its CSV and the ledger agree to the micro-unit.

Days are local days in ``CARDHOUR_BILLING_TIME_ZONE`` (Asia/Shanghai), the zone invoices use. Rating cuts
every segment at the local midnight of its tariff's zone, so a segment lies inside one local day and is
bucketed by its start; a tariff kept in another zone would put a segment crossing Shanghai's midnight on
the day it starts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection
from django.db.models import (
    BigIntegerField,
    Count,
    DateField,
    Expression,
    F,
    Func,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.functions import TruncDate
from django.utils import timezone
from django.utils.translation import gettext as _

from core.charts import band_sort_key
from core.models import Organisation
from core.money import MICROS, from_micros, round_div
from federation.models import Cluster
from metering.models import STANDARD_CLASS, Pack, RatedSegment, UsageRecord
from metering.selectors.payments import buyer_balance_summary, pack_list_for

SECONDS_PER_HOUR = 3600
# The forecast's draw rate: pack card-hours drawn over this many trailing days, per day.
FORECAST_TRAILING_DAYS = 7
DEFAULT_PERIOD_DAYS = 30


def dashboard_zone() -> ZoneInfo:
    return ZoneInfo(settings.CARDHOUR_BILLING_TIME_ZONE)


def card_hours_of(card_seconds: int) -> Decimal:
    """Card-seconds as card-hours to the micro-card-hour (6 places, half-even): exact whenever the
    seconds are a multiple of 0.0036 s, which whole seconds of whole cards always are to 6 places."""
    return from_micros(round_div(card_seconds * MICROS, SECONDS_PER_HOUR))


def local_today(*, now: datetime | None = None) -> date:
    return (now or timezone.now()).astimezone(dashboard_zone()).date()


@dataclass(frozen=True)
class UsagePeriod:
    """The local days ``start_date``–``end_date`` (both included), optionally one chip and one cluster."""

    start_date: date
    end_date: date
    chip: str = ""
    cluster_id: int | None = None

    @classmethod
    def default(cls, *, now: datetime | None = None) -> UsagePeriod:
        """The last 30 local days, today included."""
        today = local_today(now=now)
        return cls(start_date=today - timedelta(days=DEFAULT_PERIOD_DAYS - 1), end_date=today)

    @property
    def starts_at(self) -> datetime:
        return datetime.combine(self.start_date, time(0), tzinfo=dashboard_zone())

    @property
    def ends_at(self) -> datetime:
        """The first instant after the period (the next local midnight)."""
        return datetime.combine(self.end_date + timedelta(days=1), time(0), tzinfo=dashboard_zone())

    @property
    def days(self) -> list[date]:
        return [
            self.start_date + timedelta(days=i) for i in range((self.end_date - self.start_date).days + 1)
        ]


def _segments_of(*, buyer: Organisation, starts_at: datetime, ends_at: datetime) -> QuerySet[RatedSegment]:
    """The buyer's segments starting in ``[starts_at, ends_at)``. The conditions on the usage record are
    implied by the segment's (a segment lies inside its record) and let the database walk the
    (buyer, start_at) index of usage records instead of every segment."""
    return RatedSegment.objects.filter(
        usage_record__buyer=buyer,
        usage_record__start_at__lt=ends_at,
        usage_record__end_at__gt=starts_at,
        start_at__gte=starts_at,
        start_at__lt=ends_at,
    )


def _scoped(segments: QuerySet[RatedSegment], period: UsagePeriod) -> QuerySet[RatedSegment]:
    if period.chip:
        segments = segments.filter(usage_record__cluster__accelerator__slug=period.chip)
    if period.cluster_id is not None:
        segments = segments.filter(usage_record__cluster_id=period.cluster_id)
    return segments


# --- The buyer's clusters (filter choices, names) ---------------------------------------------------


@dataclass(frozen=True)
class UsedCluster:
    id: int
    cpi: str
    name: str
    hub: str
    chip: str
    chip_name: str


def usage_clusters_for(*, buyer: Organisation) -> list[UsedCluster]:
    """The clusters the buyer has usage on (any time), by CPI: the choices of the dashboard's filter."""
    clusters = (
        Cluster.objects.filter(pk__in=UsageRecord.objects.filter(buyer=buyer).values("cluster_id"))
        .order_by("cpi")
        .values_list("id", "cpi", "name", "hub__code", "accelerator__slug", "accelerator__model")
    )
    return [UsedCluster(*row) for row in clusters]


# --- Card-hours per day and band ---------------------------------------------------------------------


@dataclass(frozen=True)
class DayBandUsage:
    """What the buyer used on one local day in one band, drawn from one class (a chip's slug or ``std``;
    for usage no pack covered, the chip's slug, with the uncovered card-hours in ``arrears_micros``)."""

    day: date
    band: str
    pack_class: str
    card_seconds: int
    gross_micros: int
    drawn_micros: int
    arrears_micros: int

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)

    @property
    def gross(self) -> Decimal:
        return from_micros(self.gross_micros)

    @property
    def pack_draw(self) -> Decimal:
        return from_micros(self.drawn_micros)

    @property
    def arrears(self) -> Decimal:
        return from_micros(self.arrears_micros)


def _local_day_of_start(period: UsagePeriod) -> Any:
    """The local date of a segment's ``start_at``, as SQL.

    TruncDate converts the zone natively on PostgreSQL; on SQLite it calls a Python function per row,
    which alone would spend ~150 ms on 10,000 records. So on SQLite, when the zone keeps one UTC offset
    over the whole period (Asia/Shanghai always does; a zone with daylight saving has one offset
    between its transitions, and a change shows between two consecutive local midnights), the date is
    SQLite's own ``date(start_at, '+28800 seconds')`` on the UTC text it stores.
    """
    zone = dashboard_zone()
    if connection.vendor == "sqlite":
        offsets = {
            datetime.combine(period.start_date + timedelta(days=i), time(0), tzinfo=zone).utcoffset()
            for i in range((period.end_date - period.start_date).days + 2)
        }
        if len(offsets) == 1:
            (offset,) = offsets
            assert offset is not None
            seconds = int(offset.total_seconds())
            return Func(
                F("start_at"), Value(f"{seconds:+d} seconds"), function="date", output_field=DateField()
            )
    return TruncDate("start_at", tzinfo=zone)


def usage_by_day_band(*, buyer: Organisation, period: UsagePeriod) -> list[DayBandUsage]:
    """Sums of the buyer's rated segments per local day, band and pack class, in one query, ordered by
    day, then band (cheapest first), then class."""
    rows = (
        _scoped(_segments_of(buyer=buyer, starts_at=period.starts_at, ends_at=period.ends_at), period)
        .annotate(day=_local_day_of_start(period))
        .values("day", "band", "pack_class")
        .annotate(
            card_seconds=Sum("card_seconds"),
            gross=Sum("gross"),
            drawn=Sum("pack_draw", filter=Q(pack__isnull=False)),
            arrears=Sum("pack_draw", filter=Q(pack__isnull=True)),
        )
        .order_by()
    )
    usage = [
        DayBandUsage(
            day=row["day"],
            band=row["band"],
            pack_class=row["pack_class"],
            card_seconds=int(row["card_seconds"] or 0),
            gross_micros=int(row["gross"] or 0),
            drawn_micros=int(row["drawn"] or 0),
            arrears_micros=int(row["arrears"] or 0),
        )
        for row in rows
    ]
    return sorted(usage, key=lambda u: (u.day, band_sort_key(u.band), u.pack_class))


# --- Spend per cluster -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterUsage:
    cluster_id: int
    cpi: str
    name: str
    hub: str
    chip: str
    chip_name: str
    card_seconds: int
    gross_micros: int

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)

    @property
    def gross(self) -> Decimal:
        return from_micros(self.gross_micros)


def usage_by_cluster(*, buyer: Organisation, period: UsagePeriod) -> list[ClusterUsage]:
    """Card-seconds and gross spend per cluster in the period, in one query, biggest spend first."""
    prefix = "usage_record__cluster__"
    rows = (
        _scoped(_segments_of(buyer=buyer, starts_at=period.starts_at, ends_at=period.ends_at), period)
        .values(
            "usage_record__cluster_id",
            f"{prefix}cpi",
            f"{prefix}name",
            f"{prefix}hub__code",
            f"{prefix}accelerator__slug",
            f"{prefix}accelerator__model",
        )
        .annotate(card_seconds=Sum("card_seconds"), gross=Sum("gross"))
        .order_by()
    )
    usage = [
        ClusterUsage(
            cluster_id=row["usage_record__cluster_id"],
            cpi=row[f"{prefix}cpi"],
            name=row[f"{prefix}name"],
            hub=row[f"{prefix}hub__code"],
            chip=row[f"{prefix}accelerator__slug"],
            chip_name=row[f"{prefix}accelerator__model"],
            card_seconds=int(row["card_seconds"] or 0),
            gross_micros=int(row["gross"] or 0),
        )
        for row in rows
    ]
    return sorted(usage, key=lambda u: (-u.gross_micros, -u.card_seconds, u.cpi))


# --- Reported, not rated yet -------------------------------------------------------------------------


class _RecordCardSeconds(Expression):
    """A usage record's ``cards`` × whole seconds of ``[start_at, end_at)``, as an integer per row (so
    the sum is exact). Django cannot multiply a duration by a column on SQLite, hence the SQL per vendor."""

    def __init__(self) -> None:
        super().__init__(output_field=BigIntegerField())
        self.columns: list[Any] = [F("cards"), F("start_at"), F("end_at")]

    def get_source_expressions(self) -> list[Any]:
        return self.columns

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.columns = list(exprs)

    def _render(self, compiler: Any, connection: Any, template: str) -> tuple[str, tuple[Any, ...]]:
        parts: list[str] = []
        params: list[Any] = []
        for expression in self.columns:
            sql, expression_params = compiler.compile(expression)
            parts.append(sql)
            params.extend(expression_params)
        return template.format(*parts), tuple(params)

    def as_sql(self, compiler: Any, connection: Any, **extra_context: Any) -> tuple[str, tuple[Any, ...]]:
        return self._render(compiler, connection, "({0} * CAST(EXTRACT(EPOCH FROM ({2} - {1})) AS bigint))")

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> tuple[str, tuple[Any, ...]]:
        # SQLite keeps datetimes as UTC text; strftime('%s') reads them as whole epoch seconds.
        return self._render(
            compiler,
            connection,
            "({0} * (CAST(strftime('%%s', {2}) AS INTEGER) - CAST(strftime('%%s', {1}) AS INTEGER)))",
        )


@dataclass(frozen=True)
class UnratedUsage:
    records: int
    card_seconds: int

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)


def usage_unrated_for(*, buyer: Organisation, period: UsagePeriod) -> UnratedUsage:
    """The buyer's usage records overlapping the period that rating has not priced yet (it runs every
    minute), with their card-seconds, in one query."""
    records = UsageRecord.objects.filter(
        buyer=buyer, rated_at__isnull=True, start_at__lt=period.ends_at, end_at__gt=period.starts_at
    )
    if period.chip:
        records = records.filter(cluster__accelerator__slug=period.chip)
    if period.cluster_id is not None:
        records = records.filter(cluster_id=period.cluster_id)
    totals = records.aggregate(records=Count("id"), card_seconds=Sum(_RecordCardSeconds()))
    return UnratedUsage(records=totals["records"], card_seconds=int(totals["card_seconds"] or 0))


# --- Packs, balances and the run-out forecast -------------------------------------------------------


def pack_draws_trailing(*, buyer: Organisation, now: datetime) -> dict[str, int]:
    """Micro-card-hours drawn from the buyer's packs per class by usage in the trailing
    ``FORECAST_TRAILING_DAYS`` days before ``now`` (by when the usage happened), in one query."""
    since = now - timedelta(days=FORECAST_TRAILING_DAYS)
    rows = (
        _segments_of(buyer=buyer, starts_at=since, ends_at=now)
        .filter(pack__isnull=False)
        .values("pack_class")
        .annotate(drawn=Sum("pack_draw"))
        .order_by()
    )
    return {row["pack_class"]: int(row["drawn"] or 0) for row in rows}


@dataclass(frozen=True)
class PackForecast:
    """One usable pack: what is left, when it expires and, at the class's current rate, what would be
    left unused when it expires (None: it is used up before)."""

    pack: Pack
    class_key: str
    remaining_micros: int
    expires_on: date
    days_left: int
    unused_at_expiry_micros: int | None

    @property
    def remaining(self) -> Decimal:
        return from_micros(self.remaining_micros)

    @property
    def unused_at_expiry(self) -> Decimal | None:
        return None if self.unused_at_expiry_micros is None else from_micros(self.unused_at_expiry_micros)


@dataclass(frozen=True)
class ClassForecast:
    """A class the buyer holds card-hours of, its balance, its trailing draw and when it runs out."""

    class_key: str
    label: str
    remaining: Decimal
    packs: int
    next_expiry_at: datetime | None
    drawn_trailing_micros: int
    runs_out_at: datetime | None
    runs_out_on: date | None
    runs_out_in_days: int | None
    pack_rows: list[PackForecast] = field(default_factory=list)

    @property
    def drawn_trailing(self) -> Decimal:
        return from_micros(self.drawn_trailing_micros)

    @property
    def rate_per_day(self) -> Decimal:
        return from_micros(round_div(self.drawn_trailing_micros, FORECAST_TRAILING_DAYS))

    @property
    def recent_use(self) -> bool:
        return self.drawn_trailing_micros > 0

    @property
    def expiring_unused(self) -> list[PackForecast]:
        return [p for p in self.pack_rows if p.unused_at_expiry_micros]


def _simulate(
    packs: Sequence[tuple[Pack, int]], *, drawn: int, now: datetime
) -> tuple[datetime | None, dict[int, int | None]]:
    """Draw ``packs`` (in consumption order: earliest expiry first) at ``drawn`` micro-card-hours per
    trailing window from ``now``. Return when the last is used up (None with no recent use) and, per
    pack, what would be left when it expires (None: used up first)."""
    window = FORECAST_TRAILING_DAYS * 86400
    unused: dict[int, int | None] = {}
    if drawn <= 0:
        return None, {pack.pk: remaining for pack, remaining in packs}
    t = now
    for pack, remaining in packs:
        if pack.expires_at <= t:
            unused[pack.pk] = remaining
            continue
        # Whole seconds, rounded down: ``remaining`` at ``drawn`` per ``window`` seconds.
        finish = t + timedelta(seconds=remaining * window // drawn)
        if finish > pack.expires_at:
            elapsed = (pack.expires_at - t) // timedelta(seconds=1)
            unused[pack.pk] = remaining - elapsed * drawn // window
            t = pack.expires_at
        else:
            unused[pack.pk] = None
            t = finish
    return t, unused


def class_label(class_key: str, *, names: dict[str, str]) -> str:
    if class_key == STANDARD_CLASS:
        return _("Standard cards")
    return names.get(class_key, class_key)


def usage_forecast_for(
    *, buyer: Organisation, now: datetime | None = None, chip_names: dict[str, str] | None = None
) -> list[ClassForecast]:
    """Per class with a balance: what is left (buyer_balance_summary, from the packs' ledger accounts),
    the usable packs in the order rating draws them, and the run-out date at the trailing draw rate
    (pack card-hours drawn over the last 7 days ÷ 7 per day), packs expiring on the way taken into
    account. Three queries."""
    now = now or timezone.now()
    zone = dashboard_zone()
    today = now.astimezone(zone).date()
    balances = buyer_balance_summary(buyer=buyer, at=now)
    packs = list(
        pack_list_for(buyer=buyer, status=Pack.Status.ACTIVE)
        .select_related("accelerator")
        .filter(starts_at__lte=now, expires_at__gt=now)
    )
    draws = pack_draws_trailing(buyer=buyer, now=now)
    names = dict(chip_names or {})
    by_class: dict[str, list[tuple[Pack, int]]] = defaultdict(list)
    for pack in packs:
        if pack.accelerator is not None:
            names.setdefault(pack.accelerator.slug, pack.accelerator.model)
        remaining = int(pack.remaining_micros)  # type: ignore[attr-defined]
        if remaining > 0:
            by_class[pack.class_key].append((pack, remaining))

    forecasts = []
    for balance in balances:
        if balance.remaining_card_hours <= 0:
            continue
        class_packs = by_class.get(balance.class_key, [])
        drawn = draws.get(balance.class_key, 0)
        runs_out_at, unused = _simulate(class_packs, drawn=drawn, now=now)
        runs_out_on = runs_out_at.astimezone(zone).date() if runs_out_at is not None else None
        forecasts.append(
            ClassForecast(
                class_key=balance.class_key,
                label=class_label(balance.class_key, names=names),
                remaining=balance.remaining_card_hours,
                packs=balance.packs,
                next_expiry_at=balance.next_expiry_at,
                drawn_trailing_micros=drawn,
                runs_out_at=runs_out_at,
                runs_out_on=runs_out_on,
                runs_out_in_days=(runs_out_on - today).days if runs_out_on is not None else None,
                pack_rows=[
                    PackForecast(
                        pack=pack,
                        class_key=balance.class_key,
                        remaining_micros=remaining,
                        expires_on=pack.expires_at.astimezone(zone).date(),
                        days_left=(pack.expires_at.astimezone(zone).date() - today).days,
                        unused_at_expiry_micros=unused.get(pack.pk) if drawn > 0 else None,
                    )
                    for pack, remaining in class_packs
                ],
            )
        )
    return forecasts


# --- The whole dashboard -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DayBar:
    day: date
    card_seconds_by_band: dict[str, int]
    gross_micros: int

    @property
    def gross(self) -> Decimal:
        return from_micros(self.gross_micros)

    @property
    def card_hours_by_band(self) -> dict[str, Decimal]:
        return {band: card_hours_of(s) for band, s in self.card_seconds_by_band.items()}

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(sum(self.card_seconds_by_band.values()))


@dataclass(frozen=True)
class ClassAmount:
    class_key: str
    label: str
    micros: int

    @property
    def card_hours(self) -> Decimal:
        return from_micros(self.micros)


@dataclass(frozen=True)
class UsageDashboard:
    period: UsagePeriod
    rows: list[DayBandUsage]
    days: list[DayBar]
    bands: list[str]
    clusters: list[ClusterUsage]
    card_seconds: int
    gross_micros: int
    drawn_by_class: list[ClassAmount]
    arrears_by_class: list[ClassAmount]
    unrated: UnratedUsage

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)

    @property
    def gross(self) -> Decimal:
        return from_micros(self.gross_micros)


def _by_class(rows: Iterable[DayBandUsage], attr: str, names: dict[str, str]) -> list[ClassAmount]:
    sums: dict[str, int] = defaultdict(int)
    for row in rows:
        sums[row.pack_class] += getattr(row, attr)
    return [
        ClassAmount(class_key=key, label=class_label(key, names=names), micros=micros)
        for key, micros in sorted(sums.items(), key=lambda kv: (kv[0] != STANDARD_CLASS, kv[0]))
        if micros
    ]


def usage_dashboard_for(
    *, buyer: Organisation, period: UsagePeriod, chip_names: dict[str, str] | None = None
) -> UsageDashboard:
    """The period's figures: per day × band × class sums, the days' bars, spend per cluster, totals, pack
    draws and arrears per class, and unrated usage. Three queries, whatever the number of records."""
    rows = usage_by_day_band(buyer=buyer, period=period)
    names = chip_names or {}
    per_day: dict[date, dict[str, int]] = {day: {} for day in period.days}
    gross_per_day: dict[date, int] = defaultdict(int)
    for row in rows:
        bands = per_day.setdefault(row.day, {})
        bands[row.band] = bands.get(row.band, 0) + row.card_seconds
        gross_per_day[row.day] += row.gross_micros
    return UsageDashboard(
        period=period,
        rows=rows,
        days=[
            DayBar(day=day, card_seconds_by_band=per_day[day], gross_micros=gross_per_day[day])
            for day in sorted(per_day)
        ],
        bands=sorted({row.band for row in rows}, key=band_sort_key),
        clusters=usage_by_cluster(buyer=buyer, period=period),
        card_seconds=sum(row.card_seconds for row in rows),
        gross_micros=sum(row.gross_micros for row in rows),
        drawn_by_class=_by_class(rows, "drawn_micros", names),
        arrears_by_class=_by_class(rows, "arrears_micros", names),
        unrated=usage_unrated_for(buyer=buyer, period=period),
    )
