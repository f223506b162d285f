"""Tariff and price-card reads, and the process-wide cache of compiled tariff versions."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.db.models import F, OuterRef, Prefetch, Q, QuerySet, Subquery, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.translation import gettext as _

from core.models import Organisation
from federation.models import Cluster
from metering.errors import PriceCardNotFoundError, TariffNotFoundError
from metering.models import PriceCard, Tariff, TariffBand, TariffVersion, TariffWindow
from metering.sla import SlaTier, sla_schedule_parse
from metering.tariffs import CompiledTariff, TariffSpec, WindowSpec, tariff_compile

_MAX_ID = 2**63 - 1  # BigAutoField; a larger path value cannot name a row and would overflow the query


def tariff_list_for(*, organisation: Organisation, with_current_version: bool = False) -> QuerySet[Tariff]:
    """The tariffs ``organisation`` may use: the platform's presets, then its own. With
    ``with_current_version`` each carries ``current_version``: the number of the version in force now
    (None before its first version takes effect)."""
    tariffs = (
        Tariff.objects.filter(Q(owner__isnull=True) | Q(owner=organisation))
        .select_related("owner")
        .order_by(F("owner_id").asc(nulls_first=True), "code")
    )
    if with_current_version:
        in_force = TariffVersion.objects.filter(tariff=OuterRef("pk"), effective_from__lte=timezone.now())
        tariffs = tariffs.annotate(
            current_version=Subquery(in_force.order_by("-effective_from", "-version").values("version")[:1])
        )
    return tariffs


def tariff_get_for(*, organisation: Organisation, tariff_id: int) -> Tariff:
    """A preset or one of ``organisation``'s tariffs, versions prefetched with bands and windows.
    Another organisation's tariff raises TariffNotFoundError, exactly as a missing one."""
    tariff = None
    if 1 <= tariff_id <= _MAX_ID:
        tariff = (
            tariff_list_for(organisation=organisation)
            .prefetch_related(
                Prefetch(
                    "versions",
                    queryset=TariffVersion.objects.order_by("version").prefetch_related(
                        Prefetch("bands", queryset=TariffBand.objects.order_by("-multiplier", "band")),
                        Prefetch("windows", queryset=TariffWindow.objects.order_by("start_minute", "id")),
                    ),
                )
            )
            .filter(pk=tariff_id)
            .first()
        )
    if tariff is None:
        raise TariffNotFoundError(_("No tariff %(id)s.") % {"id": tariff_id}, extra={"tariff_id": tariff_id})
    return tariff


def tariff_version_current(*, tariff: Tariff, at: datetime | None = None) -> TariffVersion:
    """The version of ``tariff`` in force at ``at`` (default now): the newest whose effective_from is at or
    before it. Raises TariffNotFoundError when none is in force yet."""
    at = at or timezone.now()
    version = (
        TariffVersion.objects.filter(tariff=tariff, effective_from__lte=at)
        .order_by("-effective_from", "-version")
        .first()
    )
    if version is None:
        raise TariffNotFoundError(
            _("Tariff %(code)s has no version in force at %(at)s.")
            % {"code": tariff.code, "at": at.isoformat()},
            extra={"tariff_id": tariff.pk, "at": at.isoformat()},
        )
    return version


def tariff_version_for_day(*, tariff: Tariff, at: datetime) -> TariffVersion:
    """The version to show for a day starting at ``at``: the one in force then, or the first version
    for a day before any is in force (a preview)."""
    try:
        return tariff_version_current(tariff=tariff, at=at)
    except TariffNotFoundError:
        first = TariffVersion.objects.filter(tariff=tariff).order_by("effective_from", "version").first()
        if first is None:
            raise
        return first


def tariff_version_spec(*, version: TariffVersion) -> TariffSpec:
    """The schedule stored in one version, as the engine's TariffSpec (uses prefetched rows if any)."""
    return TariffSpec(
        time_zone=version.tariff.time_zone,
        multipliers={row.band: row.multiplier for row in version.bands.all()},
        windows=tuple(
            WindowSpec(
                band=w.band,
                start_minute=w.start_minute,
                end_minute=w.end_minute,
                weekdays=w.weekdays,
                months=w.months,
            )
            for w in sorted(version.windows.all(), key=lambda w: (w.start_minute, w.pk))
        ),
    )


_compiled: dict[int, CompiledTariff] = {}
_compiled_lock = threading.Lock()


