"""Month-end close: buyer invoices and operator settlements, each issued exactly once per period.

Periods are calendar months in ``CARDHOUR_BILLING_TIME_ZONE`` (Asia/Shanghai): the period of
``period_start`` is ``[local midnight of period_start, local midnight of the first of the next month)``.

**Rounding.** Every amount on a rated segment is an exact integer of micro-units (core.money). A statement
line sums the exact integers of its segments and is quantised once, to the fen, half to even, with
``core.money.micros_to_fen``. A statement's totals are the sums of its quantised lines, never a re-rounded
grand total, so a printed statement adds up to the fen. A settlement line quantises ``gross`` and
``commission`` and takes ``payable`` as their difference, so ``payable = gross − commission`` holds on every
line and on the totals (the database checks it on the settlement).

**Exactly once.** A close is one ``BillingCloseRun`` per period (unique); a run that finished is never
repeated. Each statement is issued in its own transaction and is unique per (organisation, period): the
statement row is inserted *first*, so a second issuer of the same statement waits on the unique index and
then returns the first one. The segments, orders and refunds a statement covers are attached to it in the
same transaction (a segment's ``invoice`` / ``settlement`` is set by an ``UPDATE … WHERE invoice IS NULL``),
so a segment lands on exactly one invoice and one settlement. A crash half-way leaves whole statements
behind; the next run issues the rest.

**Late usage.** Whatever was rated before a close and is not yet on a statement goes on that close's
statement. Usage that starts before the period (an earlier, already-closed month, reported late within
``CARDHOUR_LATE_USAGE_DAYS``) becomes ``prior_period`` lines: an issued statement never changes.

**Amounts on an invoice.** Packs are paid through Stripe when bought, so ``packs_amount`` (one line per order
paid) and ``refunds_amount`` (negative credit lines) make ``total_paid``; usage drawn from packs is
informational (``usage_value``: the prepaid value consumed). What is owed is ``amount_due`` =
``arrears_amount``: card-hours used with no pack, at the operator's price (gross).

**Arrears carried and settled.** What is owed runs from one invoice to the next: ``amount_due`` =
``arrears_brought_forward`` (the previous invoice's amount due) + ``arrears_amount`` (new owed lines) +
``arrears_settled`` (one negative ``arrears_paid`` line per settlement made from a new pack in the period,
metering.services.packs). Each settlement is stated once, on the first invoice issued after it.

**SLA credits.** A credit note (metering.services.sla) issued before the period's end and on no statement yet
goes on that close's statements as its own lines: on the buyer's invoice, the prepaid value it gave back
(negative, counted in ``usage_value``) and what it took off the money owed (negative, an owed line, so it
lowers ``amount_due``); on the operator's settlement, the credited gross and commission (negative). An
accepted dispute's reversal goes on the next statements with the opposite signs. Issued statements never
change.

**VAT.** Every line carries its product kind's rate (``CARDHOUR_VAT_RATES``, metering.tax) and its split:
the amount is gross (tax included), the net is rounded once per line to the fen, half to even, and the tax
is the rest. ``net_amount`` / ``tax_amount`` of an invoice are the sums over what was paid (packs bought
and refunds), the lines a fapiao is issued for (metering.fapiao); usage lines carry their split for
information.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    DecimalField,
    Exists,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, Concat
from django.utils import timezone
from django.utils.translation import gettext as _

from core.models import Organisation
from core.money import from_micros, micros_to_fen
from federation.models import Cluster
from metering import tax
from metering.errors import BillingPeriodInvalidError, BillingPeriodOpenError
from metering.models import (
    ArrearsSettlement,
    Band,
    BillingCloseRun,
    Invoice,
    InvoiceLine,
    PackOrder,
    PackRefund,
    RatedSegment,
    Settlement,
    SettlementLine,
    SlaCredit,
    SlaCreditDispute,
    UsageRecord,
)
from metering.services import statements

logger = logging.getLogger("cardhour.billing")

ZERO = Decimal("0.00")
STATEMENT_NUMBER_MAX_LENGTH = 40  # Invoice.number / Settlement.number


# --- Periods ----------------------------------------------------------------------------------------


def billing_zone() -> ZoneInfo:
    return ZoneInfo(settings.CARDHOUR_BILLING_TIME_ZONE)


def billing_period_end(*, period_start: date) -> date:
    """The first day after the month that starts at ``period_start``."""
    return (period_start.replace(day=28) + timedelta(days=4)).replace(day=1)


def billing_period_bounds(*, period_start: date) -> tuple[datetime, datetime]:
    """The period ``[start, end)`` as aware datetimes at local midnight in the billing zone.

    Raises BillingPeriodInvalidError unless ``period_start`` is the first day of a month.
    """
    if period_start.day != 1:
        raise BillingPeriodInvalidError(
            _("A billing period starts on the first day of a month, not %(date)s.")
            % {"date": period_start.isoformat()},
            extra={"period_start": period_start.isoformat()},
        )
    zone = billing_zone()
    end = billing_period_end(period_start=period_start)
    return datetime.combine(period_start, time(), tzinfo=zone), datetime.combine(end, time(), tzinfo=zone)


def billing_previous_period_start(*, now: datetime | None = None) -> date:
    """The first day of the month before the one ``now`` (default: now) falls in, in the billing zone."""
    local = (now or timezone.now()).astimezone(billing_zone()).date()
    return (local.replace(day=1) - timedelta(days=1)).replace(day=1)


def _statement_number(prefix: str, period_start: date, organisation: Organisation) -> str:
    """``INV-YYYYMM-<slug>`` / ``STL-YYYYMM-<slug>``. A slug may be 32 characters and the number column
    holds 40: a slug too long to fit is cut and suffixed with the organisation's id, which keeps the number
    unique (two slugs can share a prefix, never an id)."""
    head = f"{prefix}-{period_start:%Y%m}-"
    slug = organisation.slug
    if len(head) + len(slug) > STATEMENT_NUMBER_MAX_LENGTH:
        suffix = f"-{organisation.pk}"
        slug = slug[: STATEMENT_NUMBER_MAX_LENGTH - len(head) - len(suffix)].rstrip("-") + suffix
    return head + slug


def invoice_number(*, buyer: Organisation, period_start: date) -> str:
    return _statement_number("INV", period_start, buyer)


def settlement_number(*, operator: Organisation, period_start: date) -> str:
    return _statement_number("STL", period_start, operator)


# --- What is still to be stated ---------------------------------------------------------------------


def _refund_description(refund: PackRefund) -> str:
    return f"Refund {refund.stripe_refund_id}, order {refund.order_id}"


# The same text in SQL. InvoiceLine has no refund foreign key, so a refund line is recognised by this
# description (the Stripe refund id in it is unique): a refund is stated once, on the first close after
# it was recorded, even when Stripe reports it late.
_REFUND_DESCRIPTION_SQL = Concat(
    Value("Refund "),
    "stripe_refund_id",
    Value(", order "),
    Cast("order_id", CharField()),
    output_field=CharField(),
)


def _unstated_orders(*, end_at: datetime) -> QuerySet[PackOrder]:
    """Orders paid before ``end_at`` and on no invoice yet (a late webhook's order goes on the next one)."""
    stated = InvoiceLine.objects.filter(kind=InvoiceLine.Kind.PACK_PURCHASE, order_id=OuterRef("pk"))
    return PackOrder.objects.filter(paid_at__isnull=False, paid_at__lt=end_at).exclude(Exists(stated))


def _unstated_refunds(*, end_at: datetime) -> QuerySet[PackRefund]:
    stated = InvoiceLine.objects.filter(
        kind=InvoiceLine.Kind.REFUND, order_id=OuterRef("order_id"), description=OuterRef("line_description")
    )
    return (
        PackRefund.objects.filter(refunded_at__lt=end_at)
        .annotate(line_description=_REFUND_DESCRIPTION_SQL)
        .exclude(Exists(stated))
    )


def _segments_of(*, records: QuerySet[UsageRecord], end_at: datetime) -> QuerySet[RatedSegment]:
    """Segments of the given usage records (which start before ``end_at``). Segments are indexed only by
    (usage_record, seq, record_start_at) — rating writes millions of them — so a statement reaches its
    segments through its organisation's records (indexed by buyer / operator and start), never by a scan
    of the segment table. A record starts no later than any of its segments, so ``record.start_at < end``
    loses nothing; ``record_start_at < end`` says the same on the segments' partition column, so
    PostgreSQL skips every month after the period."""
    return RatedSegment.objects.filter(
        usage_record_id__in=Subquery(records.values("pk")), record_start_at__lt=end_at
    )


# ``record_start_at <= start_at``: the partition bound is implied and lets PostgreSQL skip later months.
def _uninvoiced_segments(*, end_at: datetime) -> QuerySet[RatedSegment]:
    return RatedSegment.objects.filter(invoice__isnull=True, start_at__lt=end_at, record_start_at__lt=end_at)


def _unsettled_segments(*, end_at: datetime) -> QuerySet[RatedSegment]:
    return RatedSegment.objects.filter(
        settlement__isnull=True, start_at__lt=end_at, record_start_at__lt=end_at
    )


def _distinct(values: Iterable[int | None]) -> set[int]:
    return {value for value in values if value is not None}


def billing_buyers_to_invoice(*, period_start: date) -> list[int]:
    """Ids of the buyers with anything not yet invoiced up to the end of the period: rated segments, paid
    orders, refunds, arrears settlements."""
    _, end_at = billing_period_bounds(period_start=period_start)
    ids = _distinct(
        _uninvoiced_segments(end_at=end_at)
        .order_by()
        .values_list("buyer_id", flat=True)  # the segment's own copy: no join to the records
        .distinct()
    )
    ids |= _distinct(_unstated_orders(end_at=end_at).order_by().values_list("buyer_id", flat=True).distinct())
    ids |= _distinct(
        _unstated_refunds(end_at=end_at).order_by().values_list("order__buyer_id", flat=True).distinct()
    )
    ids |= _distinct(
        ArrearsSettlement.objects.filter(invoice__isnull=True, settled_at__lt=end_at)
        .order_by()
        .values_list("buyer_id", flat=True)
        .distinct()
    )
    ids |= _distinct(
        SlaCredit.objects.filter(invoice__isnull=True, issued_at__lt=end_at)
        .order_by()
        .values_list("buyer_id", flat=True)
        .distinct()
    )
    ids |= _distinct(
        SlaCreditDispute.objects.filter(
            invoice__isnull=True, outcome=SlaCreditDispute.Outcome.ACCEPTED, decided_at__lt=end_at
        )
        .order_by()
        .values_list("credit__buyer_id", flat=True)
        .distinct()
    )
    return sorted(ids)


def billing_operators_to_settle(*, period_start: date) -> list[int]:
    """Ids of the operators with anything not yet settled up to the end of the period: rated segments, SLA
    credit notes against them, reversals of those notes."""
    _, end_at = billing_period_bounds(period_start=period_start)
    ids = _distinct(
        _unsettled_segments(end_at=end_at)
        .order_by()
        .values_list("operator_id", flat=True)  # the segment's own copy: no join to the records
        .distinct()
    )
    ids |= _distinct(
        SlaCredit.objects.filter(settlement__isnull=True, issued_at__lt=end_at)
        .order_by()
        .values_list("operator_id", flat=True)
        .distinct()
    )
    ids |= _distinct(
        SlaCreditDispute.objects.filter(
            settlement__isnull=True, outcome=SlaCreditDispute.Outcome.ACCEPTED, decided_at__lt=end_at
        )
        .order_by()
        .values_list("credit__operator_id", flat=True)
        .distinct()
    )
    return sorted(ids)


# --- Grouping segments into lines -------------------------------------------------------------------


@dataclass(frozen=True)
class _SegmentGroup:
    cluster_id: int
    band: str
    pack_class: str
    prior: bool
    arrears: bool
    card_seconds: int
    pack_draw: int
    gross: int
    commission: int
    buyer_value: int


_BAND_ORDER = {band.value: position for position, band in enumerate(Band)}


def _segment_groups(
    segments: QuerySet[RatedSegment], *, start_at: datetime, by_pack_class: bool
) -> list[_SegmentGroup]:
    """Exact integer sums of ``segments`` per (cluster, band[, pack class], prior period?, arrears?), in SQL."""
    keys = ["usage_record__cluster_id", "band", "prior", "arrears"] + (
        ["pack_class"] if by_pack_class else []
    )
    rows = (
        segments.annotate(
            prior=Case(
                When(start_at__lt=start_at, then=Value(True)),
                default=Value(False),
                output_field=BooleanField(),
            ),
            arrears=Case(
                When(pack__isnull=True, then=Value(True)), default=Value(False), output_field=BooleanField()
            ),
        )
        .order_by()
        .values(*keys)
        .annotate(
            s_card_seconds=Sum("card_seconds"),
            s_pack_draw=Sum("pack_draw"),
            s_gross=Sum("gross"),
            s_commission=Sum("commission"),
            s_buyer_value=Sum("buyer_value"),
        )
    )
    # PostgreSQL sums bigints as numeric (Decimal in Python): back to exact ints.
    groups = [
        _SegmentGroup(
            cluster_id=row["usage_record__cluster_id"],
            band=row["band"],
            pack_class=row.get("pack_class", ""),
            prior=bool(row["prior"]),
            arrears=bool(row["arrears"]),
            card_seconds=int(row["s_card_seconds"]),
            pack_draw=int(row["s_pack_draw"]),
            gross=int(row["s_gross"]),
            commission=int(row["s_commission"]),
            buyer_value=int(row["s_buyer_value"]),
        )
        for row in rows
    ]
    cpis = _cluster_cpis(groups)
    groups.sort(
        key=lambda g: (
            g.prior,
            g.arrears,
            cpis.get(g.cluster_id, ""),
            _BAND_ORDER.get(g.band, 99),
            g.pack_class,
        )
    )
    return groups


def _cluster_cpis(groups: Iterable[_SegmentGroup]) -> dict[int, str]:
    return dict(Cluster.objects.filter(pk__in={g.cluster_id for g in groups}).values_list("pk", "cpi"))


# --- Invoices ---------------------------------------------------------------------------------------


def _product_kind(kind: str) -> str:
    paid = kind in (InvoiceLine.Kind.PACK_PURCHASE, InvoiceLine.Kind.REFUND)
    return tax.ProductKind.PACK_PURCHASE if paid else tax.ProductKind.COMPUTE_SERVICE


def _with_vat(line: InvoiceLine) -> InvoiceLine:
    line.product_kind = _product_kind(line.kind)
    line.vat_rate = tax.vat_rate(kind=line.product_kind)
    line.net_amount, line.tax_amount = tax.vat_split(gross=line.amount, rate=line.vat_rate)
    return line


def _invoice_lines(
    *, invoice: Invoice, buyer: Organisation, start_at: datetime, end_at: datetime, attach: bool = True
) -> tuple[list[InvoiceLine], set[int]]:
    """Attach what the invoice covers and build its lines (not saved); also the seqs of the owed lines.

    With ``attach`` (issuing) it must run inside the issuing transaction, after the invoice row exists.
    Without (a preview) it writes nothing: it reads what is not yet on any invoice, as issuing would
    attach it now."""
    lines: list[InvoiceLine] = []
    owed: set[int] = set()
    owed_micros = cleared_micros = 0  # exact money owed and cleared on this invoice

    def add(**fields: object) -> None:
        lines.append(_with_vat(InvoiceLine(invoice=invoice, seq=len(lines) + 1, **fields)))

    orders = list(
        _unstated_orders(end_at=end_at)
        .filter(buyer=buyer)
        .select_related("product", "accelerator", "pack")
        .order_by("paid_at", "pk")
    )
    for order in orders:
        pack = getattr(order, "pack", None)
        kind_of = order.accelerator.slug if order.accelerator_id and order.accelerator else "standard cards"
        add(
            kind=InvoiceLine.Kind.PACK_PURCHASE,
            description=(
                f"Pack: {order.product.name}, {order.card_hours} card-hours of {kind_of}, "
                f"paid {timezone.localtime(order.paid_at, billing_zone()):%Y-%m-%d}"
            )[:300],
            order=order,
            pack=pack,
            amount=order.amount,
        )

    # Usage: the UPDATE re-checks ``invoice IS NULL`` on each row it changes, so a segment another
    # transaction attached first is skipped, never attached twice.
    scope = _segments_of(records=UsageRecord.objects.filter(buyer=buyer, start_at__lt=end_at), end_at=end_at)
    if attach:
        scope.filter(invoice__isnull=True, start_at__lt=end_at).update(invoice=invoice)
        covered = scope.filter(invoice=invoice)
    else:
        covered = scope.filter(invoice__isnull=True, start_at__lt=end_at)
    groups = _segment_groups(covered, start_at=start_at, by_pack_class=True)
    cpis = _cluster_cpis(groups)
    for group in groups:
        where = f"{cpis.get(group.cluster_id, group.cluster_id)}, {Band(group.band).label.lower()}"
        if group.arrears:
            description = f"Card-hours used with no pack (owed): {where}"
            amount = micros_to_fen(group.gross)
            owed_micros += group.gross
        else:
            description = f"Card-hours used from {group.pack_class} packs: {where}"
            amount = micros_to_fen(group.buyer_value)
        if group.prior:
            kind = InvoiceLine.Kind.PRIOR_PERIOD
            description = f"Late, from before {start_at:%Y-%m}: {description}"
        else:
            kind = InvoiceLine.Kind.ARREARS if group.arrears else InvoiceLine.Kind.USAGE
        add(
            kind=kind,
            description=description[:300],
            cluster_id=group.cluster_id,
            band=group.band,
            card_seconds=group.card_seconds,
            card_hours_drawn=from_micros(group.pack_draw),
            amount=amount,
        )
        if group.arrears:
            owed.add(len(lines))

    settled = ArrearsSettlement.objects.filter(buyer=buyer, settled_at__lt=end_at)
    if attach:
        settled.filter(invoice__isnull=True).update(invoice=invoice)
        settled = settled.filter(invoice=invoice)
    else:
        settled = settled.filter(invoice__isnull=True)
    for settlement in settled.select_related("pack", "pack__accelerator").order_by("settled_at", "pk"):
        cleared_micros += settlement.money_cleared
        add(
            kind=InvoiceLine.Kind.ARREARS_PAID,
            description=arrears_settlement_description(settlement)[:300],
            order_id=settlement.order_id,
            pack_id=settlement.pack_id,
            card_hours_drawn=from_micros(settlement.pack_draw),
            amount=-micros_to_fen(settlement.money_cleared),
            arrears_settlement=settlement,
        )

    for sla_kind, credit, sign in _sla_unstated(buyer=buyer, end_at=end_at, invoice=invoice, attach=attach):
        value, hours, arrears, arrears_hours = _sla_parts(credit)
        what = (
            f"SLA credit SLA-{credit.pk}, lease {credit.lease_id} on {credit.cluster.cpi}: availability "
            f"{credit.availability_percent} % < {credit.tier_below_percent.normalize():f} %, "
            f"{credit.credit_percent.normalize():f} % of the lease's charge"
        )
        if sla_kind == InvoiceLine.Kind.SLA_REVERSAL:
            what = f"Reversed after the operator's dispute: {what}"
        if value:
            add(
                kind=sla_kind,
                description=f"{what} (prepaid value back)"[:300],
                cluster_id=credit.cluster_id,
                sla_credit=credit,
                card_hours_drawn=from_micros(-sign * hours),
                amount=-sign * micros_to_fen(value),
            )
        if arrears:
            add(
                kind=sla_kind,
                description=f"{what} (off what is owed)"[:300],
                cluster_id=credit.cluster_id,
                sla_credit=credit,
                card_hours_drawn=from_micros(-sign * arrears_hours),
                amount=-sign * micros_to_fen(arrears),
            )
            owed.add(len(lines))
            owed_micros -= sign * arrears

    refunds = list(_unstated_refunds(end_at=end_at).filter(order__buyer=buyer).order_by("refunded_at", "pk"))
    for refund in refunds:
        add(
            kind=InvoiceLine.Kind.REFUND,
            description=_refund_description(refund),
            order_id=refund.order_id,
            pack_id=refund.pack_id,
            card_hours_drawn=from_micros(refund.card_hours_debited),
            amount=-refund.amount,
        )
    _absorb_settlement_rounding(
        lines=lines,
        owed=owed,
        buyer=buyer,
        period_start=invoice.period_start,
        owed_micros=owed_micros,
        cleared_micros=cleared_micros,
    )
    return lines, owed


def _sla_parts(credit: SlaCredit) -> tuple[int, int, int, int]:
    """(prepaid value back, its card-hours, money owed taken off, its card-hours) of a note, micro-units."""
    value = hours = arrears = arrears_hours = 0
    for line in credit.lines:
        if line["to"] == "arrears":
            arrears += int(line["gross_micros"])
            arrears_hours += int(line["card_hours_micros"])
        else:
            value += int(line["value_micros"])
            hours += int(line["card_hours_micros"])
    return value, hours, arrears, arrears_hours


def _sla_unstated(
    *, buyer: Organisation, end_at: datetime, invoice: Invoice, attach: bool
) -> list[tuple[str, SlaCredit, int]]:
    """The buyer's SLA credit notes (sign 1) and reversals of them (sign −1) issued before ``end_at`` and on
    no invoice yet, attached to ``invoice`` when issuing (``UPDATE … WHERE invoice IS NULL``), in order."""
    credits = SlaCredit.objects.filter(buyer=buyer, issued_at__lt=end_at).select_related("cluster")
    reversals = SlaCreditDispute.objects.filter(
        credit__buyer=buyer, outcome=SlaCreditDispute.Outcome.ACCEPTED, decided_at__lt=end_at
    ).select_related("credit", "credit__cluster")
    if attach:
        credits.filter(invoice__isnull=True).update(invoice=invoice)
        reversals.filter(invoice__isnull=True).update(invoice=invoice)
        credits, reversals = credits.filter(invoice=invoice), reversals.filter(invoice=invoice)
    else:
        credits, reversals = credits.filter(invoice__isnull=True), reversals.filter(invoice__isnull=True)
    rows = [(credit.issued_at, credit.pk, InvoiceLine.Kind.SLA_CREDIT, credit, 1) for credit in credits]
    rows += [(d.decided_at, d.credit_id, InvoiceLine.Kind.SLA_REVERSAL, d.credit, -1) for d in reversals]
    return [(kind, credit, sign) for _at, _pk, kind, credit, sign in sorted(rows, key=lambda r: r[:3])]


def _sla_owed_taken_off_before(*, buyer: Organisation, period_start: date) -> int:
    """Money owed taken off by SLA credits (less reversals) stated on the buyer's earlier invoices."""
    total = 0
    for credit in SlaCredit.objects.filter(buyer=buyer, invoice__period_start__lt=period_start):
        total += _sla_parts(credit)[2]
    for dispute in SlaCreditDispute.objects.filter(
        credit__buyer=buyer, invoice__period_start__lt=period_start
    ).select_related("credit"):
        total -= _sla_parts(dispute.credit)[2]
    return total


def _absorb_settlement_rounding(
    *,
    lines: list[InvoiceLine],
    owed: set[int],
    buyer: Organisation,
    period_start: date,
    owed_micros: int,
    cleared_micros: int,
) -> None:
    """Make an invoice that states an arrears settlement end on the money still owed, rounded once.

    Each owed line and each settlement line is rounded to the fen on its own, so after a settlement the
    stated amount due could be a fen or two off the exact money still owed — and a buyer who has paid every
    owed card-hour would be left owing ¥0.01 that no later pack could ever clear (the ledger owes nothing).
    The rule: on an invoice with arrears-paid lines, the last one absorbs that rounding, so the amount due
    is the exact money owed at the end of the period (every owed segment stated so far less every
    settlement stated so far, in micro-units) rounded once to the fen. Invoices without a settlement keep
    the plain rule (the sum of their rounded lines)."""
    paid = [line for line in lines if line.kind == InvoiceLine.Kind.ARREARS_PAID]
    if not paid:
        return
    earlier_owed = (
        RatedSegment.objects.filter(
            invoice__buyer=buyer, invoice__period_start__lt=period_start, pack__isnull=True
        ).aggregate(total=Sum("gross"))["total"]
        or 0
    )
    earlier_cleared = (
        ArrearsSettlement.objects.filter(buyer=buyer, invoice__period_start__lt=period_start).aggregate(
            total=Sum("money_cleared")
        )["total"]
        or 0
    )
    earlier_owed -= _sla_owed_taken_off_before(buyer=buyer, period_start=period_start)
    exact_due = micros_to_fen(earlier_owed + owed_micros - earlier_cleared - cleared_micros)
    stated_due = _brought_forward(buyer=buyer, period_start=period_start) + sum(
        (line.amount for line in lines if line.seq in owed or line.kind == InvoiceLine.Kind.ARREARS_PAID),
        ZERO,
    )
    if exact_due != stated_due:
        last = paid[-1]
        last.amount += exact_due - stated_due
        _with_vat(last)


def arrears_settlement_description(settlement: ArrearsSettlement) -> str:
    """How an invoice names an arrears settlement: what was owed, the pack that paid and how much of it."""
    pack = settlement.pack
    unit = "standard" if pack.accelerator_id is None else pack.class_key
    at = f" at factor {settlement.factor}" if settlement.factor is not None else ""
    return (
        f"Arrears paid: {from_micros(settlement.arrears_card_hours)} {settlement.arrears_class} card-hours, "
        f"from pack {pack.pk} (order {settlement.order_id}){at}, "
        f"{from_micros(settlement.pack_draw)} {unit} card-hours drawn, "
        f"{timezone.localtime(settlement.settled_at, billing_zone()):%Y-%m-%d}"
    )


def invoice_totals(
    lines: Iterable[InvoiceLine], *, owed: set[int], brought_forward: Decimal = ZERO
) -> dict[str, Decimal]:
    """The invoice's totals as sums of its (already quantised) lines; ``owed`` are the seqs of the lines
    for card-hours used with no pack (arrears, including late arrears from an earlier period);
    ``brought_forward`` the amount due on the buyer's previous invoice."""
    totals = dict.fromkeys(
        (
            "packs_amount",
            "refunds_amount",
            "usage_value",
            "arrears_amount",
            "arrears_settled",
            "net_amount",
            "tax_amount",
        ),
        ZERO,
    )
    for line in lines:
        if line.kind in (InvoiceLine.Kind.PACK_PURCHASE, InvoiceLine.Kind.REFUND):
            key = "packs_amount" if line.kind == InvoiceLine.Kind.PACK_PURCHASE else "refunds_amount"
            totals[key] += line.amount
            totals["net_amount"] += line.net_amount or ZERO
            totals["tax_amount"] += line.tax_amount or ZERO
        elif line.kind == InvoiceLine.Kind.ARREARS_PAID:
            totals["arrears_settled"] += line.amount
        elif line.seq in owed:
            totals["arrears_amount"] += line.amount
        else:
            totals["usage_value"] += line.amount
    totals["total_paid"] = totals["packs_amount"] + totals["refunds_amount"]
    totals["arrears_brought_forward"] = brought_forward
    totals["amount_due"] = brought_forward + totals["arrears_amount"] + totals["arrears_settled"]
    return totals


def _brought_forward(*, buyer: Organisation, period_start: date) -> Decimal:
    previous = (
        Invoice.objects.filter(buyer=buyer, period_start__lt=period_start)
        .order_by("-period_start")
        .values_list("amount_due", flat=True)
        .first()
    )
    return previous if previous is not None else ZERO


@dataclass(frozen=True)
class InvoicePreview:
    """A buyer's invoice as it would be issued now: unsaved rows, nothing attached, nothing frozen."""

    invoice: Invoice
    lines: list[InvoiceLine]
    period_start_at: datetime
    period_end_at: datetime


def invoice_preview(*, buyer: Organisation, now: datetime | None = None) -> InvoicePreview:
    """The buyer's invoice for the current month (billing zone) as it stands, without issuing it.

    Writes nothing — no invoice row, no segment, order, refund or settlement attached, no PDF, no freeze —
    so it lives beside invoice_issue, whose line-building it shares (``attach=False``), rather than in the
    selectors. The lines are what issuing would produce if the month ended now.
    """
    now = now or timezone.now()
    period_start = now.astimezone(billing_zone()).date().replace(day=1)
    start_at, end_at = billing_period_bounds(period_start=period_start)
    invoice = Invoice(
        buyer=buyer,
        period_start=period_start,
        period_end=billing_period_end(period_start=period_start),
        number=invoice_number(buyer=buyer, period_start=period_start),
        issued_at=now,
    )
    lines, owed = _invoice_lines(invoice=invoice, buyer=buyer, start_at=start_at, end_at=end_at, attach=False)
    brought_forward = _brought_forward(buyer=buyer, period_start=period_start)
    for field, value in invoice_totals(lines, owed=owed, brought_forward=brought_forward).items():
        setattr(invoice, field, value)
    return InvoicePreview(invoice=invoice, lines=lines, period_start_at=start_at, period_end_at=end_at)


@transaction.atomic
def invoice_issue(
    *, buyer: Organisation, period_start: date, now: datetime | None = None
) -> tuple[Invoice, bool]:
    """Issue the buyer's invoice for the period, once: ``(invoice, created)``.

    An invoice that exists is returned unchanged (it is final). Otherwise, in one transaction: insert the
    invoice (unique per buyer and period, so a concurrent issuer waits and then gets this one), attach every
    rated segment of the buyer not yet invoiced that starts before the period's end (earlier ones become
    ``prior_period`` lines) and every arrears settlement not yet stated, add a line per order paid and
    per refund not yet invoiced, each line with its VAT split, and store the totals. Raises BillingPeriodInvalidError for a period that does not start on the 1st.
    """
    start_at, end_at = billing_period_bounds(period_start=period_start)
    existing = Invoice.objects.filter(buyer=buyer, period_start=period_start).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            invoice = Invoice.objects.create(
                buyer=buyer,
                period_start=period_start,
                period_end=billing_period_end(period_start=period_start),
                number=invoice_number(buyer=buyer, period_start=period_start),
                issued_at=now or timezone.now(),
            )
    except IntegrityError:
        # Issued by a concurrent run that committed first (the unique index made us wait for it).
        return Invoice.objects.get(buyer=buyer, period_start=period_start), False

    lines, owed = _invoice_lines(invoice=invoice, buyer=buyer, start_at=start_at, end_at=end_at)
    InvoiceLine.objects.bulk_create(lines)
    brought_forward = _brought_forward(buyer=buyer, period_start=period_start)
    totals = invoice_totals(lines, owed=owed, brought_forward=brought_forward)
    for field, value in totals.items():
        setattr(invoice, field, value)
    invoice.save(update_fields=list(totals))
    statements.invoice_freeze(invoice=invoice, now=invoice.issued_at)
    logger.info("invoice %s issued: %d lines, amount due %s", invoice.number, len(lines), invoice.amount_due)
    return invoice, True


# --- Settlements ------------------------------------------------------------------------------------


@transaction.atomic
def settlement_issue(
    *, operator: Organisation, period_start: date, now: datetime | None = None
) -> tuple[Settlement, bool]:
    """Issue the operator's settlement for the period, once: ``(settlement, created)``.

    Same rules as invoice_issue: an existing settlement is returned unchanged; otherwise every rated
    segment of the operator's usage not yet settled that starts before the period's end is attached, and
    summed per (cluster, band, prior period?) into lines of gross, commission and payable.
    """
    start_at, end_at = billing_period_bounds(period_start=period_start)
    existing = Settlement.objects.filter(operator=operator, period_start=period_start).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            settlement = Settlement.objects.create(
                operator=operator,
                period_start=period_start,
                period_end=billing_period_end(period_start=period_start),
                number=settlement_number(operator=operator, period_start=period_start),
                issued_at=now or timezone.now(),
            )
    except IntegrityError:
        return Settlement.objects.get(operator=operator, period_start=period_start), False

    scope = _segments_of(
        records=UsageRecord.objects.filter(operator=operator, start_at__lt=end_at), end_at=end_at
    )
    scope.filter(settlement__isnull=True, start_at__lt=end_at).update(settlement=settlement)
    groups = _segment_groups(scope.filter(settlement=settlement), start_at=start_at, by_pack_class=False)
    # Arrears and pack usage are the same to an operator: merge the groups that differ only by that.
    merged: dict[tuple[bool, int, str], list[int]] = {}
    for group in groups:
        sums = merged.setdefault((group.prior, group.cluster_id, group.band), [0, 0, 0])
        sums[0] += group.card_seconds
        sums[1] += group.gross
        sums[2] += group.commission
    lines: list[SettlementLine] = []
    for (prior, cluster_id, band), (card_seconds, gross_micros, commission_micros) in merged.items():
        gross = micros_to_fen(gross_micros)
        commission = micros_to_fen(commission_micros)
        lines.append(
            SettlementLine(
                settlement=settlement,
                seq=len(lines) + 1,
                cluster_id=cluster_id,
                band=band,
                prior_period=prior,
                card_seconds=card_seconds,
                gross=gross,
                commission=commission,
                payable=gross - commission,
            )
        )
    lines.extend(
        _sla_settlement_lines(settlement=settlement, operator=operator, end_at=end_at, seq=len(lines))
    )
    SettlementLine.objects.bulk_create(lines)
    gross = sum((line.gross for line in lines), ZERO)
    commission = sum((line.commission for line in lines), ZERO)
    money: DecimalField[Decimal, Decimal] = DecimalField(max_digits=14, decimal_places=2)
    Settlement.objects.filter(pk=settlement.pk).update(
        gross=gross,
        commission=commission,
        # Computed by the database, in one statement: SQLite keeps decimals as floating point and checks
        # ``payable = gross − commission`` in floating point (94.40 − 9.44 ≠ 84.96 there), so payable
        # must be the database's own difference. Read back, it is quantised to the fen again.
        payable=Value(gross, output_field=money) - Value(commission, output_field=money),
    )
    settlement.refresh_from_db()
    statements.settlement_freeze(settlement=settlement, now=settlement.issued_at)
    logger.info(
        "settlement %s issued: %d lines, payable %s", settlement.number, len(lines), settlement.payable
    )
    return settlement, True


def _sla_settlement_lines(
    *, settlement: Settlement, operator: Organisation, end_at: datetime, seq: int
) -> list[SettlementLine]:
    """Attach the SLA credit notes issued against the operator before ``end_at`` and not yet on a
    settlement (and the reversals of accepted disputes), and state each as a line: a note debits the
    operator its part of the credited charge (negative gross and commission, the platform giving back its
    commission), a reversal credits it back. Attached with ``UPDATE … WHERE settlement IS NULL`` like the
    segments, so each lands on exactly one settlement; an issued settlement is never changed."""
    credits = SlaCredit.objects.filter(operator=operator, issued_at__lt=end_at)
    credits.filter(settlement__isnull=True).update(settlement=settlement)
    reversals = SlaCreditDispute.objects.filter(
        credit__operator=operator, outcome=SlaCreditDispute.Outcome.ACCEPTED, decided_at__lt=end_at
    )
    reversals.filter(settlement__isnull=True).update(settlement=settlement)
    stated: list[tuple[datetime, int, str, SlaCredit, int]] = [
        (credit.issued_at, credit.pk, SettlementLine.Kind.SLA_CREDIT, credit, -1)
        for credit in credits.filter(settlement=settlement)
    ]
    stated += [
        (dispute.decided_at, dispute.credit_id, SettlementLine.Kind.SLA_CREDIT_REVERSAL, dispute.credit, 1)
        for dispute in reversals.filter(settlement=settlement).select_related("credit")
    ]
    lines: list[SettlementLine] = []
    for _at, _pk, kind, credit, sign in sorted(stated, key=lambda row: (row[0], row[1], row[2])):
        gross = sign * micros_to_fen(credit.credit_gross)
        commission = sign * micros_to_fen(credit.credit_commission)
        lines.append(
            SettlementLine(
                settlement=settlement,
                seq=seq + len(lines) + 1,
                kind=kind,
                cluster_id=credit.cluster_id,
                band="",
                sla_credit=credit,
                card_seconds=0,
                gross=gross,
                commission=commission,
                payable=gross - commission,
            )
        )
    return lines


# --- The close --------------------------------------------------------------------------------------


def billing_close_period(*, period_start: date, now: datetime | None = None) -> BillingCloseRun:
    """Close a month: issue every buyer's invoice and every operator's settlement for it, exactly once.

    Resumable and safe to run twice: the run is unique per period and a finished run returns at once; each
    statement is issued in its own transaction (invoice_issue / settlement_issue), so a crash half-way
    leaves whole statements and the next run issues the rest. Raises BillingPeriodInvalidError for a
    period not starting on the 1st, BillingPeriodOpenError for a month that has not ended yet.
    """
    now = now or timezone.now()
    _start_at, end_at = billing_period_bounds(period_start=period_start)
    if now < end_at:
        raise BillingPeriodOpenError(
            _("The period %(month)s ends at %(end)s; it cannot be closed before.")
            % {"month": f"{period_start:%Y-%m}", "end": end_at.isoformat()},
            extra={"period_start": period_start.isoformat(), "period_end_at": end_at.isoformat()},
        )
    run, _created = BillingCloseRun.objects.get_or_create(
        period_start=period_start, defaults={"started_at": now}
    )
    if run.finished_at is not None:
        return run

    for buyer_id in billing_buyers_to_invoice(period_start=period_start):
        invoice_issue(buyer=Organisation.objects.get(pk=buyer_id), period_start=period_start, now=now)
    for operator_id in billing_operators_to_settle(period_start=period_start):
        settlement_issue(
            operator=Organisation.objects.get(pk=operator_id), period_start=period_start, now=now
        )

    run.invoices_issued = Invoice.objects.filter(period_start=period_start).count()
    run.settlements_issued = Settlement.objects.filter(period_start=period_start).count()
    run.finished_at = timezone.now()
    run.save(update_fields=["invoices_issued", "settlements_issued", "finished_at"])
    logger.info(
        "billing close %s finished: %d invoices, %d settlements",
        period_start.strftime("%Y-%m"),
        run.invoices_issued,
        run.settlements_issued,
    )
    return run


def billing_close_previous_month(*, now: datetime | None = None) -> BillingCloseRun:
    """Close the month before the one ``now`` (default: now) falls in, in the billing zone."""
    now = now or timezone.now()
    return billing_close_period(period_start=billing_previous_period_start(now=now), now=now)
