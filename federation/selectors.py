"""Federation reads: catalog, an operator's own clusters, and hierarchical identifier resolution."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from core.models import Organisation
from core.packed import packed_ints, unpacked_ints
from federation import identifiers
from federation.errors import (
    AcceleratorAmbiguousError,
    ClusterNotFoundError,
    IdentifierNotFoundError,
    InvalidIdentifierError,
    IslandNotFoundError,
    UnknownAcceleratorError,
)
from federation.models import (
    Accelerator,
    Cluster,
    ClusterMaintenance,
    ClusterStatus,
    ClusterStatusChange,
    Hub,
    HubLatency,
    Island,
    StandardCard,
)
from federation.types import ChipSpec, ClusterDescription, IslandDescription, OperatorRef

FACTOR_QUANTUM = Decimal("0.0001")
STANDARD_CARDS_QUANTUM = Decimal("0.01")


def standard_card_current(*, at: datetime | None = None) -> StandardCard:
    """The standard-card definition in force at ``at`` (default now): the newest effective version."""
    at = at or timezone.now()
    card = StandardCard.objects.filter(effective_from__lte=at).order_by("-version").first()
    if card is None:  # a platform always has v1 (data migration); this is a broken database
        raise StandardCard.DoesNotExist("No standard-card definition is in force.")
    return card


def standard_card_factor(*, tflops: Decimal | None, standard: StandardCard) -> Decimal | None:
    return standard_card_factor_of(tflops=tflops, standard_tflops=standard.dense_fp16_tflops)


def standard_card_factor_of(*, tflops: Decimal | None, standard_tflops: Decimal) -> Decimal | None:
    """A chip's standard-card factor: its dense FP16 TFLOPS over the standard card's, to FACTOR_QUANTUM;
    None when the chip's figure is not public. The one rule, wherever the figures were read."""
    if tflops is None:
        return None
    return (tflops / standard_tflops).quantize(FACTOR_QUANTUM)


def chip_spec(*, accelerator: Accelerator, standard: StandardCard) -> ChipSpec:
    return ChipSpec(
        slug=accelerator.slug,
        vendor=accelerator.vendor,
        model=accelerator.model,
        spec_status=accelerator.spec_status,
        dense_fp16_tflops=accelerator.dense_fp16_tflops,
        memory_gb=accelerator.memory_gb,
        memory_bandwidth_gbps=accelerator.memory_bandwidth_gbps,
        interconnect=accelerator.interconnect,
        standard_card_factor=standard_card_factor(tflops=accelerator.dense_fp16_tflops, standard=standard),
    )


def accelerator_list() -> QuerySet[Accelerator]:
    return Accelerator.objects.all()


def accelerator_spellings(accelerator: Accelerator) -> set[str]:
    """The names that resolve to ``accelerator``: its slug and aliases, trimmed and lower-cased."""
    names = {accelerator.slug.lower()}
    names.update(str(alias).strip().lower() for alias in accelerator.aliases or [])
    return names


def accelerator_spelling_index(
    accelerators: Iterable[Accelerator] | None = None,
) -> dict[str, list[Accelerator]]:
    """Spelling → the catalog models it names (default: the whole catalog). Built once per fleet import,
    so a thousand rows cost one query."""
    index: dict[str, list[Accelerator]] = defaultdict(list)
    for accelerator in Accelerator.objects.all() if accelerators is None else accelerators:
        for spelling in accelerator_spellings(accelerator):
            index[spelling].append(accelerator)
    return dict(index)


