"""Reads for the buyers' marketplace and the staff dashboard, and the buyer's home hub.

Everything here is set-based: a page of the marketplace is one query for its clusters (free cards now,
the price card in force and the latency from the buyer's home hub are SQL subqueries, so filtering,
sorting and pagination happen in the database over any number of clusters), one for their price cards,
and one grouped query for the summaries. No read issues a query per row.

"Cards held now" follows the capacity calendar (broker.models): the cards of the *active* capacity holds
whose ``[start_at, end_at)`` contains the instant. "Withheld" are the cards the operator's last heartbeat
keeps from sale while it binds (federation.selectors: healthy cards not reported available; Cardhour's own
leases count as available, so they are not withheld twice). Free cards of an island are its cards minus its
unhealthy cards minus withheld minus held, never below zero — the matcher's and acceptance's rule for a
start now; a cluster's free cards are the sum over its islands.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal
from zoneinfo import ZoneInfo

import numpy as np
from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.core.paginator import Page, Paginator
from django.db.models import (
    Case,
    Count,
    DecimalField,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, TruncDate
from django.db.models.lookups import GreaterThan
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from broker.models import BuyerPreference, CapacityHold, Job
from core.charts import band_sort_key, band_strip_svg
from core.models import Organisation
from core.money import from_micros
from federation.models import (
    Accelerator,
    Cluster,
    ClusterStatus,
    ClusterStatusChange,
    Hub,
    HubLatency,
    Island,
)
from federation.selectors import heartbeat_report_ttl
from metering.models import PriceCard, RatedSegment, ReconciliationRun
from metering.selectors.tariffs import compiled_tariff
from metering.tariffs import MULTIPLIER_PLACES

# Where latency is measured from when a buyer has neither a preference nor a job yet: the Yangtze River
# Delta, where most demand sits.
DEFAULT_HOME_HUB = "yrd"

# Clusters a buyer can place work on now, and those the marketplace shows when asked to include offline
# ones. Retired clusters are never listed.
PLACEABLE_STATUSES = (ClusterStatus.ACTIVE,)
LISTED_STATUSES = (ClusterStatus.ACTIVE, ClusterStatus.DRAINING, ClusterStatus.OFFLINE)
# Cards that count as sellable for utilisation: clusters running or finishing work.
SELLABLE_STATUSES = (ClusterStatus.ACTIVE, ClusterStatus.DRAINING)

MarketSort = Literal["price", "free", "latency", "hub", "reliability"]
MARKET_SORTS: tuple[MarketSort, ...] = ("price", "free", "latency", "hub", "reliability")
HomeHubSource = Literal["preference", "latest_job", "default"]


# --- The buyer's home hub ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HomeHub:
    """Where a buyer's latency is measured from, and why that hub: the buyer's stored preference, the
    origin of its latest job, or the platform default."""

    code: str
    source: HomeHubSource


def buyer_home_hub(*, buyer: Organisation) -> str | None:
    """The code of ``buyer``'s home hub: its stored preference, else the origin hub of its latest job,
    else None (no preference and no job yet). One or two queries."""
    code = BuyerPreference.objects.filter(buyer=buyer).values_list("home_hub__code", flat=True).first()
    if code is not None:
        return code
    return (
        Job.objects.filter(buyer=buyer)
        .order_by("-created_at", "-id")
        .values_list("origin_hub__code", flat=True)
        .first()
    )


def buyer_home_hub_resolve(*, buyer: Organisation) -> HomeHub:
    """``buyer``'s home hub with where it comes from; the platform default when it has none."""
    code = BuyerPreference.objects.filter(buyer=buyer).values_list("home_hub__code", flat=True).first()
    if code is not None:
        return HomeHub(code=code, source="preference")
    code = buyer_home_hub(buyer=buyer)
    if code is not None:
        return HomeHub(code=code, source="latest_job")
    return HomeHub(code=DEFAULT_HOME_HUB, source="default")


# --- Shared capacity expressions ---------------------------------------------------------------------


def _held_now(at: datetime, island_ref: str = "pk") -> Coalesce:
    """Per island row: the cards its active holds occupy at ``at`` (0 when none)."""
    holds = (
        CapacityHold.objects.filter(
            island_id=OuterRef(island_ref), active=True, start_at__lte=at, end_at__gt=at
        )
        .order_by()
        .values("island_id")
        .annotate(total=Sum("cards"))
        .values("total")
    )
    return Coalesce(Subquery(holds, output_field=IntegerField()), Value(0), output_field=IntegerField())


