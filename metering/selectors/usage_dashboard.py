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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Case,
    Count,
    DateField,
    Expression,
    F,
    Func,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import TruncDate
from django.utils import timezone
from django.utils.translation import gettext as _

from core.charts import band_sort_key
from core.models import Organisation
from core.money import MICROS, from_micros, line_to_fen, lines_total, round_div
from federation.models import Cluster
from metering.models import STANDARD_CLASS, Band, Pack, RatedSegment, UsageRecord
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
    value_micros: int = 0

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)

    @property
    def gross(self) -> Decimal:
        return from_micros(self.gross_micros)

    @property
    def value(self) -> Decimal:
        """What the buyer pays for these card-hours, exact (6 places): prepaid value drawn plus arrears
        at the operator's gross."""
        return from_micros(self.value_micros)

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
            value=Sum("buyer_value"),
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
            value_micros=int(row["value"] or 0),
        )
        for row in rows
    ]
    return sorted(usage, key=lambda u: (u.day, band_sort_key(u.band), u.pack_class))


# --- Spend: statement lines, per cluster ------------------------------------------------------------


@dataclass(frozen=True)
class SpendLine:
    """One line by the rounding rule (core.money): the period's segments of one cluster, band and pack
    class, covered by a pack or not (arrears) — the grouping of an invoice's usage lines. ``spend`` is
    the exact ``buyer_value`` rounded once to the fen; ``list_price`` the operators' gross, likewise."""

    cluster_id: int
    cpi: str
    band: str
    pack_class: str
    arrears: bool
    card_seconds: int
    drawn_micros: int
    gross_micros: int
    value_micros: int

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)

    @property
    def pack_draw(self) -> Decimal:
        """Card-hours drawn, in the unit of ``pack_class`` (for arrears, the chip's card-hours)."""
        return from_micros(self.drawn_micros)

    @property
    def spend(self) -> Decimal:
        return line_to_fen(self.value_micros)

    @property
    def list_price(self) -> Decimal:
        return line_to_fen(self.gross_micros)


# An invoice lists a cluster's bands dearest first (metering.services.billing); so do the lines here.
_INVOICE_BAND_ORDER = {band.value: position for position, band in enumerate(Band)}


def usage_spend_lines(*, buyer: Organisation, period: UsagePeriod) -> list[SpendLine]:
    """The period's segments summed per (cluster, band, pack class, arrears?) in one query, in an
    invoice's order: covered lines before arrears, by CPI, band, class."""
    rows = (
        _scoped(_segments_of(buyer=buyer, starts_at=period.starts_at, ends_at=period.ends_at), period)
        .annotate(
            arrears=Case(
                When(pack__isnull=True, then=Value(True)), default=Value(False), output_field=BooleanField()
            )
        )
        .values("usage_record__cluster_id", "usage_record__cluster__cpi", "band", "pack_class", "arrears")
        .annotate(
            card_seconds=Sum("card_seconds"),
            drawn=Sum("pack_draw"),
            gross=Sum("gross"),
            value=Sum("buyer_value"),
        )
        .order_by()
    )
    lines = [
        SpendLine(
            cluster_id=row["usage_record__cluster_id"],
            cpi=row["usage_record__cluster__cpi"],
            band=row["band"],
            pack_class=row["pack_class"],
            arrears=bool(row["arrears"]),
            card_seconds=int(row["card_seconds"] or 0),
            drawn_micros=int(row["drawn"] or 0),
            gross_micros=int(row["gross"] or 0),
            value_micros=int(row["value"] or 0),
        )
        for row in rows
    ]
    return sorted(
        lines,
        key=lambda line: (line.arrears, line.cpi, _INVOICE_BAND_ORDER.get(line.band, 99), line.pack_class),
    )


@dataclass(frozen=True)
class ClusterUsage:
    cluster_id: int
    cpi: str
    name: str
    hub: str
    chip: str
    chip_name: str
    card_seconds: int
    spend: Decimal  # the sum of the cluster's rounded lines
    list_price: Decimal  # the operators' gross, the sum of the cluster's rounded lines

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)


