"""Every federation write: registering clusters and islands, status changes, heartbeats, latencies.

All services are atomic and keyword-only. A service that changes a cluster locks its row first, so a
heartbeat, a status change and an island edit of one cluster are serialised.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _

from core.db import bound_cursor
from core.errors import DomainError, InvalidInputError
from core.models import Organisation
from core.net import endpoint_url_check
from core.types import Actor
from federation import identifiers, selectors
from federation.errors import (
    ClusterRetiredError,
    IdentifierOperatorMismatchError,
    IdentifierTakenError,
    InvalidHeartbeatError,
    InvalidIdentifierError,
    InvalidStatusTransitionError,
    LatencySourceNotOperatedError,
    MaintenanceInvalidError,
    UnknownHubError,
    UnknownIslandError,
)
from federation.models import (
    Accelerator,
    Cluster,
    ClusterMaintenance,
    ClusterStatus,
    ClusterStatusChange,
    Fabric,
    Health,
    Hub,
    HubLatency,
    Island,
    IssuedIdentifier,
)
from federation.selectors import accelerator_resolve, hub_and_chip_get
from federation.types import HeartbeatResult, IslandReport, IslandSpec, LatencyMeasurement

logger = logging.getLogger("cardhour.federation.heartbeats")

# A heartbeat stamped further ahead than this is a broken agent clock, not a beat from the future.
HEARTBEAT_MAX_CLOCK_SKEW = timedelta(minutes=5)

# Which status an operator may move a cluster to from which. `offline` entered by the heartbeat monitor
# is left by heartbeats; `retired` is final (its identifiers are never reused).
_OPERATOR_TRANSITIONS: dict[str, set[str]] = {
    ClusterStatus.ACTIVE: {ClusterStatus.DRAINING, ClusterStatus.OFFLINE, ClusterStatus.RETIRED},
    ClusterStatus.DRAINING: {ClusterStatus.ACTIVE, ClusterStatus.OFFLINE, ClusterStatus.RETIRED},
    ClusterStatus.OFFLINE: {ClusterStatus.ACTIVE, ClusterStatus.DRAINING, ClusterStatus.RETIRED},
    ClusterStatus.RETIRED: set(),
}


def _retired_unchangeable(cpi: str) -> str:
    return _("%(cpi)s is retired and cannot change.") % {"cpi": cpi}


def _parse_cluster_identifier(*, cpi: str, operator: Organisation) -> identifiers.ComputeIdentifier:
    try:
        identifier = identifiers.parse(cpi)
    except identifiers.IdentifierError as exc:
        raise InvalidIdentifierError(str(exc), extra={"cpi": cpi, "reason": exc.reason}) from None
    if identifier.level != identifiers.Level.CLUSTER:
        raise InvalidIdentifierError(
            _("%(cpi)r is not a cluster identifier (cpi:<operator>:<hub>:<cluster>).") % {"cpi": cpi},
            extra={"cpi": cpi, "reason": "not_a_cluster"},
        )
    if identifier.operator != operator.slug:
        raise IdentifierOperatorMismatchError(
            _("The operator segment %(segment)r is not yours (%(operator)r).")
            % {"segment": identifier.operator, "operator": operator.slug},
            extra={"cpi": cpi, "operator": operator.slug},
        )
    return identifier


def _validate_island_specs(specs: Sequence[IslandSpec]) -> None:
    errors: dict[str, list[str]] = {}
    limit = settings.CARDHOUR_MAX_ISLANDS_PER_CLUSTER
    if not specs:
        errors["islands"] = [_("A cluster needs at least one island.")]
    elif len(specs) > limit:
        errors["islands"] = [_("At most %(limit)d islands per cluster.") % {"limit": limit}]
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        field_errors = []
        if not identifiers.is_valid(f"cpi:x:ext:x:{spec.name}"):
            field_errors.append(_("name must be 1–32 characters of a–z, 0–9 and inner hyphens"))
        if spec.name in seen:
            field_errors.append(_("duplicate island name %(name)r") % {"name": spec.name})
        seen.add(spec.name)
        if spec.cards < 1:
            field_errors.append(_("cards must be at least 1"))
        if spec.fabric not in Fabric.values:
            field_errors.append(
                _("fabric must be one of %(choices)s") % {"choices": ", ".join(Fabric.values)}
            )
        if field_errors:
            errors[f"islands[{index}]"] = field_errors
    if errors:
        raise InvalidInputError(_("Some islands are invalid."), extra={"fields": errors})
    _check_cluster_size(sum(spec.cards for spec in specs))


def _check_cluster_size(total_cards: int) -> None:
    limit = settings.CARDHOUR_MAX_CARDS_PER_CLUSTER
    if total_cards > limit:
        raise InvalidInputError(
            _("A cluster may hold at most %(limit)d cards; this one would hold %(total)d.")
            % {"limit": limit, "total": total_cards},
            code="cluster_too_large",
            extra={"total_cards": total_cards, "limit": limit},
        )


def _issue_identifiers(
    *, operator: Organisation, cluster_cpi: str | None, island_cpis: Iterable[str]
) -> None:
    """Claim identifiers for good. Raises IdentifierTakenError if any was ever issued."""
    rows = []
    if cluster_cpi is not None:
        rows.append(IssuedIdentifier(cpi=cluster_cpi, kind=IssuedIdentifier.Kind.CLUSTER, operator=operator))
    rows.extend(
        IssuedIdentifier(cpi=cpi, kind=IssuedIdentifier.Kind.ISLAND, operator=operator) for cpi in island_cpis
    )
    wanted = [row.cpi for row in rows]
    taken = list(IssuedIdentifier.objects.filter(cpi__in=wanted).values_list("cpi", flat=True)[:20])
    if taken:
        raise IdentifierTakenError(
            _("Identifier already issued: %(taken)s. Identifiers are never reused.")
            % {"taken": ", ".join(sorted(taken))},
            extra={"taken": sorted(taken)},
        )
    try:
        # The savepoint keeps the outer transaction usable for PostgreSQL when a concurrent registration
        # claimed the same identifier between the check above and this insert.
        with transaction.atomic():
            IssuedIdentifier.objects.bulk_create(rows)
    except IntegrityError as exc:
        raise IdentifierTakenError(
            _("Identifier already issued (claimed concurrently). Identifiers are never reused."),
            extra={"taken": wanted[:20]},
        ) from exc


def _record_status_change(
    *,
    cluster: Cluster,
    from_status: str,
    to_status: str,
    actor: Actor,
    reason: str,
    at: datetime | None = None,
) -> ClusterStatusChange:
    return ClusterStatusChange.objects.create(
        cluster=cluster,
        from_status=from_status,
        to_status=to_status,
        changed_at=at or timezone.now(),
        actor_user=actor.user if actor.user is not None and actor.user.pk else None,
        actor_token=actor.token,
        actor_label=actor.label[:200],
        reason=reason[:500],
    )


def _refresh_cluster_totals(cluster: Cluster) -> None:
    totals = Island.objects.filter(cluster=cluster).aggregate(
        total=Coalesce(Sum("cards"), 0), available=Coalesce(Sum("available_cards"), 0)
    )
    cluster.total_cards = totals["total"]
    cluster.available_cards = totals["available"]
    cluster.save(update_fields=["total_cards", "available_cards", "updated_at"])


def cluster_register(
    *,
    actor: Actor,
    operator: Organisation,
    cpi: str,
    site: str,
    accelerator_slug: str,
    islands: Sequence[IslandSpec],
    endpoint_url: str = "",
) -> Cluster:
    """Register a cluster; see cluster_register_idempotent for the rules. Returns the cluster."""
    cluster, _ = cluster_register_idempotent(
        actor=actor,
        operator=operator,
        cpi=cpi,
        site=site,
        accelerator_slug=accelerator_slug,
        islands=islands,
        endpoint_url=endpoint_url,
    )
    return cluster


def _same_registration(
    cluster: Cluster, *, site: str, accelerator: Accelerator, islands: Sequence[IslandSpec], endpoint_url: str
) -> bool:
    current = sorted((i.name, i.cards, i.fabric) for i in Island.objects.filter(cluster=cluster))
    wanted = sorted((spec.name, spec.cards, spec.fabric) for spec in islands)
    return (
        cluster.site == site
        and cluster.accelerator_id == accelerator.pk
        and cluster.endpoint_url == endpoint_url
        and current == wanted
    )


@transaction.atomic
def cluster_register_idempotent(
    *,
    actor: Actor,
    operator: Organisation,
    cpi: str,
    site: str,
    accelerator_slug: str,
    islands: Sequence[IslandSpec],
    endpoint_url: str = "",
) -> tuple[Cluster, bool]:
    """Register a cluster and its islands under ``cpi`` for ``operator``; returns (cluster, created).

    Rules: the identifier parses and names a cluster; its operator segment is ``operator``'s slug; the
    hub exists; ``accelerator_slug`` is a catalog slug or an alias of exactly one model
    (federation.selectors.accelerator_resolve, as fleet import); islands are 1..N with unique valid names, cards ≥ 1
    and a known fabric; neither the cluster's nor any island's identifier was ever issued. Islands start
    with every card available (K2 = K1) until the first heartbeat says otherwise.

    A retried registration (same identifier, same site, chip, endpoint and islands) returns the existing
    cluster with created=False and writes nothing; the same identifier with a different body is
    IdentifierTakenError.

    Raises InvalidIdentifierError, IdentifierOperatorMismatchError, UnknownHubError,
    UnknownAcceleratorError, AcceleratorAmbiguousError, IdentifierTakenError, InvalidInputError. Writes
    nothing on any error.
    """
    identifier = _parse_cluster_identifier(cpi=cpi, operator=operator)
    _validate_island_specs(islands)
    endpoint_url_check(endpoint_url)
    hub, accelerator = hub_and_chip_get(hub_code=identifier.hub or "", accelerator_name=accelerator_slug)
    if hub is None:
        raise UnknownHubError(
            _("Unknown hub %(hub)r.") % {"hub": identifier.hub}, extra={"hub": identifier.hub}
        )
    if accelerator is None:  # an alias, or unknown: the catalog's own rules
        accelerator = accelerator_resolve(name=accelerator_slug)
    island_cpis = [str(identifier.child(spec.name)) for spec in islands]
    if connection.vendor == "postgresql":
        return _register_postgres(
            actor=actor,
            operator=operator,
            identifier=identifier,
            hub=hub,
            accelerator=accelerator,
            site=site,
            endpoint_url=endpoint_url,
            islands=islands,
            island_cpis=island_cpis,
        )
    existing = Cluster.objects.filter(cpi=cpi, operator=operator).first()
    if existing is not None and _same_registration(
        existing, site=site, accelerator=accelerator, islands=islands, endpoint_url=endpoint_url
    ):
        return existing, False
    _issue_identifiers(operator=operator, cluster_cpi=cpi, island_cpis=island_cpis)

    total = sum(spec.cards for spec in islands)
    cluster = Cluster.objects.create(
        operator=operator,
        cpi=cpi,
        name=identifier.cluster or "",
        hub=hub,
        site=site,
        accelerator=accelerator,
        endpoint_url=endpoint_url,
        status=ClusterStatus.ACTIVE,
        total_cards=total,
        available_cards=total,
    )
    created = Island.objects.bulk_create(
        [
            Island(
                cluster=cluster,
                cpi=island_cpi,
                name=spec.name,
                cards=spec.cards,
                fabric=spec.fabric,
                available_cards=spec.cards,
            )
            for spec, island_cpi in zip(islands, island_cpis, strict=True)
        ]
    )
    _record_status_change(
        cluster=cluster, from_status="", to_status=ClusterStatus.ACTIVE, actor=actor, reason="registered"
    )
    # SQLite's (binary) name order is Python's.
    _islands_loaded(cluster, sorted(created, key=lambda island: island.name))
    return cluster, True


# Registration on PostgreSQL: one statement claims every identifier (INSERT … ON CONFLICT DO NOTHING, so a
# concurrent claim waits for the other transaction and then counts as taken instead of raising), and only
# if it claimed all of them inserts the cluster, its islands (from arrays, set-based) and the history row.
# The statement returns the new cluster's id and the identifiers it claimed: all claimed is the common
# case, a new registration in one round trip; none claimed is a retry (compared with what is stored) or a
# reused identifier; some claimed is a clash, and raising rolls those claims back with the transaction.
_REGISTER_SQL = """
WITH issued AS (
    INSERT INTO federation_issuedidentifier (cpi, kind, operator_id, issued_at)
    SELECT w.cpi, w.kind, %(operator_id)s, %(now)s
      FROM unnest(%(issue_cpis)s::varchar[], %(issue_kinds)s::varchar[]) AS w(cpi, kind)
        ON CONFLICT (cpi) DO NOTHING
    RETURNING cpi
), cluster AS (
    INSERT INTO federation_cluster (operator_id, cpi, name, hub_id, site, accelerator_id, endpoint_url,
                                    status, status_before_offline, offline_cause, health, total_cards,
                                    available_cards, registered_at, updated_at)
    SELECT %(operator_id)s, %(cpi)s, %(name)s, %(hub_id)s, %(site)s, %(accelerator_id)s, %(endpoint_url)s,
           %(status)s, '', '', %(health)s, %(total)s, %(total)s, %(now)s, %(now)s
     WHERE (SELECT count(*) FROM issued) = %(n_issue)s
        ON CONFLICT DO NOTHING
    RETURNING id
), islands AS (
    INSERT INTO federation_island (cluster_id, cpi, name, cards, fabric, available_cards, unhealthy_cards,
                                   created_at)
    SELECT cluster.id, i.cpi, i.name, i.cards, i.fabric, i.cards, 0, %(now)s
      FROM cluster,
           unnest(%(island_cpis)s::varchar[], %(island_names)s::varchar[], %(island_cards)s::integer[],
                  %(island_fabrics)s::varchar[]) AS i(cpi, name, cards, fabric)
    RETURNING id, name
), history AS (
    INSERT INTO federation_clusterstatuschange (cluster_id, from_status, to_status, changed_at, actor_user_id,
                                                actor_token_id, actor_label, reason)
    SELECT cluster.id, '', %(status)s, %(now)s, %(actor_user_id)s, %(actor_token_id)s, %(actor_label)s,
           'registered'
      FROM cluster
    RETURNING id
)
SELECT (SELECT id FROM cluster), ARRAY(SELECT cpi FROM issued),
       ARRAY(SELECT id FROM islands ORDER BY name), ARRAY(SELECT name FROM islands ORDER BY name),
       (SELECT count(*) FROM history)