def accelerator_resolve(
    *, name: str, index: Mapping[str, Sequence[Accelerator]] | None = None
) -> Accelerator:
    """The catalog model ``name`` means: its slug or one of its aliases, case-insensitively. REST
    registration and fleet import both resolve through here, so they accept the same names.

    A slug names its model even if another model lists it as an alias. A name that is an alias of several
    models (bare "H100": SXM5 or PCIe) is refused rather than guessed, because the parts differ (an H100
    PCIe does 756.5 dense FP16 TFLOPS, the SXM5 989.4).

    Raises UnknownAcceleratorError, AcceleratorAmbiguousError (``extra["candidates"]``: the slugs).
    """
    key = name.strip().lower()
    if index is None:
        # Most callers give the slug: one indexed row instead of the whole catalog's spellings.
        by_slug = Accelerator.objects.filter(slug__iexact=key).first() if key and "\x00" not in key else None
        if by_slug is not None and by_slug.slug.lower() == key:
            return by_slug
        index = accelerator_spelling_index()  # the catalog is a few dozen rows
    matches = list(index.get(key, []))
    exact = [accelerator for accelerator in matches if accelerator.slug.lower() == key]
    if exact:
        return exact[0]
    if not matches:
        raise UnknownAcceleratorError(
            _("No accelerator %(name)r in the catalog (slug or alias).") % {"name": name},
            extra={"accelerator": name},
        )
    if len(matches) > 1:
        candidates = sorted(accelerator.slug for accelerator in matches)
        raise AcceleratorAmbiguousError(
            _("%(name)r could be any of %(candidates)s; give the slug or a specific alias.")
            % {"name": name, "candidates": ", ".join(candidates)},
            extra={"accelerator": name, "candidates": candidates},
        )
    return matches[0]


@functools.cache
def _hub_and_chip_plan(vendor: str) -> tuple[str, list[list[tuple[Any, Any]]], list[str], list[str]]:
    """The SQL of :func:`hub_and_chip_get`, each column's converters and the two models' attnames, built
    once per process and database vendor from the models' own field lists (a new field is read without
    touching this)."""
    hub_fields = list(Hub._meta.concrete_fields)
    chip_fields = list(Accelerator._meta.concrete_fields)
    columns = ", ".join([f'h."{f.column}"' for f in hub_fields] + [f'a."{f.column}"' for f in chip_fields])
    # One row whatever matches: both joins hang off a constant row. lower() is ASCII-only on SQLite, so the
    # caller compares the slug again in Python and falls back to accelerator_resolve on any doubt.
    sql = (
        f"SELECT {columns} FROM (SELECT 1 AS one) k "  # noqa: S608 - names from the models, values bound
        f'LEFT JOIN "{Hub._meta.db_table}" h ON h."code" = %s '
        f'LEFT JOIN "{Accelerator._meta.db_table}" a ON lower(a."slug") = %s '
        'ORDER BY a."id" LIMIT 1'
    )
    converters = []
    field: Any
    for field in [*hub_fields, *chip_fields]:
        col = field.get_col(field.model._meta.db_table)
        converters.append([(c, col) for c in connection.ops.get_db_converters(col)])
        converters[-1] += [(c, col) for c in field.get_db_converters(connection)]
    return sql, converters, [f.attname for f in hub_fields], [f.attname for f in chip_fields]


def hub_and_chip_get(*, hub_code: str, accelerator_name: str) -> tuple[Hub | None, Accelerator | None]:
    """The hub with ``hub_code`` and the catalog model whose slug is ``accelerator_name`` (case-insensitively),
    each or None, in one read. None for the chip means "not a slug": resolve the name with
    accelerator_resolve, which also knows aliases and raises the right error.

    Registration needs both on every call; two ORM lookups (``.first()`` each) cost about 4 ms of CPU per
    registration in query compilation and round trips, this one statement a fraction of that.
    """
    key = accelerator_name.strip().lower()
    sql, converters, hub_attnames, chip_attnames = _hub_and_chip_plan(connection.vendor)
    with connection.cursor() as cursor:
        # PostgreSQL refuses NUL in text; no slug holds one, so such a name goes the long way round.
        cursor.execute(sql, [hub_code, key if "\x00" not in key else ""])
        row = cursor.fetchone()
    assert row is not None  # the constant row always answers
    values = []
    for value, field_converters in zip(row, converters, strict=True):
        for converter, col in field_converters:
            value = converter(value, col, connection)
        values.append(value)
    n = len(hub_attnames)
    hub = None if values[0] is None else Hub.from_db(connection.alias, hub_attnames, values[:n])
    chip = None if values[n] is None else Accelerator.from_db(connection.alias, chip_attnames, values[n:])
    if chip is not None and chip.slug.lower() != key:
        chip = None
    return hub, chip


def hub_list() -> QuerySet[Hub]:
    return Hub.objects.all()


def hub_latency_list() -> QuerySet[HubLatency]:
    return HubLatency.objects.select_related("source", "target")


