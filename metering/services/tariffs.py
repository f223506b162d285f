"""Tariff and price-card writes: new tariffs, new tariff versions, new price-card versions, presets.

Everything written here is immutable once written: a change is a new version, never an edit, so a lease or
usage record that was priced with a version is priced with it for good. Versions are never retroactive:
a new one takes effect now or later.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.apps import apps as django_apps
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from core.errors import DomainError, PermissionDeniedError
from core.models import Organisation
from core.types import Actor
from federation.errors import ClusterNotFoundError
from federation.models import Cluster
from metering.errors import (
    PriceCardInvalidError,
    TariffCodeTakenError,
    TariffInvalidError,
    TariffNotFoundError,
    TariffReadOnlyError,
)
from metering.models import PriceCard, Tariff, TariffVersion
from metering.selectors.tariffs import compiled_tariff_forget
from metering.sla import SlaScheduleError, sla_schedule_as_json, sla_schedule_validate
from metering.tariffs import PRESETS, TariffSpec, tariff_spec_validate

# A client's clock may lag ours a little; "now" from its point of view is still accepted.
CLOCK_SKEW_GRACE = timedelta(minutes=1)
RATE_PLACES = 4
RATE_MAX = Decimal("99999999.9999")  # DecimalField(max_digits=12, decimal_places=4)
_CODE_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def _is_platform(actor: Actor) -> bool:
    return actor.organisation is None or actor.organisation.is_platform


def _check_not_past(*, effective_from: datetime, now: datetime, what: str, error: type[DomainError]) -> None:
    if timezone.is_naive(effective_from):
        raise error(
            _("The %(what)s effective_from must carry a UTC offset.") % {"what": what},
            extra={"fields": {"effective_from": [_("Include a UTC offset.")]}},
        )
    if effective_from < now - CLOCK_SKEW_GRACE:
        raise error(
            _(
                "A %(what)s cannot take effect in the past (%(at)s); versions are never retroactive. Leave "
                "effective_from out to start now."
            )
            % {"what": what, "at": effective_from.isoformat()},
            extra={"fields": {"effective_from": [_("must be now or later")]}, "now": now.isoformat()},
        )


def _write_version(
    *,
    apps: Any,
    tariff: Any,
    version: int,
    spec: TariffSpec,
    effective_from: datetime,
    created_by: str,
) -> Any:
    """Write one version with its bands and windows, through ``apps`` (so migrations can use it)."""
    version_model = apps.get_model("metering", "TariffVersion")
    band_model = apps.get_model("metering", "TariffBand")
    window_model = apps.get_model("metering", "TariffWindow")
    row = version_model.objects.create(
        tariff=tariff, version=version, effective_from=effective_from, created_by=created_by[:200]
    )
    compiled_tariff_forget(tariff_version_id=row.pk)  # an id SQLite reused after a rollback: compile anew
    used = {window.band for window in spec.windows}
    band_model.objects.bulk_create(
        band_model(tariff_version=row, band=band, multiplier=Decimal(multiplier))
        for band, multiplier in spec.multipliers.items()
        if band in used
    )
    window_model.objects.bulk_create(
        window_model(
            tariff_version=row,
            band=window.band,
            start_minute=window.start_minute,
            end_minute=window.end_minute,
            weekdays=window.weekdays,
            months=window.months,
        )
        for window in spec.windows
    )
    return row


def _spec_of(*, apps: Any, version: Any) -> TariffSpec:
    from metering.tariffs import WindowSpec

    band_model = apps.get_model("metering", "TariffBand")
    window_model = apps.get_model("metering", "TariffWindow")
    bands = band_model.objects.filter(tariff_version=version)
    windows = window_model.objects.filter(tariff_version=version).order_by("start_minute", "id")
    return TariffSpec(
        time_zone=version.tariff.time_zone,
        multipliers={row.band: row.multiplier for row in bands},
        windows=tuple(
            WindowSpec(
                band=w.band,
                start_minute=w.start_minute,
                end_minute=w.end_minute,
                weekdays=w.weekdays,
                months=w.months,
            )
            for w in windows
        ),
    )


def _same_schedule(a: TariffSpec, b: TariffSpec) -> bool:
    def key(spec: TariffSpec) -> tuple[Any, ...]:
        used = {w.band for w in spec.windows}
        return (
            spec.time_zone,
            sorted((band, Decimal(m).normalize()) for band, m in spec.multipliers.items() if band in used),
            sorted((w.band, w.start_minute, w.end_minute, w.weekdays, w.months) for w in spec.windows),
        )

    return key(a) == key(b)


@transaction.atomic
def tariff_create(
    *,
    owner: Organisation | None,
    code: str,
    name: str,
    time_zone: str,
    source: str,
    spec: TariffSpec,
    effective_from: datetime | None,
    actor: Actor,
) -> Tariff:
    """Create a tariff and its version 1 (bands and windows) in force from ``effective_from`` (default now).

    Rules: ``owner`` None makes a preset, which only the platform may do; otherwise the actor acts for
    ``owner``, an operator. ``code`` is a slug unique per owner; the schedule passes
    tariff_spec_validate in ``time_zone`` (which must equal ``spec.time_zone``); effective_from is not in
    the past (a minute of clock skew allowed).

    Raises TariffInvalidError, TariffCodeTakenError, PermissionDeniedError. Writes nothing on error.
    """
    now = timezone.now()
    if owner is None and not _is_platform(actor):
        raise TariffReadOnlyError(_("Only the platform can create preset tariffs."))
    if owner is not None:
        if not _is_platform(actor) and actor.organisation != owner:
            raise PermissionDeniedError(_("You can create tariffs only for your own organisation."))
        if not owner.is_operator:
            raise PermissionDeniedError(
                _("Only operator organisations can define tariffs."), code="not_an_operator"
            )
    fields: dict[str, list[str]] = {}
    if not _CODE_RE.fullmatch(code or "") or len(code) > 64:
        fields["code"] = [_("1–64 characters of a–z, 0–9 and inner hyphens")]
    if not name or len(name) > 200:
        fields["name"] = [_("1–200 characters")]
    if len(source) > 500:
        fields["source"] = [_("at most 500 characters")]
    if spec.time_zone != time_zone:
        fields["time_zone"] = [
            _("the schedule is in %(schedule)r, the tariff in %(tariff)r")
            % {"schedule": spec.time_zone, "tariff": time_zone}
        ]
    if fields:
        raise TariffInvalidError(_("Some tariff fields are invalid."), extra={"fields": fields})
    tariff_spec_validate(spec)
    effective_from = effective_from or now
    _check_not_past(effective_from=effective_from, now=now, what=_("tariff"), error=TariffInvalidError)
    if Tariff.objects.filter(owner=owner, code=code).exists():
        raise TariffCodeTakenError(
            _("You already have a tariff %(code)r.") % {"code": code}, extra={"code": code}
        )
    try:
        with transaction.atomic():  # a savepoint, so a concurrent create's IntegrityError leaves us usable
            tariff = Tariff.objects.create(
                owner=owner, code=code, name=name, time_zone=time_zone, source=source
            )
    except IntegrityError as exc:
        raise TariffCodeTakenError(
            _("You already have a tariff %(code)r.") % {"code": code}, extra={"code": code}
        ) from exc
    _write_version(
        apps=django_apps,
        tariff=tariff,
        version=1,
        spec=spec,
        effective_from=effective_from,
        created_by=actor.label,
    )
    return tariff


@transaction.atomic
def tariff_version_create(
    *, tariff: Tariff, spec: TariffSpec, effective_from: datetime | None = None, actor: Actor
) -> TariffVersion:
    """Add the next immutable version of ``tariff``, in force from ``effective_from`` (default now).

    Rules: an operator changes only its own tariffs (another's answers TariffNotFoundError, a preset
    TariffReadOnlyError); only the platform changes presets. The schedule passes tariff_spec_validate in
    the tariff's zone. effective_from is not in the past (a minute of clock skew allowed) and is after
    every existing version's, so versions take effect in version order. Price cards already set keep the
    version they locked.

    Raises TariffInvalidError, TariffNotFoundError, TariffReadOnlyError. Writes nothing on error.
    """
    now = timezone.now()
    if not _is_platform(actor):
        if tariff.owner_id is None:
            raise TariffReadOnlyError(
                _("%(tariff)s is a platform preset; define your own tariff to change it.")
                % {"tariff": tariff.code},
                extra={"tariff": tariff.code},
            )
        if actor.organisation is None or tariff.owner_id != actor.organisation.pk:
            raise TariffNotFoundError(_("No such tariff."), extra={"tariff_id": tariff.pk})
    locked = Tariff.objects.select_for_update().get(pk=tariff.pk)  # serialises version numbers
    if spec.time_zone != locked.time_zone:
        raise TariffInvalidError(
            _("The schedule is in %(schedule)r; this tariff is in %(tariff)r.")
            % {"schedule": spec.time_zone, "tariff": locked.time_zone},
            extra={"fields": {"time_zone": [_("must be %(zone)s") % {"zone": locked.time_zone}]}},
        )
    tariff_spec_validate(spec)
    effective_from = effective_from or now
    _check_not_past(
        effective_from=effective_from, now=now, what=_("tariff version"), error=TariffInvalidError
    )
    latest = TariffVersion.objects.filter(tariff=locked).order_by("-version").first()
    if latest is not None and effective_from <= latest.effective_from:
        raise TariffInvalidError(
            _("Version %(version)d takes effect at %(at)s; a new version must take effect after it.")
            % {"version": latest.version, "at": latest.effective_from.isoformat()},
            extra={
                "fields": {
                    "effective_from": [_("must be after %(at)s") % {"at": latest.effective_from.isoformat()}]
                },
                "latest_effective_from": latest.effective_from.isoformat(),
            },
        )
    row: TariffVersion = _write_version(
        apps=django_apps,
        tariff=locked,
        version=(latest.version if latest else 0) + 1,
        spec=spec,
        effective_from=effective_from,
        created_by=actor.label,
    )
    return row


def _rate_fault(rate: Any) -> str | None:
    if isinstance(rate, float | bool) or not isinstance(rate, Decimal | int):
        return _("must be a Decimal")
    try:
        amount = Decimal(rate)
        if not amount.is_finite():
            return _("must be a finite number")
        if amount < 0:
            return _("must be 0 or more")
        if amount > RATE_MAX:
            return _("must be at most %(max)s") % {"max": RATE_MAX}
        if amount != amount.quantize(Decimal(1).scaleb(-RATE_PLACES)):
            return _("has more than %(places)d decimal places") % {"places": RATE_PLACES}
    except InvalidOperation:
        return _("is not a number")
    return None


@transaction.atomic
def price_card_set(
    *,
    cluster: Cluster,
    rate_per_card_hour: Decimal,
    tariff: Tariff,
    effective_from: datetime | None = None,
    sla_availability_percent: Decimal | str | None = None,
    sla_credit_schedule: Any = None,
    actor: Actor,
) -> PriceCard:
    """Set a cluster's price: write its next price-card version (CNY per card-hour, with a tariff).

    The card locks the tariff *version* in force at the card's effective_from: the newest version whose
    effective_from is at or before it. A later tariff version does not change this card; setting the
    price again does pick it up.

    Rules: the actor's organisation operates ``cluster`` (another's answers ClusterNotFoundError);
    ``tariff`` is a preset or the operator's own (otherwise TariffNotFoundError); the rate is ≥ 0 with at
    most four decimal places; effective_from (default now) is not in the past (a minute of clock skew
    allowed) and not before the cluster's newest card — at the same instant, the newer version wins, so a
    scheduled price can be replaced before it starts. The optional service level and credit schedule follow
    metering.sla's rules (a schedule needs a level; tiers monotone, 0–100); they are part of the version, so
    a card without them promises nothing, and changing them is a new version like a new price.

    Raises ClusterNotFoundError, TariffNotFoundError, PriceCardInvalidError. Writes nothing on error.
    """
    now = timezone.now()
    operator_id = cluster.operator_id
    if not _is_platform(actor) and (actor.organisation is None or actor.organisation.pk != operator_id):
        raise ClusterNotFoundError(
            _("No cluster %(cpi)s.") % {"cpi": cluster.cpi}, extra={"cpi": cluster.cpi}
        )
    if tariff.owner_id is not None and tariff.owner_id != operator_id:
        raise TariffNotFoundError(_("No such tariff."), extra={"tariff_id": tariff.pk})
    fault = _rate_fault(rate_per_card_hour)
    if fault is not None:
        raise PriceCardInvalidError(
            _("rate_per_card_hour %(fault)s.") % {"fault": fault},
            extra={"fields": {"rate_per_card_hour": [fault]}},
        )
    try:
        sla_level, sla_tiers = sla_schedule_validate(
            service_level_percent=sla_availability_percent, credit_schedule=sla_credit_schedule
        )
    except SlaScheduleError as exc:
        raise PriceCardInvalidError(
            str(exc),
            extra={"fields": exc.fields},
        ) from exc
    effective_from = effective_from or now
    _check_not_past(effective_from=effective_from, now=now, what=_("price card"), error=PriceCardInvalidError)
    # Lock the cluster row: price versions of one cluster are numbered one at a time, and this serialises
    # with federation's writes to the same cluster.
    Cluster.objects.select_for_update().filter(pk=cluster.pk).values_list("pk", flat=True).get()
    latest = PriceCard.objects.filter(cluster_id=cluster.pk).order_by("-version").first()
    if latest is not None and effective_from < latest.effective_from:
        raise PriceCardInvalidError(
            _(
                "Price card version %(version)d takes effect at %(at)s; a new version cannot take effect before it."
            )
            % {"version": latest.version, "at": latest.effective_from.isoformat()},
            extra={
                "fields": {
                    "effective_from": [
                        _("must be at or after %(at)s") % {"at": latest.effective_from.isoformat()}
                    ]
                },
                "latest_effective_from": latest.effective_from.isoformat(),
            },
        )
    tariff_version = (
        TariffVersion.objects.filter(tariff=tariff, effective_from__lte=effective_from)
        .order_by("-effective_from", "-version")
        .first()
    )
    if tariff_version is None:
        first = TariffVersion.objects.filter(tariff=tariff).order_by("effective_from").first()
        starts = first.effective_from.isoformat() if first else None
        raise PriceCardInvalidError(
            (
                _(
                    "Tariff %(tariff)s has no version in force at %(at)s; its first version takes effect at %(starts)s."
                )
                if starts
                else _("Tariff %(tariff)s has no version in force at %(at)s.")
            )
            % {"tariff": tariff.code, "at": effective_from.isoformat(), "starts": starts},
            extra={
                "fields": {"effective_from": [_("no tariff version in force then")]},
                "tariff_starts": starts,
            },
        )
    return PriceCard.objects.create(
        cluster=cluster,
        version=(latest.version if latest else 0) + 1,
        rate_per_card_hour=Decimal(rate_per_card_hour),
        currency="CNY",
        tariff_version=tariff_version,
        effective_from=effective_from,
        sla_availability_percent=sla_level,
        sla_credit_schedule=sla_schedule_as_json(sla_tiers),
        created_by=actor.label[:200],
    )


def tariff_presets_load(apps: Any, *, now: datetime | None = None) -> None:
    """Create or refresh the platform's preset tariffs from metering.tariffs.PRESETS. ``apps`` is a
    migration's app registry or django.apps.apps. Idempotent.

    Each preset's editions in code (each in force from its notice's effective date) become its versions:

    - a version no price card uses and that matches no edition in code (its date or schedule) was never
      priced with, so it is withdrawn (a preset corrected before anyone used it leaves no trace);
    - a version a price card uses is never touched, whatever the code says now;
    - an edition missing from the database is written at its own effective date when that is after every
      remaining version; otherwise, if it is the newest edition and the schedule in force differs, at
      ``now`` (never retroactively before a version that may have priced usage); an older edition that an
      in-use version already follows is left out.
    """
    now = now or timezone.now()
    tariff_model = apps.get_model("metering", "Tariff")
    version_model = apps.get_model("metering", "TariffVersion")
    price_card_model = apps.get_model("metering", "PriceCard")
    for preset in PRESETS.values():
        tariff, _created = tariff_model.objects.update_or_create(
            owner=None,
            code=preset.code,
            defaults={"name": preset.name, "source": preset.source[:500], "time_zone": preset.spec.time_zone},
        )
        in_use = set(
            price_card_model.objects.filter(tariff_version__tariff=tariff).values_list(
                "tariff_version_id", flat=True
            )
        )
        rows = list(version_model.objects.filter(tariff=tariff).order_by("effective_from", "version"))
        specs = {row.pk: _spec_of(apps=apps, version=row) for row in rows}

        def matches(row: Any, edition: Any, specs: dict[int, TariffSpec] = specs) -> bool:
            return bool(
                row.effective_from == edition.effective_from and _same_schedule(specs[row.pk], edition.spec)
            )

        kept = []
        for row in rows:
            if row.pk in in_use or any(matches(row, edition) for edition in preset.versions):
                kept.append(row)
            else:
                row.delete()  # its bands and windows cascade
        number = max((row.version for row in kept), default=0)
        for edition in preset.versions:
            if any(matches(row, edition) for row in kept):
                continue
            latest = max(kept, key=lambda row: row.effective_from, default=None)
            if latest is None or edition.effective_from > latest.effective_from:
                effective_from = edition.effective_from
            elif edition is preset.versions[-1] and not _same_schedule(specs[latest.pk], edition.spec):
                effective_from = max(now, latest.effective_from + timedelta(seconds=1))
            else:
                continue
            number += 1
            row = _write_version(
                apps=apps,
                tariff=tariff,
                version=number,
                spec=edition.spec,
                effective_from=effective_from,
                created_by=f"platform presets: {edition.document or preset.code}",
            )
            specs[row.pk] = edition.spec
            kept.append(row)


@transaction.atomic
def tariff_presets_install() -> None:
    """Install or refresh the preset tariffs (see tariff_presets_load)."""
    tariff_presets_load(django_apps)