def compiled_tariff(*, tariff_version_id: int) -> CompiledTariff:
    """The compiled schedule of a tariff version, cached for the life of the process (versions are
    immutable, so the cache never goes stale). Raises TariffNotFoundError for an unknown id.

    One hazard: SQLite hands out a rolled-back insert's id again (its id counter rolls back with the
    transaction; PostgreSQL's sequences never do). Only the process that wrote the rolled-back version can
    have compiled it, since no other connection saw it, so writing a version forgets its id here
    (``compiled_tariff_forget``) and a reused id is compiled afresh."""
    compiled = _compiled.get(tariff_version_id)
    if compiled is not None:
        return compiled
    version = (
        TariffVersion.objects.select_related("tariff")
        .prefetch_related("bands", "windows")
        .filter(pk=tariff_version_id)
        .first()
    )
    if version is None:
        raise TariffNotFoundError(
            _("No tariff version %(id)s.") % {"id": tariff_version_id},
            extra={"tariff_version_id": tariff_version_id},
        )
    compiled = tariff_compile(tariff_version_spec(version=version))
    with _compiled_lock:
        return _compiled.setdefault(tariff_version_id, compiled)


def compiled_tariff_forget(*, tariff_version_id: int) -> None:
    """Drop ``tariff_version_id`` from this process's compiled-tariff cache (a version was just written
    under that id; see compiled_tariff)."""
    with _compiled_lock:
        _compiled.pop(tariff_version_id, None)


def _price_cards(cluster: Cluster) -> QuerySet[PriceCard]:
    return PriceCard.objects.filter(cluster=cluster).select_related("cluster", "tariff_version__tariff")


def price_card_current(*, cluster: Cluster, at: datetime | None = None) -> PriceCard:
    """The price card in force for ``cluster`` at ``at`` (default now): the newest effective_from at or
    before it, the newer version on a tie. Raises PriceCardNotFoundError when the cluster has none yet."""
    at = at or timezone.now()
    card = (
        _price_cards(cluster).filter(effective_from__lte=at).order_by("-effective_from", "-version").first()
    )
    if card is None:
        raise PriceCardNotFoundError(
            _("Cluster %(cpi)s has no price card in force at %(at)s.")
            % {"cpi": cluster.cpi, "at": at.isoformat()},
            extra={"cpi": cluster.cpi, "at": at.isoformat()},
        )
    return card


def price_card_list(*, cluster: Cluster) -> QuerySet[PriceCard]:
    """Every price-card version of ``cluster``, newest first."""
    return _price_cards(cluster).order_by("-version")


def price_card_get(*, cluster: Cluster, version: int) -> PriceCard:
    """One price-card version of ``cluster``; raises PriceCardNotFoundError."""
    card = _price_cards(cluster).filter(version=version).first() if 1 <= version <= 2**31 - 1 else None
    if card is None:
        raise PriceCardNotFoundError(
            _("Cluster %(cpi)s has no price card version %(version)s.")
            % {"cpi": cluster.cpi, "version": version},
            extra={"cpi": cluster.cpi, "version": version},
        )
    return card


@dataclass(frozen=True)
class PriceCardRow:
    price_card_id: int
    version: int
    rate_per_card_hour: Decimal
    tariff_version_id: int
    tariff_code: str
    # The card's service level (percent) and credit tiers (metering.sla), highest threshold first.
    sla_availability_percent: Decimal | None = None
    sla_credit_schedule: tuple[SlaTier, ...] = ()


def price_cards_in_force(*, at: datetime | None = None) -> dict[int, PriceCardRow]:
    """The price card in force at ``at`` (default now) for every cluster that has one, by cluster id:
    one query (DISTINCT ON on PostgreSQL)."""
    at = at or timezone.now()
    cards = PriceCard.objects.filter(effective_from__lte=at).order_by(
        "cluster_id", "-effective_from", "-version"
    )
    fields = (
        "cluster_id",
        "pk",
        "version",
        "rate_per_card_hour",
        "tariff_version_id",
        "tariff_version__tariff__code",
        "sla_availability_percent",
        "schedule_text",
    )
    rows = cards.distinct("cluster_id") if connection.vendor == "postgresql" else cards
    # The schedules as text, parsed once per distinct schedule: thousands of clusters share a handful,
    # and decoding each card's JSON was most of this query's CPU (the broker reloads it every few seconds).
    rows = rows.annotate(schedule_text=Cast("sla_credit_schedule", TextField()))
    parsed: dict[str | None, tuple[SlaTier, ...]] = {}
    out: dict[int, PriceCardRow] = {}
    for cluster_id, pk, version, rate, tariff_version_id, code, level, text in rows.values_list(*fields):
        if cluster_id not in out:
            schedule = parsed.get(text)
            if schedule is None:
                raw = json.loads(text) if text is not None else None
                schedule = parsed[text] = sla_schedule_parse(raw) if raw else ()
            out[cluster_id] = PriceCardRow(pk, version, rate, tariff_version_id, code, level, schedule)
    return out