def cluster_list_for_operator(*, operator: Organisation) -> QuerySet[Cluster]:
    """An operator's own clusters (the management view); others' clusters are not in it."""
    return Cluster.objects.filter(operator=operator).select_related("hub", "accelerator", "operator")


def cluster_get_for_operator(*, operator: Organisation, cpi: str) -> Cluster:
    """One of ``operator``'s clusters. Another operator's cluster raises ClusterNotFoundError, exactly as
    a cluster that does not exist, so existence does not leak."""
    # A value that is not a cluster identifier cannot name one; checking first also keeps bytes that
    # PostgreSQL rejects (NUL) out of SQL.
    valid = identifiers.is_valid(cpi) and identifiers.parse(cpi).level == identifiers.Level.CLUSTER
    cluster = cluster_list_for_operator(operator=operator).filter(cpi=cpi).first() if valid else None
    if cluster is None:
        raise ClusterNotFoundError(_("You have no cluster %(cpi)r.") % {"cpi": cpi}, extra={"cpi": cpi})
    return cluster


def cluster_get_listed(*, cpi: str) -> Cluster | None:
    """The cluster named ``cpi`` if it is listed on the market (any operator's, not retired), else None:
    what a buyer may pin a job to."""
    valid = identifiers.is_valid(cpi) and identifiers.parse(cpi).level == identifiers.Level.CLUSTER
    if not valid:
        return None
    return (
        Cluster.objects.exclude(status="retired")
        .select_related("hub", "accelerator", "operator")
        .filter(cpi=cpi)
        .first()
    )


def hub_latencies_to_listed_clusters(*, origin_hub: str, above_ms: Decimal) -> list[Decimal]:
    """The distinct latencies over ``above_ms`` from ``origin_hub`` to hubs where a cluster is listed,
    smallest first: the latency budgets that would let another hub's clusters in."""
    return sorted(
        set(
            HubLatency.objects.filter(source__code=origin_hub, latency_ms__gt=above_ms)
            .filter(target__clusters__status__in=["active", "draining", "offline"])
            .values_list("latency_ms", flat=True)
        )
    )


def island_get_for_operator(*, operator: Organisation, cpi: str, name: str) -> Island:
    cluster = cluster_get_for_operator(operator=operator, cpi=cpi)
    island = None
    if identifiers.is_valid(f"{cpi}:{name}"):
        island = Island.objects.select_related("cluster").filter(cluster=cluster, name=name).first()
    if island is None:
        raise IslandNotFoundError(
            _("%(cpi)s has no island %(name)r.") % {"cpi": cpi, "name": name},
            extra={"cpi": cpi, "island": name},
        )
    return island


def island_list(*, cluster: Cluster) -> QuerySet[Island]:
    return Island.objects.filter(cluster=cluster).order_by("name")


def cluster_status_history(*, cluster: Cluster) -> QuerySet[ClusterStatusChange]:
    return ClusterStatusChange.objects.filter(cluster=cluster).select_related("actor_user")


DOWN_STATUSES = ("offline", "retired")


def cluster_down_intervals(
    *, cluster_id: int, start_at: datetime, end_at: datetime
) -> list[tuple[datetime, datetime]]:
    """The parts of ``[start_at, end_at)`` in which the cluster was offline or retired, from its status
    history (half-open, merged, in order). A down status still in force at ``end_at`` runs to it."""
    changes = list(
        ClusterStatusChange.objects.filter(cluster_id=cluster_id, changed_at__lt=end_at)
        .order_by("changed_at", "pk")
        .values_list("changed_at", "to_status")
    )
    intervals: list[tuple[datetime, datetime]] = []
    down_since: datetime | None = None
    for changed_at, to_status in changes:
        if to_status in DOWN_STATUSES:
            if down_since is None:
                down_since = changed_at
        elif down_since is not None:
            intervals.append((down_since, changed_at))
            down_since = None
    if down_since is not None:
        intervals.append((down_since, end_at))
    return [(max(a, start_at), min(b, end_at)) for a, b in intervals if b > start_at and a < end_at and b > a]


def cluster_maintenance_list(*, cluster: Cluster) -> QuerySet[ClusterMaintenance]:
    return ClusterMaintenance.objects.filter(cluster=cluster).order_by("-starts_at", "-pk")