"""


def _island_registered(
    *, cluster: Cluster, spec: IslandSpec, cpi: str, pk: int | None, at: datetime
) -> Island:
    island = Island(
        pk=pk,
        cluster=cluster,
        cpi=cpi,
        name=spec.name,
        cards=spec.cards,
        fabric=spec.fabric,
        available_cards=spec.cards,
        unhealthy_cards=0,
        reported_at=None,
        created_at=at,
    )
    island._state.adding = False
    island._state.db = connection.alias
    return island


def _islands_loaded(cluster: Cluster, islands: list[Island]) -> None:
    """Hand a new cluster back with its islands (in the database's name order) prefetched, so the caller
    can show what was registered without reading it back. Stored as prefetch_related stores them (an
    evaluated queryset): ``cluster.islands.all()`` answers from it, ``.filter()`` and the like still query."""
    loaded = cluster.islands.all()
    loaded._result_cache = islands
    loaded._prefetch_done = True  # type: ignore[attr-defined]
    cluster._prefetched_objects_cache = {"islands": loaded}  # type: ignore[attr-defined]  # Django's own slot


def _register_postgres(
    *,
    actor: Actor,
    operator: Organisation,
    identifier: identifiers.ComputeIdentifier,
    hub: Hub,
    accelerator: Accelerator,
    site: str,
    endpoint_url: str,
    islands: Sequence[IslandSpec],
    island_cpis: Sequence[str],
) -> tuple[Cluster, bool]:
    cpi = str(identifier)
    wanted = [cpi, *island_cpis]
    now = timezone.now()
    total = sum(spec.cards for spec in islands)
    actor_user = actor.user if actor.user is not None and actor.user.pk else None
    with connection.cursor() as cursor:
        cursor.execute(
            _REGISTER_SQL,
            {
                "operator_id": operator.pk,
                "now": now,
                "issue_cpis": wanted,
                "issue_kinds": [IssuedIdentifier.Kind.CLUSTER.value]
                + [IssuedIdentifier.Kind.ISLAND.value] * len(island_cpis),
                "n_issue": len(wanted),
                "cpi": cpi,
                "name": identifier.cluster or "",
                "hub_id": hub.pk,
                "site": site,
                "accelerator_id": accelerator.pk,
                "endpoint_url": endpoint_url,
                "status": ClusterStatus.ACTIVE.value,
                "health": Health.UNKNOWN.value,
                "total": total,
                "island_cpis": list(island_cpis),
                "island_names": [spec.name for spec in islands],
                "island_cards": [spec.cards for spec in islands],
                "island_fabrics": [spec.fabric for spec in islands],
                "actor_user_id": actor_user.pk if actor_user is not None else None,
                "actor_token_id": actor.token.pk if actor.token is not None else None,
                "actor_label": actor.label[:200],
            },
        )
        row = cursor.fetchone()
    assert row is not None  # a SELECT without FROM always answers one row
    cluster_id, claimed, island_ids, island_names, history_rows = row
    if cluster_id is not None:
        if len(island_ids) != len(islands) or history_rows != 1:  # the statement's own invariant
            raise RuntimeError(
                f"registration of {cpi} wrote {len(island_ids)} islands and {history_rows} history rows"
            )
        cluster = Cluster(
            pk=cluster_id,
            operator=operator,
            cpi=cpi,
            name=identifier.cluster or "",
            hub=hub,
            site=site,
            accelerator=accelerator,
            endpoint_url=endpoint_url,
            status=ClusterStatus.ACTIVE,
            health=Health.UNKNOWN,
            total_cards=total,
            available_cards=total,
            registered_at=now,
            updated_at=now,
        )
        cluster._state.adding = False
        cluster._state.db = connection.alias
        spec_of = {spec.name: spec for spec in islands}
        _islands_loaded(
            cluster,
            [
                _island_registered(cluster=cluster, spec=spec_of[name], cpi=f"{cpi}:{name}", pk=pk, at=now)
                for pk, name in zip(island_ids, island_names, strict=True)
            ],
        )
        return cluster, True
    if not claimed:
        existing = Cluster.objects.filter(cpi=cpi, operator=operator).first()
        if existing is not None and _same_registration(
            existing, site=site, accelerator=accelerator, islands=islands, endpoint_url=endpoint_url
        ):
            return existing, False
    taken = sorted(set(wanted) - set(claimed))
    # Raising rolls back whatever this statement claimed (the service is atomic).
    raise IdentifierTakenError(
        _("Identifier already issued: %(taken)s. Identifiers are never reused.")
        % {"taken": ", ".join(taken[:20])},
        extra={"taken": taken[:20]},
    )


def _lock_cluster(cluster: Cluster) -> Cluster:
    """The cluster's row, locked — and only that row: without ``of`` PostgreSQL also locks every joined row
    (the operator, the hub, the chip), so all heartbeats of an operator, a hub or a chip queued behind one
    another, and two of them taking those shared rows in different orders deadlocked (seen in
    benchmarks.soak: heartbeats answered 500 under load)."""
    return (
        Cluster.objects.select_for_update(of=("self",))
        .select_related("hub", "accelerator", "operator")
        .get(pk=cluster.pk)
    )


@transaction.atomic
def cluster_update(
    *,
    actor: Actor,
    cluster: Cluster,
    site: str | None = None,
    endpoint_url: str | None = None,
    status: str | None = None,
    reason: str = "",
) -> Cluster:
    """Change a cluster's site, dispatch endpoint or status (see cluster_status_set)."""
    cluster = _lock_cluster(cluster)
    if cluster.status == ClusterStatus.RETIRED:
        raise ClusterRetiredError(_retired_unchangeable(cluster.cpi), extra={"cpi": cluster.cpi})
    fields = []
    if site is not None and site != cluster.site:
        cluster.site = site
        fields.append("site")
    if endpoint_url is not None and endpoint_url != cluster.endpoint_url:
        endpoint_url_check(endpoint_url)
        cluster.endpoint_url = endpoint_url
        fields.append("endpoint_url")
    if fields:
        cluster.save(update_fields=[*fields, "updated_at"])
    if status is not None and status != cluster.status:
        cluster = _status_set_locked(
            cluster=cluster, actor=actor, status=status, reason=reason or "set by operator"
        )
    return cluster


def _status_set_locked(*, cluster: Cluster, actor: Actor, status: str, reason: str) -> Cluster:
    if status not in _OPERATOR_TRANSITIONS.get(cluster.status, set()):
        raise InvalidStatusTransitionError(
            _("%(cpi)s cannot go from %(from)s to %(to)s.")
            % {"cpi": cluster.cpi, "from": cluster.status, "to": status},
            extra={"from": cluster.status, "to": status},
        )
    previous = cluster.status
    cluster.status = status
    if status == ClusterStatus.OFFLINE:
        cause = (
            Cluster.OfflineCause.OPERATOR if actor.organisation is not None else Cluster.OfflineCause.STAFF
        )
        cluster.offline_cause = cause
        cluster.status_before_offline = previous
        cluster.offline_at = timezone.now()
    else:
        cluster.offline_cause = ""
        cluster.status_before_offline = ""
    cluster.save(
        update_fields=["status", "offline_cause", "status_before_offline", "offline_at", "updated_at"]
    )
    _record_status_change(cluster=cluster, from_status=previous, to_status=status, actor=actor, reason=reason)
    return cluster


@transaction.atomic
def cluster_status_set(*, actor: Actor, cluster: Cluster, status: str, reason: str) -> Cluster:
    """Move a cluster to ``status`` (active, draining, offline, retired), recording who and why.

    Raises ClusterRetiredError for a retired cluster, InvalidStatusTransitionError otherwise.
    """
    cluster = _lock_cluster(cluster)
    if cluster.status == ClusterStatus.RETIRED:
        raise ClusterRetiredError(_retired_unchangeable(cluster.cpi), extra={"cpi": cluster.cpi})
    return _status_set_locked(cluster=cluster, actor=actor, status=status, reason=reason)


@transaction.atomic
def island_add(*, actor: Actor, cluster: Cluster, spec: IslandSpec) -> Island:
    """Add an island to a cluster. Raises InvalidIdentifierError, IdentifierTakenError, ClusterRetiredError."""
    cluster = _lock_cluster(cluster)
    if cluster.status == ClusterStatus.RETIRED:
        raise ClusterRetiredError(_("%(cpi)s is retired.") % {"cpi": cluster.cpi}, extra={"cpi": cluster.cpi})
    _validate_island_specs([spec])
    _check_cluster_size(cluster.total_cards + spec.cards)
    island_cpi = str(identifiers.parse(cluster.cpi).child(spec.name))
    _issue_identifiers(operator=cluster.operator, cluster_cpi=None, island_cpis=[island_cpi])
    island = Island.objects.create(
        cluster=cluster,
        cpi=island_cpi,
        name=spec.name,
        cards=spec.cards,
        fabric=spec.fabric,
        available_cards=spec.cards,
    )
    _refresh_cluster_totals(cluster)
    return island


@transaction.atomic
def island_update(
    *, actor: Actor, island: Island, cards: int | None = None, fabric: str | None = None
) -> Island:
    """Change an island's card count (K1) or fabric. K2 and unhealthy cards are clamped to the new K1."""
    cluster = _lock_cluster(island.cluster)
    if cluster.status == ClusterStatus.RETIRED:
        raise ClusterRetiredError(_("%(cpi)s is retired.") % {"cpi": cluster.cpi}, extra={"cpi": cluster.cpi})
    island = Island.objects.get(pk=island.pk)
    _validate_island_specs(
        [
            IslandSpec(
                name=island.name,
                cards=island.cards if cards is None else cards,
                fabric=island.fabric if fabric is None else fabric,
            )
        ]
    )
    if cards is not None:
        _check_cluster_size(cluster.total_cards - island.cards + cards)
    if cards is not None:
        island.cards = cards
        island.unhealthy_cards = min(island.unhealthy_cards, cards)
        island.available_cards = min(island.available_cards, cards - island.unhealthy_cards)
    if fabric is not None:
        island.fabric = fabric
    island.save(update_fields=["cards", "available_cards", "unhealthy_cards", "fabric"])
    _refresh_cluster_totals(cluster)
    return island


@transaction.atomic
def heartbeat_record(
    *,
    actor: Actor,
    cluster: Cluster,
    sent_at: datetime,
    health: str,
    islands: Sequence[IslandReport],
    now: datetime | None = None,
) -> HeartbeatResult:
    """Record a heartbeat: the cluster is alive, and each named island has this many free (K2) and
    unhealthy cards. Islands not named keep their last report.

    A beat older than the last one applied is acknowledged but ignored (agents retry; order is not
    guaranteed). A cluster that went offline because it missed heartbeats returns to the status it had.

    Raises InvalidHeartbeatError (clock skew, bad counts), UnknownIslandError, ClusterRetiredError.
    """
    now = now or timezone.now()
    _heartbeat_check(sent_at=sent_at, health=health, now=now)
    beaten = _heartbeat_lock(cluster_id=cluster.pk)
    assert beaten is not None  # the caller's cluster exists; clusters are never deleted
    return _heartbeat_apply(
        actor=actor, cluster=beaten, sent_at=sent_at, health=health, islands=islands, now=now
    )


@transaction.atomic
def heartbeat_record_for_operator(
    *,
    actor: Actor,
    operator: Organisation,
    cpi: str,
    sent_at: datetime,
    health: str,
    islands: Sequence[IslandReport],
    now: datetime | None = None,
) -> HeartbeatResult:
    """heartbeat_record for ``operator``'s cluster ``cpi``, found and locked in one read (the API's path: no
    cluster model is built). Raises ClusterNotFoundError (federation.selectors.cluster_get_for_operator:
    another operator's cluster is not found either) before anything about the beat itself."""
    beaten = None
    # A value that is not a cluster identifier cannot name one (and NUL bytes never reach SQL).
    if identifiers.is_valid(cpi) and identifiers.parse(cpi).level == identifiers.Level.CLUSTER:
        beaten = _heartbeat_lock(operator_id=operator.pk, cpi=cpi)
    if beaten is None:  # the selector raises its own answer (or the cluster was registered just now)
        cluster = selectors.cluster_get_for_operator(operator=operator, cpi=cpi)
        beaten = _heartbeat_lock(cluster_id=cluster.pk)
        assert beaten is not None
    now = now or timezone.now()
    _heartbeat_check(sent_at=sent_at, health=health, now=now)
    return _heartbeat_apply(
        actor=actor, cluster=beaten, sent_at=sent_at, health=health, islands=islands, now=now
    )


@dataclass(frozen=True)
class HeartbeatBeat:
    """One cluster's beat in a batch (heartbeats_record_batch)."""

    cpi: str
    sent_at: datetime
    health: str
    islands: Sequence[IslandReport]


@dataclass(frozen=True)
class HeartbeatOutcome:
    """What became of one beat of a batch: its result, or the error the single-beat endpoint answers."""

    cpi: str
    result: HeartbeatResult | None = None
    error: DomainError | None = None


@transaction.atomic
def heartbeats_record_batch(
    *, actor: Actor, operator: Organisation, beats: Sequence[HeartbeatBeat], now: datetime | None = None
) -> list[HeartbeatOutcome]:
    """Record many of ``operator``'s clusters' beats at once: an agent that runs many clusters reports them in
    one request, so the request, its authentication and its transaction are paid once, not per cluster.

    Each beat has exactly the effect and the answer it would have alone (heartbeat_record_for_operator), and
    the beats are independent: one that fails (an unknown cluster, a retired one, an unknown island, impossible
    counts, a clock ahead) answers its error in its place and writes nothing of its own, and the others are
    applied. Outcomes come in the order of ``beats``. A cluster named twice is refused (InvalidInputError) before
    anything is written.

    On PostgreSQL the usual beats (a live cluster, a newer beat, every line naming one of its islands with
    possible counts) are applied by one statement for the whole batch, which locks the batch's clusters in id
    order (two batches cannot deadlock on them); the rest (a cluster coming back from a missed-heartbeat
    offline, or a beat with an error to name) go through the single-beat path, each in its own savepoint.
    """
    cpis = [beat.cpi for beat in beats]
    if len(set(cpis)) != len(cpis):
        twice = sorted({cpi for cpi in cpis if cpis.count(cpi) > 1})
        raise InvalidInputError(
            _("A cluster is named twice in one batch: %(cpis)s.") % {"cpis": ", ".join(twice)},
            code="duplicate_cluster",
            extra={"cpis": twice},
        )
    now = now or timezone.now()
    outcomes: dict[str, HeartbeatOutcome] = {}
    quick: list[HeartbeatBeat] = []
    for beat in beats:
        try:
            _heartbeat_check(sent_at=beat.sent_at, health=beat.health, now=now)
        except DomainError as exc:
            outcomes[beat.cpi] = HeartbeatOutcome(cpi=beat.cpi, error=exc)
            continue
        if connection.vendor == "postgresql" and _batchable(beat):
            quick.append(beat)
    if quick:
        outcomes.update(_heartbeats_write_postgres(operator_id=operator.pk, beats=quick, now=now))
    for beat in beats:
        if beat.cpi in outcomes:
            continue
        try:
            with transaction.atomic():  # a savepoint: a failing beat leaves nothing of its own
                result = heartbeat_record_for_operator(
                    actor=actor,
                    operator=operator,
                    cpi=beat.cpi,
                    sent_at=beat.sent_at,
                    health=beat.health,
                    islands=beat.islands,
                    now=now,
                )
        except DomainError as exc:
            outcomes[beat.cpi] = HeartbeatOutcome(cpi=beat.cpi, error=exc)
        else:
            outcomes[beat.cpi] = HeartbeatOutcome(cpi=beat.cpi, result=result)
    return [outcomes[cpi] for cpi in cpis]


def _batchable(beat: HeartbeatBeat) -> bool:
    """Whether the batch statement can take ``beat`` (the same conditions as _heartbeat_write_postgres's)."""
    names = [report.name for report in beat.islands]
    return (
        identifiers.is_valid(beat.cpi)
        and identifiers.parse(beat.cpi).level == identifiers.Level.CLUSTER
        and len(set(names)) == len(names)
        and all(
            0 <= r.available_cards <= _PG_INT_MAX
            and 0 <= r.unhealthy_cards <= _PG_INT_MAX
            and identifiers.is_segment(r.name)
            for r in beat.islands
        )
    )


# The batch form of _HEARTBEAT_SQL. ``target`` locks the batch's clusters of the operator in id order and reads
# them as locked (the latest committed row); ``fresh`` keeps the beats applied here: the cluster is neither
# retired nor offline for missed heartbeats (coming back writes a status change: the single-beat path), the beat
# is newer than the last one applied, and every line names one of the cluster's islands with counts that fit.
# Their islands and clusters are updated as in _HEARTBEAT_SQL. The answer has a row per cluster found: whether
# this statement applied the beat, or found it stale (which a retired cluster is not: it answers its error).
# Per-cluster figures are grouped once for the batch (``fitting``: the lines that name an island and fit it;
# ``reported`` / ``unreported``: the available cards of the islands the beat reports, as updated, and of the
# others, as they were), joined by cluster: as correlated subqueries each cluster rescanned every line of the
# batch, and a 50-cluster batch (500 lines) took 10.7–10.9 ms of PostgreSQL against 6.0–6.6 ms now.
_HEARTBEATS_SQL = """
WITH beat AS (
    SELECT * FROM jsonb_to_recordset(%(beats)s::jsonb)
        AS b(cpi text, sent_at timestamptz, health text, n_lines integer)
), line AS (
    SELECT * FROM jsonb_to_recordset(%(lines)s::jsonb)
        AS l(cpi text, name text, available_cards integer, unhealthy_cards integer)
), target AS (
    SELECT c.id, c.cpi, c.status, c.offline_cause, c.last_heartbeat_sent_at
      FROM federation_cluster AS c
     WHERE c.operator_id = %(operator_id)s AND c.cpi IN (SELECT cpi FROM beat)
     ORDER BY c.id
       FOR UPDATE
), fitting AS (
    SELECT t.id, count(*) AS n
      FROM target AS t JOIN line AS l ON l.cpi = t.cpi
      JOIN federation_island AS i ON i.cluster_id = t.id AND i.name = l.name
     WHERE l.available_cards + l.unhealthy_cards <= i.cards
     GROUP BY t.id
), fresh AS (
    SELECT t.id, t.cpi, b.sent_at, b.health
      FROM target AS t JOIN beat AS b ON b.cpi = t.cpi LEFT JOIN fitting AS k ON k.id = t.id
     WHERE t.status <> %(retired)s
       AND NOT (t.status = %(offline)s AND t.offline_cause = %(missed)s)
       AND (t.last_heartbeat_sent_at IS NULL OR t.last_heartbeat_sent_at < b.sent_at)
       AND b.n_lines = coalesce(k.n, 0)
), island AS (
    UPDATE federation_island AS i
       SET available_cards = l.available_cards, unhealthy_cards = l.unhealthy_cards, reported_at = f.sent_at
      FROM fresh AS f JOIN line AS l ON l.cpi = f.cpi
     WHERE i.cluster_id = f.id AND i.name = l.name
    RETURNING i.cluster_id, i.available_cards
), reported AS (
    SELECT u.cluster_id, sum(u.available_cards) AS cards FROM island AS u GROUP BY u.cluster_id
), unreported AS (
    SELECT o.cluster_id, sum(o.available_cards) AS cards
      FROM fresh AS f JOIN federation_island AS o ON o.cluster_id = f.id
     WHERE NOT EXISTS (SELECT 1 FROM line AS l WHERE l.cpi = f.cpi AND l.name = o.name)
     GROUP BY o.cluster_id
), cluster AS (
    UPDATE federation_cluster AS c
       SET last_heartbeat_at = %(now)s, last_heartbeat_sent_at = f.sent_at, health = f.health,
           updated_at = %(updated_at)s,
           available_cards = coalesce(r.cards, 0) + coalesce(o.cards, 0)
      FROM fresh AS f
      LEFT JOIN reported AS r ON r.cluster_id = f.id
      LEFT JOIN unreported AS o ON o.cluster_id = f.id
     WHERE c.id = f.id
    RETURNING c.id
)
SELECT t.cpi, t.status, u.id IS NOT NULL,
       t.status <> %(retired)s AND t.last_heartbeat_sent_at IS NOT NULL AND t.last_heartbeat_sent_at >= b.sent_at
  FROM target AS t JOIN beat AS b ON b.cpi = t.cpi LEFT JOIN cluster AS u ON u.id = t.id
"""


def _heartbeats_write_postgres(
    *, operator_id: int, beats: Sequence[HeartbeatBeat], now: datetime
) -> dict[str, HeartbeatOutcome]:
    """Apply the usual beats of a batch in one statement (_HEARTBEATS_SQL): the outcomes of the beats it
    applied or found stale, by identifier; the others are left to the single-beat path."""
    beat_rows = [
        {"cpi": b.cpi, "sent_at": b.sent_at.isoformat(), "health": b.health, "n_lines": len(b.islands)}
        for b in beats
    ]
    line_rows = [
        {
            "cpi": b.cpi,
            "name": r.name,
            "available_cards": r.available_cards,
            "unhealthy_cards": r.unhealthy_cards,
        }
        for b in beats
        for r in b.islands
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            _HEARTBEATS_SQL,
            {
                "beats": json.dumps(beat_rows),
                "lines": json.dumps(line_rows),
                "operator_id": operator_id,
                "now": now,
                "updated_at": timezone.now(),
                "retired": ClusterStatus.RETIRED.value,
                "offline": ClusterStatus.OFFLINE.value,
                "missed": Cluster.OfflineCause.HEARTBEAT.value,
            },
        )
        rows = cursor.fetchall()
    outcomes = {}
    for cpi, status, applied, stale in rows:
        if applied:
            outcomes[cpi] = HeartbeatOutcome(
                cpi=cpi, result=HeartbeatResult(cluster_cpi=cpi, status=status, applied=True)
            )
        elif stale:
            outcomes[cpi] = HeartbeatOutcome(
                cpi=cpi, result=HeartbeatResult(cluster_cpi=cpi, status=status, applied=False, detail="stale")
            )
    return outcomes


def _heartbeat_check(*, sent_at: datetime, health: str, now: datetime) -> None:
    if sent_at - now > HEARTBEAT_MAX_CLOCK_SKEW:
        raise InvalidHeartbeatError(
            _("sent_at is in the future; check the agent's clock."),
            extra={"sent_at": sent_at.isoformat(), "server_time": now.isoformat()},
        )
    if health not in {Health.OK, Health.DEGRADED, Health.CRITICAL}:
        raise InvalidHeartbeatError(
            _("Unknown health %(health)r.") % {"health": health},
            extra={"fields": {"health": [_("invalid choice")]}},
        )


# What a heartbeat needs of its cluster, read with the row's lock: the row only (``of``: the operator, hub
# and chip rows stay unlocked, see _lock_cluster) and only these columns, not a model with its relations.
_HEARTBEAT_STATE_FIELDS = (
    "id",
    "cpi",
    "status",
    "offline_cause",
    "status_before_offline",
    "last_heartbeat_sent_at",
)
# In the model's field order, which Model.from_db expects of a partial row.
_HEARTBEAT_STATE_COLUMNS = tuple(
    f.attname for f in Cluster._meta.concrete_fields if f.attname in _HEARTBEAT_STATE_FIELDS
)


def _heartbeat_lock(
    *, cluster_id: int | None = None, operator_id: int | None = None, cpi: str = ""
) -> Cluster | None:
    """The cluster's heartbeat state (a Cluster with only _HEARTBEAT_STATE_FIELDS loaded), its row locked;
    by id, or by operator and identifier. None when there is no such cluster."""
    if connection.vendor == "postgresql":
        # Written out: compiling this read through the ORM was most of the service's CPU once the write was one
        # statement.
        params: list[int | str | None]
        if cluster_id is not None:
            where, params = "id = %s", [cluster_id]
        else:
            where, params = "operator_id = %s AND cpi = %s", [operator_id, cpi]
        # Bound by PostgreSQL and, in production, prepared once per connection (core.db): every beat runs it.
        with bound_cursor(connection.alias) as cursor:
            cursor.execute(
                f"SELECT {', '.join(_HEARTBEAT_STATE_COLUMNS)} FROM federation_cluster WHERE {where} FOR UPDATE",  # noqa: S608  # constant text
                params,
            )
            row = cursor.fetchone()
        return None if row is None else Cluster.from_db(connection.alias, _HEARTBEAT_STATE_COLUMNS, row)
    rows = Cluster.objects.select_for_update(of=("self",)).only(*_HEARTBEAT_STATE_FIELDS)
    if cluster_id is not None:
        return rows.filter(pk=cluster_id).first()
    return rows.filter(operator_id=operator_id, cpi=cpi).first()


def _heartbeat_apply(
    *,
    actor: Actor,
    cluster: Cluster,
    sent_at: datetime,
    health: str,
    islands: Sequence[IslandReport],
    now: datetime,
) -> HeartbeatResult:
    if cluster.status == ClusterStatus.RETIRED:
        raise ClusterRetiredError(_("%(cpi)s is retired.") % {"cpi": cluster.cpi}, extra={"cpi": cluster.cpi})
    if cluster.last_heartbeat_sent_at is not None and sent_at <= cluster.last_heartbeat_sent_at:
        return HeartbeatResult(cluster_cpi=cluster.cpi, status=cluster.status, applied=False, detail="stale")

    names = [report.name for report in islands]
    written = connection.vendor == "postgresql" and _heartbeat_write_postgres(
        cluster=cluster, sent_at=sent_at, health=health, islands=islands, names=names, now=now
    )
    if not written:
        # Every error is found here (PostgreSQL's statement wrote nothing to the cluster when it did not take
        # every line; raising rolls its island rows back with the transaction).
        _heartbeat_write_portable(
            cluster=cluster, sent_at=sent_at, health=health, islands=islands, names=names, now=now
        )

    if cluster.status == ClusterStatus.OFFLINE and cluster.offline_cause == Cluster.OfflineCause.HEARTBEAT:
        previous_status = cluster.status_before_offline or ClusterStatus.ACTIVE
        cluster.status = previous_status
        Cluster.objects.filter(pk=cluster.pk).update(
            status=previous_status, offline_cause="", status_before_offline=""
        )
        _record_status_change(
            cluster=cluster,
            from_status=ClusterStatus.OFFLINE,
            to_status=previous_status,
            actor=actor,
            reason="heartbeats resumed",
            at=now,
        )
    return HeartbeatResult(cluster_cpi=cluster.cpi, status=cluster.status, applied=True)


def _heartbeat_write_portable(
    *,
    cluster: Cluster,
    sent_at: datetime,
    health: str,
    islands: Sequence[IslandReport],
    names: Sequence[str],
    now: datetime,
) -> None:
    """Check the beat's lines against the islands as stored and apply it through the ORM (any database)."""
    by_name = {island.name: island for island in Island.objects.filter(cluster_id=cluster.pk)}
    _heartbeat_islands_check(
        cluster=cluster, islands=islands, names=names, cards={n: i.cards for n, i in by_name.items()}
    )
    changed = []
    for report in islands:
        island = by_name[report.name]
        island.available_cards = report.available_cards
        island.unhealthy_cards = report.unhealthy_cards
        island.reported_at = sent_at
        changed.append(island)
    if changed:
        Island.objects.bulk_update(changed, ["available_cards", "unhealthy_cards", "reported_at"])
    Cluster.objects.filter(pk=cluster.pk).update(
        last_heartbeat_at=now,
        last_heartbeat_sent_at=sent_at,
        health=health,
        available_cards=sum(island.available_cards for island in by_name.values()),
        updated_at=timezone.now(),
    )


def _heartbeat_islands_check(
    *, cluster: Cluster, islands: Sequence[IslandReport], names: Sequence[str], cards: dict[str, int]
) -> None:
    """Raise UnknownIslandError or InvalidHeartbeatError for a beat whose lines do not fit the islands
    (``cards``: each island's cards by name), in this order: unknown names, a name twice, impossible counts."""
    unknown = sorted(set(names) - cards.keys())
    if unknown:
        raise UnknownIslandError(
            _("%(cpi)s has no island(s) %(islands)s.") % {"cpi": cluster.cpi, "islands": ", ".join(unknown)},
            extra={"islands": unknown},
        )
    if len(set(names)) != len(names):
        raise InvalidHeartbeatError(_("An island is reported twice."), extra={"islands": list(names)})
    errors = {}
    for report in islands:
        if report.available_cards < 0 or report.unhealthy_cards < 0:
            errors[report.name] = _("counts must not be negative")
        elif report.available_cards + report.unhealthy_cards > cards[report.name]:
            errors[report.name] = _(
                "available (%(available)d) + unhealthy (%(unhealthy)d) exceeds the island's %(cards)d cards"
            ) % {
                "available": report.available_cards,
                "unhealthy": report.unhealthy_cards,
                "cards": cards[report.name],
            }
    if errors:
        raise InvalidHeartbeatError(_("Some island counts are impossible."), extra={"islands": errors})


# The largest count the statement below takes (PostgreSQL's integer): a larger one is impossible for any
# island (cards ≤ 1,000,000) and is refused by the checks in Python instead of overflowing in SQL.
_PG_INT_MAX = 2**31 - 1

# A heartbeat on PostgreSQL in one statement, its text constant (so psycopg prepares it once per connection):
# the lines come as one JSON array; every line that names an island of the cluster with possible counts
# updates it, and only if every line did is the cluster stamped, its K2 the sum over its islands (the
# reported lines' new counts and the others' stored ones). Django's bulk_update built a CASE per column per
# island, compiled by the ORM on each beat: most of a heartbeat's CPU.
_HEARTBEAT_SQL = """
WITH line AS (
    SELECT * FROM jsonb_to_recordset(%(lines)s::jsonb) AS l(name text, available_cards integer, unhealthy_cards integer)
), island AS (
    UPDATE federation_island AS i
       SET available_cards = line.available_cards, unhealthy_cards = line.unhealthy_cards, reported_at = %(sent_at)s
      FROM line
     WHERE i.cluster_id = %(cluster_id)s AND i.name = line.name
       AND line.available_cards >= 0 AND line.unhealthy_cards >= 0
       AND line.available_cards + line.unhealthy_cards <= i.cards
    RETURNING i.available_cards
), cluster AS (
    UPDATE federation_cluster
       SET last_heartbeat_at = %(now)s, last_heartbeat_sent_at = %(sent_at)s, health = %(health)s,
           updated_at = %(updated_at)s,
           available_cards = (SELECT coalesce(sum(available_cards), 0) FROM island)
                           + (SELECT coalesce(sum(available_cards), 0) FROM federation_island
                               WHERE cluster_id = %(cluster_id)s AND name NOT IN (SELECT name FROM line))
     WHERE id = %(cluster_id)s AND (SELECT count(*) FROM island) = %(n_lines)s
    RETURNING id
)
SELECT count(*) FROM cluster
"""


def _heartbeat_write_postgres(
    *,
    cluster: Cluster,
    sent_at: datetime,
    health: str,
    islands: Sequence[IslandReport],
    names: Sequence[str],
    now: datetime,
) -> bool:
    """Apply the beat in one statement; False (and nothing written to the cluster) when a line was not
    taken, or when a line could not be (a name twice or off the segment grammar, a count outside an integer):
    the caller then finds the error."""
    if len(set(names)) != len(names) or any(
        not (
            0 <= r.available_cards <= _PG_INT_MAX
            and 0 <= r.unhealthy_cards <= _PG_INT_MAX
            # No island has another name, and a NUL (which jsonb refuses) never reaches the statement.
            and identifiers.is_segment(r.name)
        )
        for r in islands
    ):
        return False
    lines = json.dumps(
        [
            {"name": r.name, "available_cards": r.available_cards, "unhealthy_cards": r.unhealthy_cards}
            for r in islands
        ]
    )
    # Bound by PostgreSQL and, in production, prepared once per connection (core.db): planning this statement
    # cost PostgreSQL more than running it, on every beat.
    with bound_cursor(connection.alias) as cursor:
        cursor.execute(
            _HEARTBEAT_SQL,
            {
                "lines": lines,
                "cluster_id": cluster.pk,
                "sent_at": sent_at,
                "now": now,
                "updated_at": timezone.now(),
                "health": health,
                "n_lines": len(islands),
            },
        )
        row = cursor.fetchone()
    return bool(row and row[0] == 1)


@transaction.atomic
def clusters_mark_missed_heartbeats(
    *,
    now: datetime | None = None,
    override: Actor | None = None,
    override_reason: str = "",
    cluster_ids: Iterable[int] | None = None,
) -> list[str]:
    """Take offline every active or draining cluster whose last sign of life (last heartbeat, or
    registration if it never beat) is older than CARDHOUR_HEARTBEAT_MISSED_LIMIT intervals. It returns to
    the status it had with its next heartbeat.

    Unless the mass-miss hold applies (federation.selectors.heartbeat_monitor_assess: most of the fleet
    missing at once, across hubs, is the platform failing to read heartbeats, not the fleet failing): then
    nothing is taken offline, the hold is logged as an error and shown on /metrics and in the admin, and
    this returns []. Staff override it with ``override`` (their actor) and ``override_reason``, both
    recorded in the status history, optionally for ``cluster_ids`` only.

    Set-based: one aggregate, one locking SELECT, one UPDATE per status, one bulk INSERT of history rows.
    Rows another worker holds are skipped (PostgreSQL SKIP LOCKED) and caught on the next run. Returns the
    identifiers taken offline.
    """
    now = now or timezone.now()
    if override is None:
        assessment = selectors.heartbeat_monitor_assess(now=now)
        if assessment.holding:
            logger.error(
                "heartbeat monitor holding: %s; no cluster is taken offline until beats return or staff "
                "override (CARDHOUR_HEARTBEAT_HOLD_*)",
                assessment.summary(),
                extra={"overdue": assessment.overdue, "missing": assessment.missing},
            )
            return []
    cutoff = selectors.heartbeat_cutoff(now=now)
    candidates = Cluster.objects.filter(status__in=[ClusterStatus.ACTIVE, ClusterStatus.DRAINING]).filter(
        selectors.heartbeat_overdue_q(cutoff=cutoff)
    )
    if cluster_ids is not None:
        candidates = candidates.filter(pk__in=list(cluster_ids))
    stale = list(candidates.select_for_update(skip_locked=True).values_list("pk", "cpi", "status"))
    if not stale:
        return []
    limit = settings.CARDHOUR_HEARTBEAT_MISSED_LIMIT
    interval = settings.CARDHOUR_HEARTBEAT_INTERVAL_SECONDS
    reason = f"missed {limit} heartbeats (interval {interval} s)"
    monitor = Actor.system("heartbeat monitor")
    if override is not None:
        reason += f"; mass-miss hold overridden: {override_reason}"
    for status in {row[2] for row in stale}:
        Cluster.objects.filter(pk__in=[pk for pk, _, s in stale if s == status]).update(
            status=ClusterStatus.OFFLINE,
            offline_cause=Cluster.OfflineCause.HEARTBEAT,
            status_before_offline=status,
            offline_at=now,
            updated_at=now,
        )
    ClusterStatusChange.objects.bulk_create(
        [
            ClusterStatusChange(
                cluster_id=pk,
                from_status=status,
                to_status=ClusterStatus.OFFLINE,
                changed_at=now,
                actor_user=override.user if override is not None and override.user is not None else None,
                actor_token=override.token if override is not None else None,
                actor_label=(override or monitor).label[:200],
                reason=reason[:500],
            )
            for pk, _, status in stale
        ]
    )
    return [cpi for _, cpi, _ in stale]


@transaction.atomic
def hub_latency_record(
    *,
    measurements: Sequence[LatencyMeasurement],
    symmetric: bool = True,
    reporter: Organisation | None = None,
) -> list[HubLatency]:
    """Store measured hub→hub latencies (and the reverse pair when ``symmetric``), replacing the seeded
    policy tiers and distance estimates. A measurement older than the one stored is ignored.

    ``reporter`` None or the platform may report any pair. An operator's agent measures from its own
    sites, so an operator may report only pairs whose ``source`` is a hub where it runs a cluster that is
    not retired (otherwise LatencySourceNotOperatedError, naming those hubs).

    Raises UnknownHubError, LatencySourceNotOperatedError. Writes nothing on error.
    """
    codes = {m.source for m in measurements} | {m.target for m in measurements}
    hubs = {hub.code: hub for hub in Hub.objects.filter(code__in=codes)}
    missing = sorted(codes - hubs.keys())
    if missing:
        raise UnknownHubError(
            _("Unknown hub(s): %(hubs)s.") % {"hubs": ", ".join(missing)}, extra={"hubs": missing}
        )
    if reporter is not None and not reporter.is_platform:
        operated = set(
            Cluster.objects.filter(operator=reporter)
            .exclude(status=ClusterStatus.RETIRED)
            .values_list("hub__code", flat=True)
        )
        foreign = sorted({m.source for m in measurements} - operated)
        if foreign:
            raise LatencySourceNotOperatedError(
                _("You run no cluster in %(hubs)s: report latencies measured from your own hubs.")
                % {"hubs": ", ".join(foreign)},
                extra={"hubs": foreign, "operated_hubs": sorted(operated)},
            )
    touched: dict[tuple[str, str], int] = {}
    for m in measurements:
        pairs = [(m.source, m.target)] + (
            [(m.target, m.source)] if symmetric and m.source != m.target else []
        )
        for source, target in pairs:
            row, _created = HubLatency.objects.select_for_update().get_or_create(
                source=hubs[source],
                target=hubs[target],
                defaults={
                    "latency_ms": m.latency_ms,
                    "origin": HubLatency.Origin.MEASURED,
                    "measured_at": m.measured_at,
                },
            )
            if row.measured_at is None or row.measured_at <= m.measured_at:
                row.latency_ms = m.latency_ms
                row.origin = HubLatency.Origin.MEASURED
                row.measured_at = m.measured_at
                row.save(update_fields=["latency_ms", "origin", "measured_at", "updated_at"])
            touched[(source, target)] = row.pk
    return list(HubLatency.objects.select_related("source", "target").filter(pk__in=touched.values()))


# A maintenance window longer than this is not maintenance: set the cluster draining or offline instead.
MAINTENANCE_MAX_DAYS = 7


@transaction.atomic
def cluster_maintenance_announce(
    *, actor: Actor, cluster: Cluster, starts_at: datetime, ends_at: datetime, reason: str
) -> ClusterMaintenance:
    """Record an operator's announcement of maintenance on ``cluster`` over ``[starts_at, ends_at)``.

    ``announced_at`` is now, by the platform's clock. The window must start in the future (a past outage
    cannot be announced after the fact), end after it starts and last at most MAINTENANCE_MAX_DAYS. An
    announcement made less than CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS ahead is recorded but excludes no
    lost time (the SLA attribution checks the notice). Raises MaintenanceInvalidError, ClusterRetiredError.
    """
    now = timezone.now()
    cluster = _lock_cluster(cluster)
    if cluster.status == ClusterStatus.RETIRED:
        raise ClusterRetiredError(_retired_unchangeable(cluster.cpi), extra={"cpi": cluster.cpi})
    fields: dict[str, list[str]] = {}
    for name, value in (("starts_at", starts_at), ("ends_at", ends_at)):
        if timezone.is_naive(value):
            fields[name] = [_("Include a UTC offset.")]
    if not fields:
        if starts_at <= now:
            fields["starts_at"] = [_("must be in the future")]
        if ends_at <= starts_at:
            fields["ends_at"] = [_("must be after starts_at")]
        elif ends_at - starts_at > timedelta(days=MAINTENANCE_MAX_DAYS):
            fields["ends_at"] = [_("at most %(days)d days after starts_at") % {"days": MAINTENANCE_MAX_DAYS}]
    if not reason.strip():
        fields["reason"] = [_("say what the maintenance is")]
    if fields:
        raise MaintenanceInvalidError(
            _("The maintenance window is not valid."), extra={"fields": fields, "now": now.isoformat()}
        )
    return ClusterMaintenance.objects.create(
        cluster=cluster,
        starts_at=starts_at,
        ends_at=ends_at,
        announced_at=now,
        reason=reason.strip()[:500],
        announced_by=actor.label[:200],
    )
