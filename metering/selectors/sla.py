"""Reads of SLA credit notes: a buyer sees the notes credited to it, an operator the notes against it."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Q, QuerySet
from django.utils.translation import gettext as _

from core.models import Organisation
from core.money import from_micros, micros_to_fen
from metering.errors import SlaCreditNotFoundError
from metering.models import Pack, SlaCredit

ROLE_BUYER = "buyer"
ROLE_OPERATOR = "operator"


def sla_credit_list_for(*, organisation: Organisation, role: str | None = None) -> QuerySet[SlaCredit]:
    """The notes ``organisation`` is party to (as buyer, as operator, or either), newest first."""
    if role == ROLE_BUYER:
        scope = Q(buyer=organisation)
    elif role == ROLE_OPERATOR:
        scope = Q(operator=organisation)
    else:
        scope = Q(buyer=organisation) | Q(operator=organisation)
    return (
        SlaCredit.objects.filter(scope)
        .select_related("buyer", "operator", "cluster", "dispute")
        .order_by("-issued_at", "-pk")
    )


def sla_credit_get_for(*, organisation: Organisation, credit_id: int, role: str | None = None) -> SlaCredit:
    """One note ``organisation`` is party to (in ``role``, if given). Raises SlaCreditNotFoundError when it
    does not exist *or* belongs to others (indistinguishable to the caller)."""
    credit = (
        sla_credit_list_for(organisation=organisation, role=role)
        .select_related("price_card")
        .filter(pk=credit_id)
        .first()
    )
    if credit is None:
        raise SlaCreditNotFoundError(
            _("SLA credit %(id)s was not found.") % {"id": credit_id}, extra={"credit_id": credit_id}
        )
    return credit


@dataclass(frozen=True)
class SlaCreditLine:
    """What one pack, the arrears of a class or the money balance got back, in the buyer's units."""

    to: str  # pack / arrears / money
    pack_id: int | None
    pack_label: str
    pack_class: str
    card_hours: Decimal  # of the pack's (or the arrears') class; 0 for money
    value_cny: Decimal  # prepaid value (or money owed) given back, to the fen
    gross_cny: Decimal  # the operator's charge credited, to the fen


def sla_credit_lines(credit: SlaCredit) -> list[SlaCreditLine]:
    packs = Pack.objects.select_related("accelerator").in_bulk(
        [line["pack_id"] for line in credit.lines if line.get("pack_id")]
    )
    rows = []
    for line in credit.lines:
        pack = packs.get(line["pack_id"]) if line.get("pack_id") else None
        label = (
            _("Pack %(id)s (%(hours)s card-hours of %(class)s)")
            % {"id": pack.pk, "hours": pack.card_hours, "class": pack.class_key}
            if pack is not None
            else _("Card-hours used with no pack (%(class)s)") % {"class": line["class"]}
        )
        rows.append(
            SlaCreditLine(
                to=line["to"],
                pack_id=line.get("pack_id"),
                pack_label=label,
                pack_class=line["class"],
                card_hours=from_micros(int(line["card_hours_micros"])),
                value_cny=micros_to_fen(int(line["value_micros"])),
                gross_cny=micros_to_fen(int(line["gross_micros"])),
            )
        )
    return rows