def cluster_maintenance_announced_ahead(
    *, cluster_id: int, start_at: datetime, end_at: datetime, announced_by: datetime
) -> list[tuple[datetime, datetime]]:
    """Maintenance windows of the cluster overlapping ``[start_at, end_at)`` that were announced at least
    CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS before they start and no later than ``announced_by`` (the moment
    a lease was accepted), clipped to the range, in order."""
    notice = timedelta(hours=settings.CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS)
    rows = ClusterMaintenance.objects.filter(
        cluster_id=cluster_id, starts_at__lt=end_at, ends_at__gt=start_at, announced_at__lte=announced_by
    ).values_list("starts_at", "ends_at", "announced_at")
    return sorted(
        (max(starts, start_at), min(ends, end_at))
        for starts, ends, announced in rows
        if announced <= starts - notice
    )


# --- Resolution -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSummary:
    hub: str
    clusters: int
    total_cards: int
    available_cards: int


@dataclass(frozen=True)
class Resolution:
    """The answer to resolving an identifier. ``level`` says which of the other fields is set:
    operator/hub → ``hubs`` (operator level only) and ``clusters`` (a queryset for pagination);
    cluster/island → ``cluster`` (and ``island`` for an island identifier)."""

    identifier: str
    level: str
    operator: OperatorRef
    hubs: list[HubSummary] | None = None
    clusters: QuerySet[Cluster] | None = None
    cluster: ClusterDescription | None = None
    island: IslandDescription | None = None


def _standard_cards(cards: int, factor: Decimal | None) -> Decimal | None:
    if factor is None:
        return None
    return (cards * factor).quantize(STANDARD_CARDS_QUANTUM)


def cluster_describe(*, cluster: Cluster, viewer: Organisation | None) -> ClusterDescription:
    """The resource description of a cluster. The dispatch endpoint is shown to its own operator only:
    buyers never talk to it, and it is an attack surface."""
    standard = standard_card_current()
    chip = chip_spec(accelerator=cluster.accelerator, standard=standard)
    factor = chip.standard_card_factor
    islands = [
        IslandDescription(
            cpi=island.cpi,
            name=island.name,
            fabric=island.fabric,
            cards=island.cards,
            available_cards=island.available_cards,
            unhealthy_cards=island.unhealthy_cards,
            standard_cards=_standard_cards(island.cards, factor),
            reported_at=island.reported_at,
        )
        for island in island_list(cluster=cluster)
    ]
    is_owner = viewer is not None and viewer.pk == cluster.operator_id
    return ClusterDescription(
        cpi=cluster.cpi,
        operator=cluster.operator.slug,
        operator_name=cluster.operator.name,
        hub=cluster.hub.code,
        site=cluster.site,
        chip=chip,
        status=cluster.status,
        health=cluster.health,
        total_cards=cluster.total_cards,
        available_cards=cluster.available_cards,
        total_standard_cards=_standard_cards(cluster.total_cards, factor),
        available_standard_cards=_standard_cards(cluster.available_cards, factor),
        last_heartbeat_at=cluster.last_heartbeat_at,
        endpoint_url=cluster.endpoint_url if is_owner else None,
        islands=islands,
    )


def _cluster_description_generic(
    *, cluster_cpi: str, viewer: Organisation | None
) -> ClusterDescription | None:
    cluster = Cluster.objects.select_related("hub", "accelerator", "operator").filter(cpi=cluster_cpi).first()
    return None if cluster is None else cluster_describe(cluster=cluster, viewer=viewer)


# One statement, one snapshot: the cluster with its operator, hub and chip, the standard card in force
# and every island (a cluster always has at least one; the LEFT JOIN still answers for one without).
# Resolution of a full identifier is the hot read of the catalogue, and building this through the ORM
# (three querysets compiled per request) cost more CPU than PostgreSQL spent answering them.
_DESCRIBE_SQL = """
SELECT c.cpi, c.operator_id, o.slug, o.name, h.code, c.site, c.status, c.health, c.total_cards,
       c.available_cards, c.last_heartbeat_at, c.endpoint_url,
       a.slug, a.vendor, a.model, a.spec_status, a.dense_fp16_tflops, a.memory_gb,
       a.memory_bandwidth_gbps, a.interconnect,
       (SELECT s.dense_fp16_tflops FROM federation_standardcard s
         WHERE s.effective_from <= %s ORDER BY s.version DESC LIMIT 1),
       i.cpi, i.name, i.fabric, i.cards, i.available_cards, i.unhealthy_cards, i.reported_at
  FROM federation_cluster c
  JOIN core_organisation o ON o.id = c.operator_id
  JOIN federation_hub h ON h.id = c.hub_id
  JOIN federation_accelerator a ON a.id = c.accelerator_id
  LEFT JOIN federation_island i ON i.cluster_id = c.id
 WHERE c.cpi = %s
 ORDER BY i.name
"""