def usage_by_cluster(
    *, buyer: Organisation, period: UsagePeriod, lines: list[SpendLine] | None = None
) -> list[ClusterUsage]:
    """Card-seconds, spend and list price per cluster in the period, each the sum of the cluster's
    rounded lines (``usage_spend_lines``), biggest spend first."""
    if lines is None:
        lines = usage_spend_lines(buyer=buyer, period=period)
    by_cluster: dict[int, list[SpendLine]] = defaultdict(list)
    for line in lines:
        by_cluster[line.cluster_id].append(line)
    facts = {
        row[0]: row[1:]
        for row in Cluster.objects.filter(pk__in=list(by_cluster)).values_list(
            "id", "cpi", "name", "hub__code", "accelerator__slug", "accelerator__model"
        )
    }
    usage = [
        ClusterUsage(
            cluster_id=cluster_id,
            cpi=facts[cluster_id][0],
            name=facts[cluster_id][1],
            hub=facts[cluster_id][2],
            chip=facts[cluster_id][3],
            chip_name=facts[cluster_id][4],
            card_seconds=sum(line.card_seconds for line in cluster_lines),
            spend=lines_total(line.value_micros for line in cluster_lines),
            list_price=lines_total(line.gross_micros for line in cluster_lines),
        )
        for cluster_id, cluster_lines in by_cluster.items()
    ]
    return sorted(usage, key=lambda u: (-u.spend, -u.card_seconds, u.cpi))


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
        buyer=buyer, start_at__lt=period.ends_at, end_at__gt=period.starts_at
    ).unrated()
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
class ReservedDraw:
    """What a reserved lease (accepted, not started) is expected to draw from one pack, in the pack's
    unit, from ``starts_at``. Provided by the broker (which knows leases) through
    ``reserved_draws_provider_register``: metering never imports the broker."""

    pack_id: int
    class_key: str
    micros: int
    starts_at: datetime


ReservedDrawsProvider = Callable[..., list[ReservedDraw]]
_reserved_draw_providers: list[ReservedDrawsProvider] = []


def reserved_draws_provider_register(provider: ReservedDrawsProvider) -> None:
    """Register ``provider(buyer=, now=) -> list[ReservedDraw]`` (once; the broker does, when it loads)."""
    if provider not in _reserved_draw_providers:
        _reserved_draw_providers.append(provider)


def reserved_draws_for(*, buyer: Organisation, now: datetime) -> list[ReservedDraw]:
    return [draw for provider in _reserved_draw_providers for draw in provider(buyer=buyer, now=now)]


@dataclass(frozen=True)
class PackForecast:
    """One usable pack: what is left, what reserved leases will take of it, when it expires and, at the
    class's current rate, what would be left unused when it expires (None: it is used up before)."""

    pack: Pack
    class_key: str
    remaining_micros: int
    reserved_micros: int
    expires_on: date
    days_left: int
    unused_at_expiry_micros: int | None

    @property
    def remaining(self) -> Decimal:
        return from_micros(self.remaining_micros)

    @property
    def unused_at_expiry(self) -> Decimal | None:
        return None if self.unused_at_expiry_micros is None else from_micros(self.unused_at_expiry_micros)


class Outcome:
    """The one thing the forecast says about a class."""

    RUNS_OUT = "runs_out"  # used up at the current rate (after reserved leases) on ``on``
    RESERVED_EXCEED = "reserved_exceed"  # reserved leases alone need more than is left
    EXPIRES_UNUSED = "expires_unused"  # ``unused`` card-hours expire unused, the last on ``on``
    IDLE = "idle"  # no recent use and nothing reserved: everything left expires unused on ``on``


