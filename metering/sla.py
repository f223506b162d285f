"""Service levels and credit schedules on price cards: validation and the credit a given availability earns.

Pure functions, no database. A price card may carry a *service level* (the availability over a lease's window
that the operator promises, in percent, e.g. ``99.5``) and a *credit schedule*: tiers "availability below
X % → credit Y % of the lease's charge". The schedule is stored canonically on the card as a JSON list of
``{"below_percent": "99.5", "credit_percent": "10"}`` (Decimal strings), sorted by ``below_percent`` from the
highest threshold down; every reader goes through :func:`sla_schedule_parse`.

Rules (:func:`sla_schedule_validate`): every figure is a Decimal in 0–100 with at most three decimal places;
``below_percent`` > 0 and distinct; the lower the threshold, the larger the credit (strictly increasing as
availability falls — "monotone"); a schedule needs a service level, and no threshold lies above it (the
operator promised the level, so availability at or above it earns no credit). A service level without a
schedule is allowed: it is stated, and no credit follows from it.

Availability and thresholds are percents; the credit is returned as a *fraction* of the charge (0–1), the
unit a caller multiplies a charge by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from itertools import pairwise
from typing import Any

from django.utils.translation import gettext as _

PERCENT_PLACES = 3
HUNDRED = Decimal(100)
MAX_TIERS = 10


@dataclass(frozen=True, slots=True)
class SlaTier:
    """Availability strictly below ``below_percent`` earns ``credit_percent`` of the lease's charge."""

    below_percent: Decimal
    credit_percent: Decimal

    def as_json(self) -> dict[str, str]:
        return {"below_percent": str(self.below_percent), "credit_percent": str(self.credit_percent)}