def _cluster_description_postgres(
    *, cluster_cpi: str, viewer: Organisation | None
) -> ClusterDescription | None:
    with connection.cursor() as cursor:
        cursor.execute(_DESCRIBE_SQL, [timezone.now(), cluster_cpi])
        rows = cursor.fetchall()
    if not rows:
        return None
    (cpi, operator_id, operator_slug, operator_name, hub, site, status, health, total, available, beat_at,
     endpoint_url, slug, vendor, model, spec_status, tflops, memory_gb, bandwidth, interconnect,
     standard_tflops) = rows[0][:21]  # fmt: skip
    if standard_tflops is None:  # a platform always has v1 (data migration); this is a broken database
        raise StandardCard.DoesNotExist("No standard-card definition is in force.")
    factor = standard_card_factor_of(tflops=tflops, standard_tflops=standard_tflops)
    chip = ChipSpec(
        slug=slug,
        vendor=vendor,
        model=model,
        spec_status=spec_status,
        dense_fp16_tflops=tflops,
        memory_gb=memory_gb,
        memory_bandwidth_gbps=bandwidth,
        interconnect=interconnect,
        standard_card_factor=factor,
    )
    islands = [
        IslandDescription(
            cpi=row[21],
            name=row[22],
            fabric=row[23],
            cards=row[24],
            available_cards=row[25],
            unhealthy_cards=row[26],
            standard_cards=_standard_cards(row[24], factor),
            reported_at=row[27],
        )
        for row in rows
        if row[21] is not None
    ]
    return ClusterDescription(
        cpi=cpi,
        operator=operator_slug,
        operator_name=operator_name,
        hub=hub,
        site=site,
        chip=chip,
        status=status,
        health=health,
        total_cards=total,
        available_cards=available,
        total_standard_cards=_standard_cards(total, factor),
        available_standard_cards=_standard_cards(available, factor),
        last_heartbeat_at=beat_at,
        endpoint_url=endpoint_url if viewer is not None and viewer.pk == operator_id else None,
        islands=islands,
    )


def cluster_description_get(*, cpi: str, viewer: Organisation | None) -> ClusterDescription | None:
    """The resource description of the cluster named ``cpi`` (any status, retired included), or None.
    Read fresh from the database on every call: K2 changes with every heartbeat. One statement on
    PostgreSQL; the ORM elsewhere (the same description, tests/federation/test_resolve.py compares them)."""
    if connection.vendor == "postgresql":
        return _cluster_description_postgres(cluster_cpi=cpi, viewer=viewer)
    return _cluster_description_generic(cluster_cpi=cpi, viewer=viewer)