def _island_withheld(at: datetime) -> Case:
    """Per island row of a cluster subquery: the cards its operator's heartbeat keeps from sale at ``at``
    (0 once the report has expired, or when the cluster never beat)."""
    return Case(
        When(
            GreaterThan(OuterRef("last_heartbeat_at"), Value(at - heartbeat_report_ttl())),
            then=Greatest(
                F("cards") - F("unhealthy_cards") - F("available_cards"),
                Value(0),
                output_field=IntegerField(),
            ),
        ),
        default=Value(0),
        output_field=IntegerField(),
    )


def _cluster_sum(at: datetime, what: Literal["free", "held", "unhealthy", "withheld"]) -> Coalesce:
    """Per cluster row: the sum over its islands of free, held, unhealthy or withheld cards at ``at``."""
    islands = Island.objects.filter(cluster_id=OuterRef("pk")).order_by().annotate(held=_held_now(at))
    value: Any
    if what == "free":
        value = Greatest(
            F("cards") - F("unhealthy_cards") - _island_withheld(at) - F("held"),
            Value(0),
            output_field=IntegerField(),
        )
    elif what == "withheld":
        value = _island_withheld(at)
    elif what == "held":
        value = F("held")
    else:
        value = F("unhealthy_cards")
    total = islands.annotate(value=value).values("cluster_id").annotate(total=Sum("value")).values("total")
    return Coalesce(Subquery(total, output_field=IntegerField()), Value(0), output_field=IntegerField())


# --- Marketplace -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarketQuery:
    """What the buyer asked the marketplace for (every field optional)."""

    hub: str = ""
    chip: str = ""
    operator: str = ""
    min_free_cards: int | None = None
    max_price: Decimal | None = None
    min_reliability: Decimal | None = None
    include_offline: bool = False
    sort: MarketSort = "price"


def market_clusters(*, query: MarketQuery, origin_hub: str, at: datetime) -> QuerySet[Cluster]:
    """The marketplace's clusters, filtered and sorted in SQL, each annotated with ``free_cards``,
    ``held_cards``, ``unhealthy`` and ``withheld_cards`` (now: see the module docstring), ``market_price_card_id`` and ``rate_per_card_hour`` (the
    price card in force at ``at``: the newest effective_from at or before it, the newer version on a
    tie — metering's rule), ``latency_ms`` (from ``origin_hub``; NULL where no latency is known) and
    ``reliability_score`` (the stored reliability score, or the platform's prior for a cluster without
    one: broker.services.reliability). The stored score row is joined (``select_related``), not queried
    per cluster.

    Retired clusters are never listed; offline and draining ones only with ``include_offline``.
    """
    in_force = PriceCard.objects.filter(cluster_id=OuterRef("pk"), effective_from__lte=at).order_by(
        "-effective_from", "-version"
    )
    latency = (
        HubLatency.objects.filter(source__code=origin_hub, target_id=OuterRef("hub_id"))
        .order_by()
        .values("latency_ms")[:1]
    )
    statuses = LISTED_STATUSES if query.include_offline else PLACEABLE_STATUSES
    clusters = (
        Cluster.objects.filter(status__in=statuses)
        .select_related("operator", "hub", "accelerator", "reliability")
        .annotate(
            reliability_score=Coalesce(
                F("reliability__reliability_percent"),
                Value(Decimal(settings.CARDHOUR_RELIABILITY_PRIOR_PERCENT)),
                output_field=DecimalField(max_digits=6, decimal_places=3),
            ),
            free_cards=_cluster_sum(at, "free"),
            held_cards=_cluster_sum(at, "held"),
            unhealthy=_cluster_sum(at, "unhealthy"),
            withheld_cards=_cluster_sum(at, "withheld"),
            market_price_card_id=Subquery(in_force.values("pk")[:1]),
            rate_per_card_hour=Subquery(
                in_force.values("rate_per_card_hour")[:1],
                output_field=DecimalField(max_digits=12, decimal_places=4),
            ),
            latency_ms=Subquery(latency, output_field=DecimalField(max_digits=8, decimal_places=3)),
        )
    )
    if query.hub:
        clusters = clusters.filter(hub__code=query.hub)
    if query.chip:
        clusters = clusters.filter(accelerator__slug=query.chip)
    if query.operator:
        clusters = clusters.filter(operator__slug=query.operator)
    if query.min_free_cards is not None:
        clusters = clusters.filter(free_cards__gte=query.min_free_cards)
    if query.max_price is not None:
        clusters = clusters.filter(rate_per_card_hour__lte=query.max_price)
    if query.min_reliability is not None:
        clusters = clusters.filter(reliability_score__gte=query.min_reliability)
    order: list[Any]
    if query.sort == "free":
        order = [F("free_cards").desc(), F("rate_per_card_hour").asc(nulls_last=True)]
    elif query.sort == "latency":
        order = [F("latency_ms").asc(nulls_last=True), F("rate_per_card_hour").asc(nulls_last=True)]
    elif query.sort == "reliability":
        order = [F("reliability_score").desc(), F("rate_per_card_hour").asc(nulls_last=True)]
    elif query.sort == "hub":
        order = ["hub__sort_order", "hub__code", F("rate_per_card_hour").asc(nulls_last=True)]
    else:
        order = [F("rate_per_card_hour").asc(nulls_last=True)]
    return clusters.order_by(*order, "cpi")