class SlaScheduleError(ValueError):
    """A service level or credit schedule that breaks the rules; ``fields`` maps a field to its faults."""

    def __init__(self, message: str, *, fields: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.fields = fields


def _percent(value: Any, *, allow_zero: bool) -> tuple[Decimal | None, str | None]:
    if isinstance(value, float | bool) or not isinstance(value, Decimal | int | str):
        return None, _("must be a decimal number (a string or an integer)")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        return None, _("is not a number")
    if not amount.is_finite():
        return None, _("must be a finite number")
    if amount < 0 or amount > HUNDRED or (amount == 0 and not allow_zero):
        return None, (_("must be between 0 and 100") if allow_zero else _("must be above 0 and at most 100"))
    if amount != amount.quantize(Decimal(1).scaleb(-PERCENT_PLACES)):
        return None, _("has more than %(places)d decimal places") % {"places": PERCENT_PLACES}
    # Canonical form: no exponent, no trailing zeros beyond what the value needs ("99.50" -> "99.5").
    normal = amount.normalize()
    return (normal.quantize(Decimal(1)) if normal == normal.to_integral() else normal), None


def _tier_items(raw: Any) -> list[tuple[Any, Any]] | None:
    """Accept tiers as mappings ({"below_percent", "credit_percent"}), pairs, or SlaTier objects."""
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        return None
    items: list[tuple[Any, Any]] = []
    for tier in raw:
        if isinstance(tier, SlaTier):
            items.append((tier.below_percent, tier.credit_percent))
        elif isinstance(tier, Mapping):
            if set(tier) != {"below_percent", "credit_percent"}:
                return None
            items.append((tier["below_percent"], tier["credit_percent"]))
        elif isinstance(tier, Sequence) and not isinstance(tier, str | bytes) and len(tier) == 2:
            items.append((tier[0], tier[1]))
        else:
            return None
    return items


def sla_schedule_validate(
    *, service_level_percent: Any, credit_schedule: Any
) -> tuple[Decimal | None, tuple[SlaTier, ...]]:
    """Check a service level and a credit schedule together; return them canonical (tiers from the highest
    threshold down). ``None`` or an empty list means "none". Raises SlaScheduleError with per-field faults."""
    level: Decimal | None = None
    if service_level_percent is not None and service_level_percent != "":
        level, fault = _percent(service_level_percent, allow_zero=False)
        if fault is not None:
            raise SlaScheduleError(
                _("sla_availability_percent %(fault)s.") % {"fault": fault},
                fields={"sla_availability_percent": [fault]},
            )
    if credit_schedule is None:
        return level, ()
    items = _tier_items(credit_schedule)
    if items is None:
        fault = _('must be a list of tiers {"below_percent": …, "credit_percent": …}')
        raise SlaScheduleError(
            _("sla_credit_schedule %(fault)s.") % {"fault": fault}, fields={"sla_credit_schedule": [fault]}
        )
    if not items:
        return level, ()
    if len(items) > MAX_TIERS:
        fault = _("has more than %(n)d tiers") % {"n": MAX_TIERS}
        raise SlaScheduleError(
            _("sla_credit_schedule %(fault)s.") % {"fault": fault}, fields={"sla_credit_schedule": [fault]}
        )
    tiers: list[SlaTier] = []
    for index, (below_raw, credit_raw) in enumerate(items):
        below, fault = _percent(below_raw, allow_zero=False)
        if fault is None:
            credit, fault = _percent(credit_raw, allow_zero=False)
            what = "credit_percent"
        else:
            credit, what = None, "below_percent"
        if fault is not None or below is None or credit is None:
            message = _("tier %(n)d: %(what)s %(fault)s") % {"n": index + 1, "what": what, "fault": fault}
            raise SlaScheduleError(
                _("sla_credit_schedule %(m)s.") % {"m": message}, fields={"sla_credit_schedule": [message]}
            )
        tiers.append(SlaTier(below_percent=below, credit_percent=credit))
    tiers.sort(key=lambda tier: tier.below_percent, reverse=True)
    for higher, lower in pairwise(tiers):
        if higher.below_percent == lower.below_percent:
            message = _("two tiers share the threshold %(x)s %%") % {"x": higher.below_percent}
            raise SlaScheduleError(
                _("sla_credit_schedule: %(m)s.") % {"m": message}, fields={"sla_credit_schedule": [message]}
            )
        if lower.credit_percent <= higher.credit_percent:
            message = _(
                "credits must grow as availability falls: below %(lx)s %% credits %(lc)s %%, not more than "
                "below %(hx)s %% (%(hc)s %%)"
            ) % {
                "lx": lower.below_percent,
                "lc": lower.credit_percent,
                "hx": higher.below_percent,
                "hc": higher.credit_percent,
            }
            raise SlaScheduleError(
                _("sla_credit_schedule: %(m)s.") % {"m": message}, fields={"sla_credit_schedule": [message]}
            )
    if level is None:
        message = _("a credit schedule needs a service level")
        raise SlaScheduleError(
            _("sla_availability_percent: %(m)s.") % {"m": message},
            fields={"sla_availability_percent": [message]},
        )
    if tiers[0].below_percent > level:
        message = _("no tier may start above the service level (%(level)s %%): below %(x)s %% does") % {
            "level": level,
            "x": tiers[0].below_percent,
        }
        raise SlaScheduleError(
            _("sla_credit_schedule: %(m)s.") % {"m": message}, fields={"sla_credit_schedule": [message]}
        )
    return level, tuple(tiers)


def sla_schedule_as_json(tiers: Iterable[SlaTier]) -> list[dict[str, str]]:
    """The stored (canonical) form of validated tiers."""
    return [tier.as_json() for tier in tiers]


def sla_schedule_parse(raw: Any) -> tuple[SlaTier, ...]:
    """Tiers from a stored schedule (or any accepted shape), from the highest threshold down. A stored
    schedule was validated on write; this re-checks only the shape, and treats ``None`` as no tiers."""
    if raw is None:
        return ()
    items = _tier_items(raw)
    if items is None:
        raise SlaScheduleError("malformed credit schedule", fields={"sla_credit_schedule": ["malformed"]})
    tiers = [SlaTier(below_percent=Decimal(str(b)), credit_percent=Decimal(str(c))) for b, c in items]
    tiers.sort(key=lambda tier: tier.below_percent, reverse=True)
    return tuple(tiers)


def sla_credit_tier(*, schedule: Any, availability: Decimal) -> SlaTier | None:
    """The tier an availability (percent, 0–100) falls in — the lowest threshold it is strictly below — or
    None when it is below none (no credit)."""
    hit: SlaTier | None = None
    for tier in sla_schedule_parse(schedule):  # highest threshold first
        if availability < tier.below_percent:
            hit = tier
    return hit


def sla_credit_fraction(*, schedule: Any, availability: Decimal) -> Decimal:
    """What fraction (0–1) of the lease's charge is credited at ``availability`` (a percent, 0–100, over the
    lease's window) under ``schedule`` (a price card's ``sla_credit_schedule``, a list of SlaTier, or pairs).

    Tiers are "availability strictly below X % → credit Y %": 99.5 % exactly under a "below 99.5" tier earns
    nothing. With no schedule (None or empty) the fraction is 0. Exact Decimal arithmetic (Y / 100).
    """
    if isinstance(availability, float):
        raise TypeError("availability must be a Decimal, not a float")
    tier = sla_credit_tier(schedule=schedule, availability=Decimal(availability))
    return Decimal(0) if tier is None else tier.credit_percent / HUNDRED
