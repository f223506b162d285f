"""SLA credit notes: rating run backwards for part of one lease's charge, and disputes decided by a new transfer.

broker attributes a lease's lost time (broker.services.sla) and calls :func:`sla_credit_issue` with plain
values: the lease's id and usage reference, its window and the seconds lost and excluded, the availability.
Metering owns the rest: the price card's schedule gives the credit percentage (metering.sla), the lease's
rated segments give its charge, and the credit reverses that fraction of every amount rating posted for it,
account by account, as one balanced ``sla_credit`` transfer (idempotency key ``sla_credit:<reference>``):

- drawn from a pack that can still be drawn (not expired or refunded): the pack gets ``f × drawn``
  card-hours back (its class's unit, against issuance), the buyer's prepaid money ``f × value`` back;
  a pack used up by the drawing is active again;
- drawn from a pack that can no longer be drawn: the prepaid value ``f × value`` goes to the buyer's money
  balance (which nets against anything owed) — card-hours in a dead pack would be worth nothing;
- used with no pack (arrears): the arrears of the class shrink by ``f × card-hours``, the money owed by
  ``f × gross``;
- on the other side, as rating credited them: the operator's payable shrinks by ``f × (gross − commission)``,
  the platform's commission by ``f × commission`` (the platform gives back its share of a charge it
  credits, so the operator bears exactly its part), and the platform's spread by ``f × (value − gross)``.

Every amount is an exact integer of micro-units, rounded half to even once per pack or class; the spread is
the difference of the rounded value and gross, so each unit sums to zero exactly.

A dispute decided for the operator posts the exact negation of the credit's entries as an
``sla_credit_reversal`` transfer; the credit note and its transfer are never touched.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from core.models import Organisation
from core.money import from_micros, round_div
from core.types import Actor
from metering.errors import SlaCreditDisputeDecidedError
from metering.models import (
    STANDARD_CLASS,
    BuyerExhaustion,
    LedgerAccount,
    LedgerTransfer,
    Pack,
    PriceCard,
    RatedSegment,
    SlaCredit,
    SlaCreditDispute,
    TransferKind,
    UsagePending,
    UsageRecord,
)
from metering.services import ledger
from metering.sla import sla_credit_tier

_PERCENT_SCALE = 1000  # credit percentages carry at most three decimals (metering.sla)


@dataclass(frozen=True)
class LeaseChargeGroup:
    """What rating drew for one lease from one pack (``pack_id``) or, with no pack, as arrears of a class."""

    pack_id: int | None
    pack_class: str
    card_hours: int  # micro-card-hours drawn
    value: int  # micro-CNY of prepaid value consumed (= gross for arrears)
    gross: int
    commission: int


def sla_lease_usage_pending(*, reference: str) -> bool:
    """Whether any usage reported against ``reference`` still waits for rating (then its charge is not
    known yet, and the lease is not assessed)."""
    return UsagePending.objects.filter(
        Exists(UsageRecord.objects.filter(pk=OuterRef("usage_record_id"), reference=reference))
    ).exists()


def sla_lease_charge(*, reference: str) -> list[LeaseChargeGroup]:
    """The rated charge of the usage reported against ``reference``, per pack (or arrears class)."""
    rows = (
        RatedSegment.objects.filter(usage_record__reference=reference)
        .order_by()
        .values("pack_id", "pack_class")
        .annotate(
            card_hours=Sum("pack_draw"),
            value=Sum("buyer_value"),
            gross=Sum("gross"),
            commission=Sum("commission"),
        )
    )
    return sorted(
        (
            LeaseChargeGroup(
                pack_id=row["pack_id"],
                pack_class=row["pack_class"],
                card_hours=int(row["card_hours"] or 0),
                value=int(row["value"] or 0),
                gross=int(row["gross"] or 0),
                commission=int(row["commission"] or 0),
            )
            for row in rows
        ),
        key=lambda group: (group.pack_id is None, group.pack_id or 0, group.pack_class),
    )


def _share(amount: int, percent_milli: int) -> int:
    return round_div(amount * percent_milli, 100 * _PERCENT_SCALE)


def sla_credit_reason(credit: SlaCredit) -> str:
    """The buyer-readable reason, in the active language, from the figures on the note."""
    return _(
        "SLA credit for lease %(lease)s on %(cluster)s: availability %(availability)s %% against a service "
        "level of %(level)s %% (%(lost)s min lost to the operator out of %(counted)s min counted); below "
        "%(tier)s %%, %(credit)s %% of the lease's charge is credited."
    ) % {
        "lease": credit.lease_id,
        "cluster": credit.cluster.cpi,
        "availability": credit.availability_percent,
        "level": percent_text(credit.service_level_percent),
        "lost": _minutes(credit.lost_seconds),
        "counted": _minutes(
            credit.window_seconds - credit.excluded_buyer_seconds - credit.excluded_maintenance_seconds
        ),
        "tier": percent_text(credit.tier_below_percent),
        "credit": percent_text(credit.credit_percent),
    }


def percent_text(value: Decimal) -> str:
    """A percentage as people write it: 99.5, 90, 83.333 (no trailing zeros, no exponent)."""
    return format(value.normalize(), "f")


def _minutes(seconds: int) -> str:
    return f"{Decimal(seconds) / 60:.1f}"


@transaction.atomic
def sla_credit_issue(
    *,
    lease_id: int,
    reference: str,
    buyer_id: int,
    operator_id: int,
    cluster_id: int,
    price_card_id: int,
    window_start_at: datetime,
    window_end_at: datetime,
    window_seconds: int,
    lost_seconds: int,
    excluded_buyer_seconds: int,
    excluded_maintenance_seconds: int,
    availability_percent: Decimal,
    intervals: dict[str, list[list[str]]] | None = None,
    now: datetime | None = None,
) -> SlaCredit | None:
    """Issue the credit note a lease's availability earns under its price card, exactly once per lease.

    Returns the note, or None when the availability is in no tier of the card's schedule or the lease has
    no rated charge. A lease already credited returns its note and posts nothing (the transfer's
    idempotency key and the note's unique lease id both guard it). The caller has made sure the lease's
    usage is rated (sla_lease_usage_pending). Side effects: one ``sla_credit`` transfer; a used-up pack that
    gets card-hours back is active again and its class's exhaustion flag is cleared.
    """
    existing = SlaCredit.objects.filter(lease_id=lease_id).first()
    if existing is not None:
        return existing
    now = now or timezone.now()
    card = PriceCard.objects.select_related("cluster").get(pk=price_card_id)
    if card.sla_availability_percent is None:
        return None
    tier = sla_credit_tier(schedule=card.sla_credit_schedule, availability=availability_percent)
    if tier is None:
        return None
    percent_milli = int(tier.credit_percent * _PERCENT_SCALE)
    groups = sla_lease_charge(reference=reference)
    charge_gross = sum(group.gross for group in groups)

    packs = Pack.objects.in_bulk([g.pack_id for g in groups if g.pack_id is not None])
    sums: dict[LedgerAccount, int] = defaultdict(int)
    lines: list[dict[str, object]] = []
    credit_gross = credit_commission = credit_value = 0
    revived: list[Pack] = []
    buyer = Organisation.objects.get(pk=buyer_id)
    operator = Organisation.objects.get(pk=operator_id)
    money = ledger.account_buyer_money(buyer=buyer)
    for group in groups:
        hours = _share(group.card_hours, percent_milli)
        value = _share(group.value, percent_milli)
        gross = _share(group.gross, percent_milli)
        commission = _share(group.commission, percent_milli)
        if gross == 0 and value == 0 and hours == 0:
            continue
        pack = packs.get(group.pack_id) if group.pack_id is not None else None
        if pack is None:
            to = "arrears"
            sums[ledger.account_arrears(buyer=buyer, class_key=group.pack_class)] += hours
            sums[ledger.account_issuance(class_key=group.pack_class)] -= hours
            sums[money] -= gross
            value = gross
        elif pack.status in (Pack.Status.EXPIRED, Pack.Status.REFUNDED) or pack.expires_at <= now:
            to = "money"
            sums[money] -= value
            sums[ledger.account_platform_spread()] += value - gross
        else:
            to = "pack"
            sums[ledger.account_pack(pack=pack)] += hours
            sums[ledger.account_issuance(class_key=pack.class_key)] -= hours
            sums[money] -= value
            sums[ledger.account_platform_spread()] += value - gross
            if pack.status == Pack.Status.EXHAUSTED and hours > 0:
                revived.append(pack)
        sums[ledger.account_operator_earnings(operator=operator)] += gross - commission
        sums[ledger.account_platform_commission()] += commission
        credit_gross += gross
        credit_commission += commission
        credit_value += value
        lines.append(
            {
                "pack_id": group.pack_id,
                "class": group.pack_class,
                "to": to,
                "card_hours_micros": hours if to != "money" else 0,
                "value_micros": value,
                "gross_micros": gross,
                "commission_micros": commission,
            }
        )
    if credit_gross <= 0:
        return None

    transfer, _created = ledger.transfer_post(
        kind=TransferKind.SLA_CREDIT,
        idempotency_key=f"sla_credit:{reference}",
        description=(
            f"SLA credit for {reference}: availability {availability_percent} % < {tier.below_percent} %, "
            f"{tier.credit_percent} % of {from_micros(charge_gross)} CNY"
        ),
        posted_by="sla",
        postings=list(sums.items()),
        posted_at=now,
    )
    try:
        with transaction.atomic():
            credit = SlaCredit.objects.create(
                buyer_id=buyer_id,
                operator_id=operator_id,
                cluster_id=cluster_id,
                price_card=card,
                lease_id=lease_id,
                reference=reference,
                window_start_at=window_start_at,
                window_end_at=window_end_at,
                window_seconds=window_seconds,
                lost_seconds=lost_seconds,
                excluded_buyer_seconds=excluded_buyer_seconds,
                excluded_maintenance_seconds=excluded_maintenance_seconds,
                availability_percent=availability_percent,
                service_level_percent=card.sla_availability_percent,
                tier_below_percent=tier.below_percent,
                credit_percent=tier.credit_percent,
                charge_gross=charge_gross,
                credit_gross=credit_gross,
                credit_commission=credit_commission,
                credit_buyer_value=credit_value,
                lines=lines,
                intervals=intervals or {},
                transfer=transfer,
                issued_at=now,
            )
    except IntegrityError:
        # Another worker issued this lease's note first (it committed the transfer too): return it.
        return SlaCredit.objects.get(lease_id=lease_id)
    for pack in revived:
        Pack.objects.filter(pk=pack.pk, status=Pack.Status.EXHAUSTED).update(
            status=Pack.Status.ACTIVE, closed_at=None
        )
        flags = BuyerExhaustion.objects.filter(buyer_id=buyer_id, cleared_at__isnull=True)
        if pack.class_key != STANDARD_CLASS:
            flags = flags.filter(pack_class=pack.class_key)
        flags.update(cleared_at=now)
    return credit


@transaction.atomic
def sla_credit_dispute_decide(
    *, credit: SlaCredit, accepted: bool, reason: str, actor: Actor, now: datetime | None = None
) -> SlaCreditDispute:
    """Record staff's decision on the operator's dispute of ``credit``: one decision per note.

    Accepted posts an ``sla_credit_reversal`` transfer that negates every entry of the credit's transfer
    (the buyer gives back exactly what it got, the operator gets back what it was debited); rejected posts
    nothing. The credit note and its transfer are never edited. Raises SlaCreditDisputeDecidedError when
    the note already has a decision. A pack that has since been drawn below what the reversal takes back
    makes the reversal fail with InsufficientBalanceError (nothing written): the buyer has used the hours.
    """
    now = now or timezone.now()
    credit = SlaCredit.objects.select_for_update().get(pk=credit.pk)
    if SlaCreditDispute.objects.filter(credit=credit).exists():
        raise SlaCreditDisputeDecidedError(
            _("The dispute of SLA credit %(credit)s has already been decided.") % {"credit": credit.pk},
            extra={"credit_id": credit.pk},
        )
    reversal: LedgerTransfer | None = None
    if accepted:
        entries = list(credit.transfer.entries.select_related("account"))
        reversal, _created = ledger.transfer_post(
            kind=TransferKind.SLA_CREDIT_REVERSAL,
            idempotency_key=f"sla_credit_reversal:{credit.reference}",
            description=f"SLA credit {credit.pk} reversed after the operator's dispute: {reason}",
            posted_by=actor.label,
            postings=[(entry.account, -entry.amount) for entry in entries],
            posted_at=now,
        )
    return SlaCreditDispute.objects.create(
        credit=credit,
        outcome=SlaCreditDispute.Outcome.ACCEPTED if accepted else SlaCreditDispute.Outcome.REJECTED,
        reason=reason[:500],
        decided_by=actor.label[:200],
        decided_at=now,
        reversal_transfer=reversal,
    )