@dataclass(frozen=True)
class TariffStrip:
    """Today's band schedule of one tariff version, in the tariff's own zone, drawn once per page."""

    tariff_version_id: int
    tariff_code: str
    tariff_name: str
    time_zone: str
    local_date: date
    multipliers: dict[str, Decimal]
    svg: SafeString


@dataclass(frozen=True)
class MarketRow:
    cluster: Cluster
    free_cards: int
    held_cards: int
    unhealthy_cards: int
    price_card: PriceCard | None
    latency_ms: Decimal | None
    strip: TariffStrip | None
    withheld_cards: int = 0  # kept from sale by the operator's last heartbeat (K2), now
    reliability: MarketReliability | None = None

    @property
    def placeable(self) -> bool:
        return self.cluster.status in PLACEABLE_STATUSES and self.price_card is not None


@dataclass(frozen=True)
class MarketReliability:
    """A cluster's reliability score as the marketplace shows it (broker.services.reliability): the score
    in percent, interruptions per 1,000 card-hours sold (None when nothing was sold), whether it is the
    platform's prior alone (a new cluster: nothing sold in the last 30 days, or not scored yet), and when it
    was computed (None: not yet)."""

    percent: Decimal
    prior: bool
    interruptions_per_1000_card_hours: Decimal | None
    computed_at: datetime | None


def cluster_reliability_of(cluster: Cluster) -> MarketReliability:
    """``cluster``'s reliability from its joined score row (select_related), or the prior without one."""
    try:
        row = cluster.reliability
    except ObjectDoesNotExist:
        row = None
    if row is None:
        return MarketReliability(
            percent=Decimal(settings.CARDHOUR_RELIABILITY_PRIOR_PERCENT).quantize(Decimal("0.001")),
            prior=True,
            interruptions_per_1000_card_hours=None,
            computed_at=None,
        )
    return MarketReliability(
        percent=row.reliability_percent,
        prior=not row.has_history,
        interruptions_per_1000_card_hours=row.interruptions_per_1000_card_hours,
        computed_at=row.computed_at,
    )


def tariff_strip(*, price_card: PriceCard, at: datetime, cache: dict[int, TariffStrip]) -> TariffStrip:
    """The band strip of ``price_card``'s tariff version for the local day containing ``at``, with a
    marker at the local time; ``cache`` (one per request) holds each version's strip once."""
    version_id = price_card.tariff_version_id
    strip = cache.get(version_id)
    if strip is not None:
        return strip
    tariff = price_card.tariff_version.tariff
    compiled = compiled_tariff(tariff_version_id=version_id)
    local = at.astimezone(ZoneInfo(compiled.time_zone))
    multipliers = {
        band: Decimal(e4).scaleb(-MULTIPLIER_PLACES).normalize()
        for band, e4 in zip(compiled.bands, compiled.multipliers_e4, strict=True)
    }
    title = _("%(tariff)s today (%(date)s, %(zone)s)") % {
        "tariff": tariff.name,
        "date": local.date().isoformat(),
        "zone": compiled.time_zone,
    }
    strip = TariffStrip(
        tariff_version_id=version_id,
        tariff_code=tariff.code,
        tariff_name=tariff.name,
        time_zone=compiled.time_zone,
        local_date=local.date(),
        multipliers=multipliers,
        svg=band_strip_svg(
            compiled.day_strip(local.date()),
            title=title,
            multipliers=multipliers,
            width=240,
            height=22,
            now_minute=local.hour * 60 + local.minute,
        ),
    )
    cache[version_id] = strip
    return strip