def resolve(*, identifier: str, viewer: Organisation | None) -> Resolution:
    """Resolve a compute identifier hierarchically.

    - ``cpi:<operator>`` → the operator, a summary per hub, and its clusters;
    - ``cpi:<operator>:<hub>`` → the operator's clusters in that hub;
    - ``cpi:<operator>:<hub>:<cluster>`` → the cluster's resource description;
    - ``cpi:<operator>:<hub>:<cluster>:<island>`` → the same, plus the island.

    Retired clusters are left out of prefix listings but still resolve by their full identifier (so
    old leases and invoices can name them). Nothing is cached: every answer shows the capacity (K2) of
    the last heartbeat applied. Raises InvalidIdentifierError, IdentifierNotFoundError.
    """
    try:
        parsed = identifiers.parse(identifier)
    except identifiers.IdentifierError as exc:
        raise InvalidIdentifierError(str(exc), extra={"cpi": identifier, "reason": exc.reason}) from None
    if parsed.level <= identifiers.Level.HUB:
        operator = Organisation.objects.filter(slug=parsed.operator, is_operator=True).first()
        if operator is None:
            raise IdentifierNotFoundError(
                _("No operator %(operator)r.") % {"operator": parsed.operator}, extra={"cpi": identifier}
            )
        # The listing shows hub and chip codes only: no operator join (it is the one asked about).
        clusters = Cluster.objects.filter(operator=operator).exclude(status="retired")
        hubs = None
        if parsed.level == identifiers.Level.HUB:
            clusters = clusters.filter(hub__code=parsed.hub)
        else:
            hubs = [
                HubSummary(
                    hub=row["hub__code"],
                    clusters=row["n"],
                    total_cards=row["k1"] or 0,
                    available_cards=row["k2"] or 0,
                )
                for row in clusters.order_by()
                .values("hub__code", "hub__sort_order")
                .annotate(n=Count("pk"), k1=Sum("total_cards"), k2=Sum("available_cards"))
                .order_by("hub__sort_order")
            ]
        return Resolution(
            identifier=identifier,
            level=parsed.level.name.lower(),
            operator=OperatorRef(slug=operator.slug, name=operator.name),
            hubs=hubs,
            clusters=clusters.select_related("hub", "accelerator").order_by("cpi"),
        )

    cluster_cpi = str(parsed.cluster_identifier)
    description = cluster_description_get(cpi=cluster_cpi, viewer=viewer)
    if description is None:
        raise IdentifierNotFoundError(
            _("No cluster %(cpi)r.") % {"cpi": cluster_cpi}, extra={"cpi": identifier}
        )
    island = None
    if parsed.level == identifiers.Level.ISLAND:
        island = next((i for i in description.islands if i.cpi == identifier), None)
        if island is None:
            raise IdentifierNotFoundError(
                _("No island %(cpi)r.") % {"cpi": identifier}, extra={"cpi": identifier}
            )
    return Resolution(
        identifier=identifier,
        level=parsed.level.name.lower(),
        operator=OperatorRef(slug=description.operator, name=description.operator_name),
        cluster=description,
        island=island,
    )


# --- What an operator's heartbeat reports (K2) and how long it binds -------------------------------
#
# ``available_cards`` in a heartbeat is, per island, the cards Cardhour may have: the island's healthy cards
# minus those busy with anything that is NOT a Cardhour lease (the operator's own work, another market).
# Cards running or reserved for Cardhour leases count as available: the platform subtracts its own holds
# itself, exactly once, so an agent never has to know which of its leases the platform thinks have started.
# What the report keeps from sale ("withheld") is therefore ``cards - unhealthy - available``, and it binds
# every instant before the report expires: the cluster's last heartbeat (server time) plus the interval
# times the missed-beat limit, the moment the heartbeat monitor would take the cluster offline. A newer beat
# replaces the figures and moves the expiry on; islands a beat does not name keep their last figures.
# After the expiry, and for instants after it, the declared cards (minus unhealthy) are what counts.


def heartbeat_report_ttl() -> timedelta:
    """How long a heartbeat's figures bind sales: CARDHOUR_HEARTBEAT_INTERVAL_SECONDS ×
    CARDHOUR_HEARTBEAT_MISSED_LIMIT (the heartbeat monitor's own limit)."""
    return timedelta(
        seconds=settings.CARDHOUR_HEARTBEAT_INTERVAL_SECONDS * settings.CARDHOUR_HEARTBEAT_MISSED_LIMIT
    )


def heartbeat_report_expires_at(*, last_heartbeat_at: datetime | None) -> datetime | None:
    """The instant a cluster's last heartbeat stops binding sales (None: it never beat, so only its
    declared cards count)."""
    if last_heartbeat_at is None:
        return None
    return last_heartbeat_at + heartbeat_report_ttl()


# --- The heartbeat monitor's mass-miss hold -------------------------------------------------------------
#
# One cluster missing its beats is a cluster in trouble; most of the fleet missing them at once, across hubs,
# is far more likely the platform failing to read them (web tier overloaded, ingress or DNS broken, the
# platform itself just back from downtime) or every agent failing alike (a bad agent release, an expired
# certificate): the clusters, and the buyers' jobs on them, are very likely still running. Failing them all
# over would interrupt those jobs and pile the failover's own load on a platform already failing. So the
# monitor holds: it takes nobody offline, and says so loudly, until the beats come back or staff override.
# A real outage of a few hubs still fails over: the hubs that look down must carry most of the fleet.