@dataclass(frozen=True)
class ClassForecast:
    """A class the buyer holds card-hours of, its balance, its reserved and trailing draws and the one
    outcome the forecast states: ``outcome`` on ``outcome_on`` (with ``unused`` card-hours lost for
    EXPIRES_UNUSED / IDLE, and for RUNS_OUT the card-hours of earlier packs that expire on the way)."""

    class_key: str
    label: str
    remaining: Decimal
    packs: int
    next_expiry_at: datetime | None
    drawn_trailing_micros: int
    reserved_micros: int
    outcome: str
    outcome_on: date | None
    outcome_in_days: int | None
    unused_micros: int
    pack_rows: list[PackForecast] = field(default_factory=list)

    @property
    def drawn_trailing(self) -> Decimal:
        return from_micros(self.drawn_trailing_micros)

    @property
    def reserved(self) -> Decimal:
        return from_micros(self.reserved_micros)

    @property
    def unused(self) -> Decimal:
        return from_micros(self.unused_micros)

    @property
    def rate_per_day(self) -> Decimal:
        return from_micros(round_div(self.drawn_trailing_micros, FORECAST_TRAILING_DAYS))

    @property
    def recent_use(self) -> bool:
        return self.drawn_trailing_micros > 0

    @property
    def runs_out_on(self) -> date | None:
        return self.outcome_on if self.outcome == Outcome.RUNS_OUT else None