def market_rows(*, clusters: Sequence[Cluster], at: datetime) -> list[MarketRow]:
    """Annotated clusters (from :func:`market_clusters`) as rows with their price cards (one query) and
    each tariff version's strip drawn once."""
    card_ids = {c.market_price_card_id for c in clusters if c.market_price_card_id is not None}  # type: ignore[attr-defined]
    cards = PriceCard.objects.select_related("tariff_version__tariff").in_bulk(card_ids) if card_ids else {}
    strips: dict[int, TariffStrip] = {}
    rows = []
    for cluster in clusters:
        card = cards.get(cluster.market_price_card_id)  # type: ignore[attr-defined]
        rows.append(
            MarketRow(
                cluster=cluster,
                free_cards=cluster.free_cards,  # type: ignore[attr-defined]
                held_cards=cluster.held_cards,  # type: ignore[attr-defined]
                unhealthy_cards=cluster.unhealthy,  # type: ignore[attr-defined]
                withheld_cards=cluster.withheld_cards,  # type: ignore[attr-defined]
                price_card=card,
                latency_ms=cluster.latency_ms,  # type: ignore[attr-defined]
                strip=tariff_strip(price_card=card, at=at, cache=strips) if card is not None else None,
                reliability=cluster_reliability_of(cluster),
            )
        )
    return rows


def market_page(
    *, query: MarketQuery, origin_hub: str, at: datetime, page_number: str | int | None, per_page: int = 50
) -> tuple[Page[int], list[MarketRow]]:
    """One page of the marketplace. Two steps so that the per-cluster subqueries run only where needed:
    the page's ids, filtered and sorted in SQL (only the expressions the filters and the sort use are
    computed over every cluster), then the page's 50 clusters with every annotation, then their price
    cards. Four queries (with the count) however many clusters there are."""
    clusters = market_clusters(query=query, origin_hub=origin_hub, at=at)
    page = Paginator(clusters.values_list("pk", flat=True), per_page).get_page(page_number)
    ids = list(page.object_list)
    by_id = {cluster.pk: cluster for cluster in clusters.order_by().filter(pk__in=ids)} if ids else {}
    return page, market_rows(clusters=[by_id[pk] for pk in ids if pk in by_id], at=at)


# --- Capacity by hub and chip (marketplace summaries, staff matrix) ---------------------------------


@dataclass(frozen=True)
class CapacityCell:
    """The clusters of one chip in one hub: how many, their cards, unhealthy, held now and free now."""

    hub: str
    hub_name: str
    hub_order: int
    chip: str
    chip_name: str
    clusters: int
    cards: int
    unhealthy_cards: int
    held_cards: int
    free_cards: int
    withheld_cards: int = 0  # kept from sale by operators' heartbeats (K2), now


_CELL_KEYS = (
    "cluster__hub__code",
    "cluster__hub__name",
    "cluster__hub__sort_order",
    "cluster__accelerator__slug",
    "cluster__accelerator__vendor",
    "cluster__accelerator__model",
    "cluster__status",
)