@dataclass(frozen=True)
class HubHeartbeats:
    """One hub as the heartbeat monitor sees it. ``clusters``: those it watches (active, draining, or
    offline because of missed beats); ``missing``: of them, those overdue now plus those taken offline for
    missed beats within the last missed-beat window (so a hold is not escaped by taking a few each run)."""

    hub: str
    clusters: int
    overdue: int
    missing: int

    def disrupted(self, hub_share: float) -> bool:
        return self.missing > 0 and self.missing >= hub_share * self.clusters


@dataclass(frozen=True)
class HeartbeatAssessment:
    at: datetime
    cutoff: datetime
    hubs: tuple[HubHeartbeats, ...]
    holding: bool

    @property
    def overdue(self) -> int:
        return sum(hub.overdue for hub in self.hubs)

    @property
    def missing(self) -> int:
        return sum(hub.missing for hub in self.hubs)

    @property
    def clusters(self) -> int:
        return sum(hub.clusters for hub in self.hubs)

    def summary(self) -> str:
        """One line for logs and staff: how many are missing, where."""
        worst = sorted(self.hubs, key=lambda hub: (-hub.missing, hub.hub))
        hubs = ", ".join(f"{hub.hub} {hub.missing}/{hub.clusters}" for hub in worst if hub.missing)
        return f"{self.missing} of {self.clusters} clusters missing heartbeats ({hubs or 'none'})"


def heartbeat_hold_applies(hubs: Sequence[HubHeartbeats]) -> bool:
    """The hold rule (settings: CARDHOUR_HEARTBEAT_HOLD_*): at least HOLD_MIN_CLUSTERS clusters missing, and
    the hubs with at least HOLD_HUB_SHARE of their clusters missing carry at least HOLD_FLEET_SHARE of the
    fleet. HOLD_MIN_CLUSTERS ≤ 0 turns the hold off."""
    least = settings.CARDHOUR_HEARTBEAT_HOLD_MIN_CLUSTERS
    if least <= 0 or sum(hub.missing for hub in hubs) < least:
        return False
    hub_share = settings.CARDHOUR_HEARTBEAT_HOLD_HUB_SHARE
    disrupted = sum(hub.clusters for hub in hubs if hub.disrupted(hub_share))
    return disrupted >= settings.CARDHOUR_HEARTBEAT_HOLD_FLEET_SHARE * sum(hub.clusters for hub in hubs)


def heartbeat_cutoff(*, now: datetime) -> datetime:
    """A cluster whose last sign of life (last heartbeat, or registration if it never beat) is older than
    this has missed CARDHOUR_HEARTBEAT_MISSED_LIMIT beats."""
    return now - heartbeat_report_ttl()


def heartbeat_overdue_q(*, cutoff: datetime) -> Q:
    return Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True, registered_at__lt=cutoff)


def heartbeat_monitor_assess(*, now: datetime | None = None) -> HeartbeatAssessment:
    """The fleet as the heartbeat monitor sees it at ``now``, per hub, and whether the mass-miss hold applies.
    One aggregate over clusters: a pass over every live cluster (no index on last_heartbeat_at: migration
    federation 0009)."""
    now = now or timezone.now()
    cutoff = heartbeat_cutoff(now=now)
    live = Q(status__in=[ClusterStatus.ACTIVE, ClusterStatus.DRAINING])
    offline_for_beats = Q(status=ClusterStatus.OFFLINE, offline_cause=Cluster.OfflineCause.HEARTBEAT)
    rows = (
        Cluster.objects.filter(live | offline_for_beats)
        .values("hub__code")
        .annotate(
            clusters=Count("id"),
            overdue=Count("id", filter=live & heartbeat_overdue_q(cutoff=cutoff)),
            recent=Count("id", filter=offline_for_beats & Q(offline_at__gte=cutoff)),
        )
        .order_by("hub__code")
    )
    hubs = tuple(
        HubHeartbeats(
            hub=row["hub__code"],
            clusters=row["clusters"],
            overdue=row["overdue"],
            missing=row["overdue"] + row["recent"],
        )
        for row in rows
    )
    return HeartbeatAssessment(at=now, cutoff=cutoff, hubs=hubs, holding=heartbeat_hold_applies(hubs))