def _simulate(
    packs: Sequence[tuple[Pack, int]], *, drawn: int, now: datetime
) -> tuple[datetime | None, bool, dict[int, int | None]]:
    """Draw ``packs`` (what is left of each once reserved leases are set aside, in consumption order:
    earliest expiry first) at ``drawn`` micro-card-hours per trailing window from ``now``. Return the
    instant the draw stops — the last pack used up, or the last expiry — whether it stopped because the
    card-hours ran out (True) or expired (False), and, per pack, what would be left when it expires
    (None: used up first)."""
    window = FORECAST_TRAILING_DAYS * 86400
    unused: dict[int, int | None] = {}
    t = now
    ran_out = True
    for pack, remaining in packs:
        if remaining <= 0:
            unused[pack.pk] = None
            continue
        if drawn <= 0 or pack.expires_at <= t:
            unused[pack.pk] = remaining
            t = max(t, pack.expires_at)
            ran_out = False
            continue
        # Whole seconds, rounded down: ``remaining`` at ``drawn`` per ``window`` seconds.
        finish = t + timedelta(seconds=remaining * window // drawn)
        if finish > pack.expires_at:
            elapsed = (pack.expires_at - t) // timedelta(seconds=1)
            unused[pack.pk] = remaining - elapsed * drawn // window
            t = pack.expires_at
            ran_out = False
        else:
            unused[pack.pk] = None
            t = finish
            ran_out = True
    return (t if packs else None), ran_out, unused


def class_label(class_key: str, *, names: dict[str, str]) -> str:
    if class_key == STANDARD_CLASS:
        return _("Standard cards")
    return names.get(class_key, class_key)


def usage_forecast_for(
    *, buyer: Organisation, now: datetime | None = None, chip_names: dict[str, str] | None = None
) -> list[ClassForecast]:
    """Per class with a balance: what is left (buyer_balance_summary, from the packs' ledger accounts),
    the usable packs in the order rating draws them, and one outcome. Reserved leases' expected draws
    (``reserved_draws_for``) are taken from their packs first; the rest is drawn at the trailing rate
    (pack card-hours drawn over the last 7 days ÷ 7 per day), earliest expiry first, packs expiring on
    the way taken into account. The outcome is RESERVED_EXCEED when reserved leases need more than is
    left, RUNS_OUT when the last pack is used up before it expires, EXPIRES_UNUSED when it expires first
    (with the card-hours lost), IDLE with no use and nothing reserved."""
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
    reserved_by_pack: dict[int, int] = defaultdict(int)
    reserved_by_class: dict[str, int] = defaultdict(int)
    for draw in reserved_draws_for(buyer=buyer, now=now):
        reserved_by_pack[draw.pack_id] += draw.micros
        reserved_by_class[draw.class_key] += draw.micros
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
        reserved = reserved_by_class.get(balance.class_key, 0)
        free = [
            (pack, max(remaining - reserved_by_pack.get(pack.pk, 0), 0)) for pack, remaining in class_packs
        ]
        stop_at, ran_out, unused = _simulate(free, drawn=drawn, now=now)
        lost = sum(value for value in unused.values() if value)
        if reserved and not any(remaining for _, remaining in free):
            outcome, on = Outcome.RESERVED_EXCEED, None
        elif drawn > 0 and ran_out:
            outcome, on = Outcome.RUNS_OUT, stop_at.astimezone(zone).date() if stop_at else None
        elif drawn > 0 or reserved:
            outcome, on = Outcome.EXPIRES_UNUSED, stop_at.astimezone(zone).date() if stop_at else None
        else:
            outcome, on = Outcome.IDLE, stop_at.astimezone(zone).date() if stop_at else None
        forecasts.append(
            ClassForecast(
                class_key=balance.class_key,
                label=class_label(balance.class_key, names=names),
                remaining=balance.remaining_card_hours,
                packs=balance.packs,
                next_expiry_at=balance.next_expiry_at,
                drawn_trailing_micros=drawn,
                reserved_micros=reserved,
                outcome=outcome,
                outcome_on=on,
                outcome_in_days=(on - today).days if on is not None else None,
                unused_micros=lost,
                pack_rows=[
                    PackForecast(
                        pack=pack,
                        class_key=balance.class_key,
                        remaining_micros=remaining,
                        reserved_micros=reserved_by_pack.get(pack.pk, 0),
                        expires_on=pack.expires_at.astimezone(zone).date(),
                        days_left=(pack.expires_at.astimezone(zone).date() - today).days,
                        unused_at_expiry_micros=unused.get(pack.pk),
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
    value_micros: int

    @property
    def spend(self) -> Decimal:
        """The day's spend, rounded once to the fen (a day is not a statement line: the days of a month
        may add up to a fen or two off the month's total, which is the sum of its lines)."""
        return line_to_fen(self.value_micros)

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
    lines: list[SpendLine]
    card_seconds: int
    drawn_by_class: list[ClassAmount]
    arrears_by_class: list[ClassAmount]
    unrated: UnratedUsage

    @property
    def card_hours(self) -> Decimal:
        return card_hours_of(self.card_seconds)

    @property
    def spend(self) -> Decimal:
        """What the buyer pays for the period's usage: the sum of its rounded lines (core.money)."""
        return lines_total(line.value_micros for line in self.lines)

    @property
    def spend_from_packs(self) -> Decimal:
        return lines_total(line.value_micros for line in self.lines if not line.arrears)

    @property
    def amount_due(self) -> Decimal:
        """Usage no pack covered, at the operators' gross: what the buyer owes."""
        return lines_total(line.value_micros for line in self.lines if line.arrears)

    @property
    def list_price(self) -> Decimal:
        """The same usage at the operators' list prices (gross), the sum of its rounded lines."""
        return lines_total(line.gross_micros for line in self.lines)


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
    """The period's figures: per day × band × class sums, the days' bars, the spend lines and spend per
    cluster (core.money's rounding rule), totals, pack draws and arrears per class, and unrated usage. A
    fixed number of queries, whatever the number of records."""
    rows = usage_by_day_band(buyer=buyer, period=period)
    names = chip_names or {}
    per_day: dict[date, dict[str, int]] = {day: {} for day in period.days}
    value_per_day: dict[date, int] = defaultdict(int)
    for row in rows:
        bands = per_day.setdefault(row.day, {})
        bands[row.band] = bands.get(row.band, 0) + row.card_seconds
        value_per_day[row.day] += row.value_micros
    lines = usage_spend_lines(buyer=buyer, period=period)
    return UsageDashboard(
        period=period,
        rows=rows,
        days=[
            DayBar(day=day, card_seconds_by_band=per_day[day], value_micros=value_per_day[day])
            for day in sorted(per_day)
        ],
        bands=sorted({row.band for row in rows}, key=band_sort_key),
        clusters=usage_by_cluster(buyer=buyer, period=period, lines=lines),
        lines=lines,
        card_seconds=sum(row.card_seconds for row in rows),
        drawn_by_class=_by_class(rows, "drawn_micros", names),
        arrears_by_class=_by_class(rows, "arrears_micros", names),
        unrated=usage_unrated_for(buyer=buyer, period=period),
    )