def capacity_cells(*, statuses: Iterable[str], at: datetime) -> list[tuple[str, CapacityCell]]:
    """(cluster status, cell) for each hub, chip and status of the clusters in ``statuses``. Four grouped
    queries: the clusters' cards, the unhealthy cards of the islands that have any, the cards withheld by
    heartbeats binding at ``at``, and the holds live at ``at`` per island (few: only islands holding cards
    now). An island whose holds and withheld cards exceed its healthy cards (unhealthy cards reported, or
    the operator's own work started, after a lease took them) counts zero free cards, never fewer."""
    statuses = list(statuses)
    # Cluster totals are kept equal to the sum of their islands' cards by the federation services.
    rows = (
        Cluster.objects.filter(status__in=statuses)
        .order_by()
        .values(*(key.removeprefix("cluster__") for key in _CELL_KEYS))
        .annotate(clusters=Count("id"), cards_total=Sum("total_cards"))
    )
    unhealthy_rows = (
        Island.objects.filter(cluster__status__in=statuses, unhealthy_cards__gt=0)
        .order_by()
        .values("cluster__hub__code", "cluster__accelerator__slug", "cluster__status")
        .annotate(unhealthy=Sum("unhealthy_cards"))
    )
    unhealthy_of = {
        (row["cluster__hub__code"], row["cluster__accelerator__slug"], row["cluster__status"]): int(
            row["unhealthy"]
        )
        for row in unhealthy_rows
    }
    # Cards kept from sale by heartbeats that still bind at ``at`` (see the module docstring).
    report_cutoff = at - heartbeat_report_ttl()
    withheld_expression = F("cards") - F("unhealthy_cards") - F("available_cards")
    withheld_rows = (
        Island.objects.filter(cluster__status__in=statuses, cluster__last_heartbeat_at__gt=report_cutoff)
        .annotate(withheld=withheld_expression)
        .filter(withheld__gt=0)
        .order_by()
        .values("cluster__hub__code", "cluster__accelerator__slug", "cluster__status")
        .annotate(total=Sum("withheld"))
    )
    withheld_of = {
        (row["cluster__hub__code"], row["cluster__accelerator__slug"], row["cluster__status"]): int(
            row["total"]
        )
        for row in withheld_rows
    }
    held_rows = (
        CapacityHold.objects.filter(
            active=True, start_at__lte=at, end_at__gt=at, island__cluster__status__in=statuses
        )
        .order_by()
        .values(
            "island_id",
            "island__cards",
            "island__unhealthy_cards",
            "island__available_cards",
            "island__cluster__last_heartbeat_at",
            "island__cluster__hub__code",
            "island__cluster__accelerator__slug",
            "island__cluster__status",
        )
        .annotate(held=Sum("cards"))
    )
    held: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in held_rows:
        key = (
            row["island__cluster__hub__code"],
            row["island__cluster__accelerator__slug"],
            row["island__cluster__status"],
        )
        cards = int(row["held"])
        capacity = row["island__cards"] - row["island__unhealthy_cards"]
        beat = row["island__cluster__last_heartbeat_at"]
        withheld = (
            max(capacity - row["island__available_cards"], 0)
            if beat is not None and beat > report_cutoff
            else 0
        )
        held[key][0] += cards
        # What the island's free figure (never below zero) does not subtract.
        held[key][1] += max(cards + withheld - capacity, 0)
    out = []
    for row in rows:
        key = (row["hub__code"], row["accelerator__slug"], row["status"])
        cards, unhealthy = int(row["cards_total"] or 0), unhealthy_of.get(key, 0)
        held_cards, excess = held.get(key, (0, 0))
        withheld_cards = withheld_of.get(key, 0)
        cell = CapacityCell(
            hub=key[0],
            hub_name=row["hub__name"],
            hub_order=row["hub__sort_order"],
            chip=key[1],
            chip_name=f"{row['accelerator__vendor']} {row['accelerator__model']}",
            clusters=row["clusters"],
            cards=cards,
            unhealthy_cards=unhealthy,
            held_cards=held_cards,
            free_cards=cards - unhealthy - withheld_cards - held_cards + excess,
            withheld_cards=withheld_cards,
        )
        out.append((key[2], cell))
    return out


def _merge(cells: Iterable[CapacityCell]) -> list[CapacityCell]:
    """Cells of the same hub and chip (different statuses) added together, sorted by hub then chip."""
    merged: dict[tuple[str, str], CapacityCell] = {}
    for cell in cells:
        seen = merged.get((cell.hub, cell.chip))
        if seen is not None:
            cell = replace(
                seen,
                clusters=seen.clusters + cell.clusters,
                cards=seen.cards + cell.cards,
                unhealthy_cards=seen.unhealthy_cards + cell.unhealthy_cards,
                held_cards=seen.held_cards + cell.held_cards,
                free_cards=seen.free_cards + cell.free_cards,
                withheld_cards=seen.withheld_cards + cell.withheld_cards,
            )
        merged[(cell.hub, cell.chip)] = cell
    return sorted(merged.values(), key=lambda c: (c.hub_order, c.hub, c.chip))


def capacity_by_hub_and_chip(*, statuses: Iterable[str], at: datetime) -> list[CapacityCell]:
    """Cards, unhealthy, held and free cards at ``at`` for each (hub, chip) of the clusters in
    ``statuses`` (see :func:`capacity_cells`)."""
    return _merge(cell for _, cell in capacity_cells(statuses=statuses, at=at))