def island_withheld_cards(*, cards: int, unhealthy_cards: int, available_cards: int) -> int:
    """Cards of an island its operator's last report keeps from Cardhour: healthy cards not available."""
    return max(cards - unhealthy_cards - available_cards, 0)


@dataclass(frozen=True)
class IslandColumns:
    """Every island not in a retired cluster, one column each (integers as int64 arrays), aligned, in no
    particular order: ids, CPIs, cluster ids, cards, unhealthy cards, fabrics, available cards (K2)."""

    id: np.ndarray
    cpi: list[str]
    cluster_id: np.ndarray
    cards: np.ndarray
    unhealthy_cards: np.ndarray
    fabric: list[str]
    available_cards: np.ndarray


@dataclass(frozen=True)
class CatalogRows:
    """Flat rows of the whole capacity catalogue, for a matcher to index in memory.

    ``islands``: columns (see IslandColumns);
    ``clusters``: (cluster id, CPI, operator id, hub code, status, accelerator slug, last heartbeat or None);
    ``accelerators``: (slug, dense FP16 TFLOPS or None, memory GB or None);
    ``latencies``: (source hub code, target hub code, latency ms).
    """

    islands: IslandColumns
    clusters: list[tuple[int, str, int, str, str, str, datetime | None]]
    accelerators: list[tuple[str, Decimal | None, Decimal | None]]
    latencies: list[tuple[str, str, Decimal]]
    standard_tflops: Decimal


def _island_columns() -> IslandColumns:
    """The islands of ``catalog_rows``, a column at a time. On PostgreSQL one row of arrays (the CPIs and
    fabrics joined into one string each): a new process reads 100,000 islands in about a tenth of the
    CPU that a row per island through the ORM costs, which is most of a first quote's wait. Elsewhere
    through the ORM."""
    if connection.vendor == "postgresql":
        island = connection.ops.quote_name(Island._meta.db_table)
        cluster = connection.ops.quote_name(Cluster._meta.db_table)

        # Integers as packed columns (core.packed), aligned; CPIs and fabric codes joined in the same scan
        # never hold a line break or a comma (federation.identifiers, Island.Fabric).
        def ints(column: str) -> str:
            return packed_ints(f"i.{column}")

        sql = (
            f"SELECT {ints('id')}, string_agg(i.cpi, E'\\n'), {ints('cluster_id')}, {ints('cards')}, "  # noqa: S608
            f"{ints('unhealthy_cards')}, string_agg(i.fabric, ','), {ints('available_cards')} "
            f"FROM {island} i JOIN {cluster} c ON c.id = i.cluster_id WHERE c.status <> %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, ["retired"])
            ids, cpis, clusters, cards, unhealthy, fabrics, available = cursor.fetchone()
        if ids is None:
            return _island_columns_of([])

        return IslandColumns(
            unpacked_ints(ids),
            cpis.split("\n"),
            unpacked_ints(clusters),
            unpacked_ints(cards),
            unpacked_ints(unhealthy),
            fabrics.split(","),
            unpacked_ints(available),
        )
    rows = list(
        Island.objects.exclude(cluster__status="retired")
        .order_by()
        .values_list("pk", "cpi", "cluster_id", "cards", "unhealthy_cards", "fabric", "available_cards")
    )
    return _island_columns_of(rows)


def _island_columns_of(rows: list[tuple[int, str, int, int, int, str, int]]) -> IslandColumns:
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(7)]

    def ints(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    ids, cpis, clusters, cards, unhealthy, fabrics, available = columns
    return IslandColumns(
        ints(ids), cpis, ints(clusters), ints(cards), ints(unhealthy), fabrics, ints(available)
    )


def catalog_rows() -> CatalogRows:
    """Every island and cluster that is not retired, the chip catalogue, the latency matrix and the
    standard card in force: four flat queries, no joins per row."""
    clusters = list(
        Cluster.objects.exclude(status="retired").values_list(
            "pk", "cpi", "operator_id", "hub__code", "status", "accelerator__slug", "last_heartbeat_at"
        )
    )
    return CatalogRows(
        islands=_island_columns(),
        clusters=clusters,
        accelerators=list(Accelerator.objects.values_list("slug", "dense_fp16_tflops", "memory_gb")),
        latencies=list(HubLatency.objects.values_list("source__code", "target__code", "latency_ms")),
        standard_tflops=standard_card_current().dense_fp16_tflops,
    )