@dataclass(frozen=True)
class CapacityTotal:
    key: str
    name: str
    clusters: int
    cards: int
    free_cards: int
    held_cards: int
    sellable_cards: int

    @property
    def utilisation(self) -> Decimal | None:
        """Held cards as a share of sellable cards (0–1, 4 places), None when nothing is sellable."""
        if self.sellable_cards <= 0:
            return None
        return (Decimal(self.held_cards) / Decimal(self.sellable_cards)).quantize(Decimal("0.0001"))


def _totals(cells: Iterable[CapacityCell], by: Literal["hub", "chip"]) -> list[CapacityTotal]:
    acc: dict[str, list[Any]] = {}
    order: dict[str, tuple[int, str]] = {}
    for cell in cells:
        key, name = (cell.hub, cell.hub_name) if by == "hub" else (cell.chip, cell.chip_name)
        order[key] = (cell.hub_order, cell.hub) if by == "hub" else (0, cell.chip_name)
        entry = acc.setdefault(key, [name, 0, 0, 0, 0, 0])
        entry[1] += cell.clusters
        entry[2] += cell.cards
        entry[3] += cell.free_cards
        entry[4] += cell.held_cards
        entry[5] += cell.cards - cell.unhealthy_cards
    return [
        CapacityTotal(
            key=key,
            name=name,
            clusters=clusters,
            cards=cards,
            free_cards=free,
            held_cards=held,
            sellable_cards=sellable,
        )
        for key, (name, clusters, cards, free, held, sellable) in sorted(
            acc.items(), key=lambda item: order[item[0]]
        )
    ]


@dataclass(frozen=True)
class MarketSummary:
    by_hub: list[CapacityTotal]
    by_chip: list[CapacityTotal]
    free_cards: int
    cards: int


def market_summary(*, include_offline: bool, at: datetime) -> MarketSummary:
    """Free cards now by hub and by chip across the whole marketplace (one query)."""
    cells = capacity_by_hub_and_chip(
        statuses=LISTED_STATUSES if include_offline else PLACEABLE_STATUSES, at=at
    )
    return MarketSummary(
        by_hub=_totals(cells, "hub"),
        by_chip=_totals(cells, "chip"),
        free_cards=sum(c.free_cards for c in cells),
        cards=sum(c.cards for c in cells),
    )


def market_filter_choices() -> tuple[list[Hub], list[Accelerator], list[Organisation]]:
    """Hubs, chips and operators the marketplace's filters offer: those with a listed cluster (chips,
    operators) or every hub (latency is measured from any of them)."""

    def listed(field: str) -> Exists:
        return Exists(Cluster.objects.filter(status__in=LISTED_STATUSES, **{field: OuterRef("pk")}))

    hubs = list(Hub.objects.order_by("sort_order", "code"))
    chips = list(Accelerator.objects.filter(listed("accelerator_id")).order_by("vendor", "model"))
    operators = list(Organisation.objects.filter(listed("operator_id")).order_by("name"))
    return hubs, chips, operators


# --- Staff dashboard ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FederationMatrix:
    """Cards federated (every cluster not retired) by hub × chip, with row, column and grand totals."""

    hubs: list[tuple[str, str]]
    chips: list[tuple[str, str]]
    cells: dict[tuple[str, str], int]
    hub_totals: dict[str, int]
    chip_totals: dict[str, int]
    total: int

    def rows(self) -> list[tuple[str, str, list[int], int]]:
        """(chip slug, chip name, cards per hub in ``hubs`` order, chip total) per chip: chips are the
        rows, as there are more of them than hubs."""
        return [
            (slug, name, [self.cells.get((hub, slug), 0) for hub, _ in self.hubs], self.chip_totals[slug])
            for slug, name in self.chips
        ]

    def column_totals(self) -> list[int]:
        """Cards per hub, in ``hubs`` order."""
        return [self.hub_totals[hub] for hub, _ in self.hubs]


@dataclass(frozen=True)
class Utilisation:
    overall: CapacityTotal
    by_hub: list[CapacityTotal]


@dataclass(frozen=True)
class StaffCapacity:
    matrix: FederationMatrix
    utilisation: Utilisation


def staff_capacity(*, at: datetime) -> StaffCapacity:
    """The federation matrix over every cluster that is not retired, and utilisation now (held cards /
    sellable cards of active and draining clusters), overall and by hub. Two queries."""
    by_status = capacity_cells(statuses=LISTED_STATUSES, at=at)
    cells = _merge(cell for _, cell in by_status)
    matrix_cells: dict[tuple[str, str], int] = defaultdict(int)
    hubs: dict[str, tuple[int, str]] = {}
    chips: dict[str, str] = {}
    for cell in cells:
        matrix_cells[(cell.hub, cell.chip)] += cell.cards
        hubs[cell.hub] = (cell.hub_order, cell.hub_name)
        chips[cell.chip] = cell.chip_name
    hub_totals: dict[str, int] = defaultdict(int)
    chip_totals: dict[str, int] = defaultdict(int)
    for (hub, chip), cards in matrix_cells.items():
        hub_totals[hub] += cards
        chip_totals[chip] += cards
    matrix = FederationMatrix(
        hubs=[(code, name) for code, (_, name) in sorted(hubs.items(), key=lambda i: (i[1][0], i[0]))],
        chips=sorted(chips.items(), key=lambda item: item[1]),
        cells=dict(matrix_cells),
        hub_totals=dict(hub_totals),
        chip_totals=dict(chip_totals),
        total=sum(matrix_cells.values()),
    )
    # Utilisation counts sellable clusters only; the federated cells above also include offline ones.
    sellable = _totals(_merge(cell for status, cell in by_status if status in SELLABLE_STATUSES), "hub")
    overall = CapacityTotal(
        key="",
        name=_("All hubs"),
        clusters=sum(t.clusters for t in sellable),
        cards=sum(t.cards for t in sellable),
        free_cards=sum(t.free_cards for t in sellable),
        held_cards=sum(t.held_cards for t in sellable),
        sellable_cards=sum(t.sellable_cards for t in sellable),
    )
    return StaffCapacity(matrix=matrix, utilisation=Utilisation(overall=overall, by_hub=sellable))


@dataclass(frozen=True)
class UtilisationPoint:
    hour_start: datetime
    held_cards: Decimal  # average over the hour
    utilisation: Decimal  # 0–1 against the sellable cards now


def utilisation_hourly(*, end: datetime, hours: int, sellable_cards: int) -> list[UtilisationPoint]:
    """Average held cards per hour over the ``hours`` whole hours before ``end`` (rounded down to the
    hour, so the last point is the hour in progress up to ``end``), from the capacity holds overlapping
    the window: a hold counts from its start to its end or, for a lease that ended early, to the lease's
    end. Utilisation is against ``sellable_cards`` (capacity history is not kept, so today's)."""
    last_hour = end.replace(minute=0, second=0, microsecond=0)
    window_start = last_hour - timedelta(hours=hours - 1)
    rows = (
        CapacityHold.objects.filter(start_at__lt=end, end_at__gt=window_start)
        .filter(Q(active=True) | Q(lease__ended_at__gt=window_start))
        .values_list("start_at", "end_at", "lease__ended_at", "cards")
    )
    edges = np.array(
        [(window_start + timedelta(hours=i)).timestamp() for i in range(hours + 1)], dtype=np.float64
    )
    edges[-1] = min(edges[-1], end.timestamp())
    card_seconds = np.zeros(hours, dtype=np.float64)
    data = [
        (start.timestamp(), min(stop, ended).timestamp() if ended else stop.timestamp(), cards)
        for start, stop, ended, cards in rows
    ]
    # Chunks bound the (holds × hours) overlap matrix.
    for offset in range(0, len(data), 20_000):
        chunk = np.array(data[offset : offset + 20_000], dtype=np.float64).reshape(-1, 3)
        starts, stops, cards = chunk[:, :1], chunk[:, 1:2], chunk[:, 2]
        overlap = np.clip(np.minimum(stops, edges[1:]) - np.maximum(starts, edges[:-1]), 0, None)
        card_seconds += cards @ overlap
    lengths = np.maximum(edges[1:] - edges[:-1], 1)
    points = []
    for i in range(hours):
        held = Decimal(str(round(card_seconds[i] / lengths[i], 2)))
        share = (held / sellable_cards).quantize(Decimal("0.0001")) if sellable_cards else Decimal(0)
        points.append(
            UtilisationPoint(hour_start=window_start + timedelta(hours=i), held_cards=held, utilisation=share)
        )
    return points


@dataclass(frozen=True)
class BandRevenue:
    band: str
    gross: Decimal
    commission: Decimal
    card_hours: Decimal


@dataclass(frozen=True)
class RevenueByBand:
    """Gross (at operators' rates) and commission of the rated segments starting in one month, per
    local day and band, in CNY."""

    month_start: date
    days: list[date]
    bands: list[str]
    per_day: dict[date, dict[str, Decimal]]
    by_band: list[BandRevenue]
    gross: Decimal
    commission: Decimal


def revenue_by_band(*, month_start: date) -> RevenueByBand:
    """Revenue of the month starting ``month_start`` (TIME_ZONE days) from metering's rated segments:
    one grouped query (day, band) in SQL. Days run up to today for the current month."""
    zone = ZoneInfo(settings.TIME_ZONE)
    next_month = (month_start.replace(day=28) + timedelta(days=4)).replace(day=1)
    start_at = datetime.combine(month_start, datetime.min.time(), tzinfo=zone)
    end_at = datetime.combine(next_month, datetime.min.time(), tzinfo=zone)
    rows = (
        RatedSegment.objects.filter(start_at__gte=start_at, start_at__lt=end_at)
        .order_by()
        .annotate(day=TruncDate("start_at", tzinfo=zone))
        .values("day", "band")
        .annotate(gross_micros=Sum("gross"), commission_micros=Sum("commission"), secs=Sum("card_seconds"))
    )
    per_day: dict[date, dict[str, Decimal]] = defaultdict(dict)
    per_band: dict[str, list[int]] = {}
    for row in rows:
        gross, commission, secs = int(row["gross_micros"]), int(row["commission_micros"]), int(row["secs"])
        per_day[row["day"]][row["band"]] = from_micros(gross)
        totals = per_band.setdefault(row["band"], [0, 0, 0])
        totals[0] += gross
        totals[1] += commission
        totals[2] += secs
    bands = sorted(per_band, key=band_sort_key)
    today = datetime.now(tz=zone).date()
    last = min(next_month - timedelta(days=1), max(today, month_start))
    if per_day:
        last = max(last, max(per_day))
    days = [month_start + timedelta(days=i) for i in range((last - month_start).days + 1)]
    return RevenueByBand(
        month_start=month_start,
        days=days,
        bands=bands,
        per_day=dict(per_day),
        by_band=[
            BandRevenue(
                band=band,
                gross=from_micros(per_band[band][0]),
                commission=from_micros(per_band[band][1]),
                card_hours=(Decimal(per_band[band][2]) / 3600).quantize(Decimal("0.01")),
            )
            for band in bands
        ],
        gross=from_micros(sum(v[0] for v in per_band.values())),
        commission=from_micros(sum(v[1] for v in per_band.values())),
    )


@dataclass(frozen=True)
class OfflineCluster:
    cluster: Cluster
    since: datetime | None
    reason: str


@dataclass(frozen=True)
class OfflineClusters:
    count: int
    clusters: list[OfflineCluster] = field(default_factory=list)


def clusters_offline(*, limit: int = 50) -> OfflineClusters:
    """Offline clusters, longest offline first, with when and why they went offline (the latest status
    change into offline). Two queries."""
    latest = ClusterStatusChange.objects.filter(
        cluster_id=OuterRef("pk"), to_status=ClusterStatus.OFFLINE
    ).order_by("-changed_at", "-pk")
    offline = Cluster.objects.filter(status=ClusterStatus.OFFLINE)
    rows = (
        offline.select_related("operator", "hub", "accelerator")
        .annotate(
            offline_since=Subquery(latest.values("changed_at")[:1]),
            offline_reason=Subquery(latest.values("reason")[:1]),
        )
        .order_by(F("offline_since").asc(nulls_first=True), "cpi")[:limit]
    )
    items = [
        OfflineCluster(
            cluster=c,
            since=c.offline_since,
            reason=c.offline_reason or "",
        )
        for c in rows
    ]
    count = len(items) if len(items) < limit else offline.count()
    return OfflineClusters(count=count, clusters=items)


def reconciliation_last() -> ReconciliationRun | None:
    """The latest ledger reconciliation run, if any."""
    return ReconciliationRun.objects.order_by("-checked_at", "-id").first()


def month_start_of(at: datetime) -> date:
    """The first day of the TIME_ZONE month containing ``at``."""
    return at.astimezone(ZoneInfo(settings.TIME_ZONE)).date().replace(day=1)
