"""Ledger upkeep: expiring packs, and reconciling the ledger against its invariants.

Signs follow metering.services.rating: balance = Σ entries; a pack holds +card-hours, issuance is −(issued
and not yet used or expired), buyer money is −(prepaid value not yet used), revenues and earnings are
negative. An expiry therefore posts pack −remaining / issuance +remaining, and buyer money +value /
breakage −value.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import (
    BigIntegerField,
    Case,
    CharField,
    Count,
    Exists,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Concat
from django.utils import timezone

from core.money import MICROS, to_micros
from metering.models import (
    AccountKind,
    BuyerExhaustion,
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    PackOrder,
    PackRefund,
    RatedSegment,
    ReconciliationRun,
    TransferKind,
    UsageKey,
    UsagePending,
    UsageRecord,
)
from metering.services import ledger
from metering.services.packs import pack_value_of_draw

ledger_logger = logging.getLogger("cardhour.ledger")
logger = logging.getLogger("cardhour.metering")

POSTED_BY = "maintenance"
# A report names at most this many offending rows per invariant (with the full count): enough to start
# an investigation without turning one systematic fault into a million-line log record.
SAMPLE_SIZE = 20


# --- Pack expiry ------------------------------------------------------------------------------------


def packs_expire_due(*, now: datetime | None = None) -> int:
    """Expire every active pack whose ``expires_at`` has passed; return how many were expired.

    Each pack in its own transaction (pack_expire): a failure on one leaves the others expired.
    Idempotent: an expired pack is not selected again, and its transfer is keyed ``pack_expiry:<id>``.
    """
    now = now or timezone.now()
    due = list(
        Pack.objects.filter(status=Pack.Status.ACTIVE, expires_at__lte=now)
        .order_by("expires_at", "pk")
        .values_list("pk", flat=True)
    )
    expired = 0
    for pack_id in due:
        if pack_expire(pack_id=pack_id, now=now):
            expired += 1
    return expired


@transaction.atomic
def pack_expire(*, pack_id: int, now: datetime | None = None) -> bool:
    """Expire one pack if it is active and past its expiry: take the remaining card-hours off it (against
    issuance) and move the unused prepaid value from the buyer's money to breakage, in one transfer
    ``pack_expiry:<pack id>``; set the status to expired. Returns whether this call expired it.

    Locks the pack and then its account, the order rating locks accounts in, so a rating batch drawing
    from the pack at the same moment either finishes first (and the remainder is smaller) or waits.
    """
    now = now or timezone.now()
    pack = (
        Pack.objects.select_for_update(of=("self",))
        .select_related("buyer", "accelerator")
        .filter(pk=pack_id, status=Pack.Status.ACTIVE, expires_at__lte=now)
        .first()
    )
    if pack is None:
        return False
    account = ledger.account_pack(pack=pack)
    remaining = LedgerAccount.objects.select_for_update().values_list("balance", flat=True).get(pk=account.pk)
    if remaining > 0:
        value = pack_value_of_draw(
            price_micros=to_micros(pack.price),
            quantity_micros=pack.card_hours * MICROS,
            balance_before=remaining,
            draw=remaining,
        )
        postings = [
            (account, -remaining),
            (ledger.account_issuance(class_key=pack.class_key), remaining),
        ]
        if value:
            postings += [
                (ledger.account_buyer_money(buyer=pack.buyer), value),
                (ledger.account_breakage(), -value),
            ]
        ledger.transfer_post(
            kind=TransferKind.PACK_EXPIRY,
            idempotency_key=f"pack_expiry:{pack.pk}",
            description=f"Pack {pack.pk} expired at {pack.expires_at.isoformat()} with {remaining} "
            f"micro-card-hours unused",
            posted_by=POSTED_BY,
            postings=postings,
            posted_at=now,
        )
    pack.status = Pack.Status.EXPIRED
    pack.closed_at = now
    pack.save(update_fields=["status", "closed_at"])
    logger.info("pack %s expired, %s micro-card-hours unused", pack.pk, remaining)
    return True


# --- Reconciliation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Breach:
    """One broken invariant: a stable ``code``, a sentence, how many rows break it and a sample of them."""

    code: str
    message: str
    count: int
    sample: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ReconciliationReport:
    ok: bool
    breaches: list[Breach] = field(default_factory=list)
    checked_at: datetime | None = None

    def codes(self) -> list[str]:
        return [breach.code for breach in self.breaches]


def _breach(code: str, message: str, rows: QuerySet[Any, Any] | list[dict[str, Any]]) -> Breach | None:
    """A breach if ``rows`` (a values() queryset or a list) is not empty, with its count and a sample."""
    if isinstance(rows, list):
        count, sample = len(rows), rows[:SAMPLE_SIZE]
    else:
        sample = list(rows[:SAMPLE_SIZE])
        if not sample:
            return None
        count = rows.count() if len(sample) == SAMPLE_SIZE else len(sample)
    if not count:
        return None
    return Breach(code=code, message=message, count=count, sample=tuple(_plain(row) for row in sample))


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """PostgreSQL sums bigints as numeric: report whole numbers as ints."""
    return {
        key: int(value) if isinstance(value, Decimal) and value == value.to_integral_value() else value
        for key, value in row.items()
    }


class _EpochSeconds(Func):
    """Whole seconds since the epoch of a datetime column, in SQL (SQLite and PostgreSQL)."""

    output_field = BigIntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        # The format is a parameter: a literal %s in the SQL would be taken for a placeholder.
        return f"CAST(strftime(%s, {sql}) AS INTEGER)", ("%s", *params)

    template = "CAST(EXTRACT(EPOCH FROM %(expressions)s) AS BIGINT)"


def _sum(expression: Any) -> Coalesce:
    return Coalesce(Sum(expression), Value(0), output_field=BigIntegerField())


def _check_units_sum_to_zero() -> Breach | None:
    rows = (
        LedgerEntry.objects.order_by()
        .values("unit")
        .annotate(total=Sum("amount"))
        .exclude(total=0)
        .order_by("unit")
    )
    return _breach("unit_not_zero", "The entries of a unit do not sum to zero over the whole ledger.", rows)


def _check_transfers_balance() -> Breach | None:
    rows = (
        LedgerEntry.objects.order_by()
        .values("transfer_id", "unit")
        .annotate(total=Sum("amount"))
        .exclude(total=0)
        .order_by("transfer_id", "unit")
    )
    return _breach("transfer_unbalanced", "A transfer's entries do not sum to zero in a unit.", rows)


def _check_entry_units() -> Breach | None:
    rows = (
        LedgerEntry.objects.exclude(unit=F("account__unit"))
        .values("id", "transfer_id", "account_id", "unit")
        .order_by("id")
    )
    return _breach("entry_unit_mismatch", "An entry's unit differs from its account's unit.", rows)


def _check_account_balances() -> Breach | None:
    entries = (
        LedgerEntry.objects.filter(account_id=OuterRef("pk"))
        .order_by()
        .values("account_id")
        .annotate(total=Sum("amount"))
        .values("total")
    )
    rows = (
        LedgerAccount.objects.annotate(
            entries_total=Coalesce(
                Subquery(entries, output_field=BigIntegerField()), Value(0), output_field=BigIntegerField()
            )
        )
        .exclude(balance=F("entries_total"))
        .values("id", "key", "balance", "entries_total")
        .order_by("id")
    )
    return _breach(
        "account_balance_mismatch", "An account's stored balance differs from the sum of its entries.", rows
    )


def _check_non_negative() -> Breach | None:
    rows = (
        LedgerAccount.objects.filter(non_negative=True, balance__lt=0)
        .values("id", "key", "balance")
        .order_by("id")
    )
    return _breach("account_negative", "A non-negative account (a pack) is below zero.", rows)


def _purchase_key(field_name: str) -> Concat:
    return Concat(Value("pack_purchase:"), Cast(field_name, CharField()), output_field=CharField())


def _check_paid_orders() -> list[Breach]:
    breaches: list[Breach | None] = []
    paid = (
        PackOrder.objects.filter(paid_at__isnull=False)
        .annotate(purchase_key=_purchase_key("pk"))
        .annotate(
            has_pack=Exists(Pack.objects.filter(order_id=OuterRef("pk"))),
            has_transfer=Exists(
                LedgerTransfer.objects.filter(
                    kind=TransferKind.PACK_PURCHASE, idempotency_key=OuterRef("purchase_key")
                )
            ),
        )
    )
    # The key is unique, so "exactly one" is "exists"; the order's one-to-one pack likewise.
    breaches.append(
        _breach(
            "paid_order_without_pack",
            "A paid order has no pack.",
            paid.filter(has_pack=False).values("id", "buyer_id", "paid_at").order_by("id"),
        )
    )
    breaches.append(
        _breach(
            "paid_order_without_purchase",
            "A paid order has no pack_purchase transfer (pack_purchase:<order id>).",
            paid.filter(has_transfer=False).values("id", "buyer_id", "paid_at").order_by("id"),
        )
    )
    unpaid_with_pack = PackOrder.objects.filter(paid_at__isnull=True).filter(
        Exists(Pack.objects.filter(order_id=OuterRef("pk")))
    )
    breaches.append(
        _breach(
            "pack_without_payment",
            "A pack was credited for an order that is not paid.",
            unpaid_with_pack.values("id", "buyer_id", "status").order_by("id"),
        )
    )
    orphan = LedgerTransfer.objects.filter(kind=TransferKind.PACK_PURCHASE).exclude(
        Exists(
            PackOrder.objects.filter(paid_at__isnull=False)
            .annotate(purchase_key=_purchase_key("pk"))
            .filter(purchase_key=OuterRef("idempotency_key"))
        )
    )
    breaches.append(
        _breach(
            "purchase_without_paid_order",
            "A pack_purchase transfer matches no paid order.",
            orphan.values("id", "idempotency_key").order_by("id"),
        )
    )
    return [b for b in breaches if b is not None]


def _per_key(rows: Iterable[tuple[Any, Any]]) -> dict[int, int]:
    return {key: int(total) for key, total in rows if key is not None}


def _check_pack_balances() -> Breach | None:
    """balance = card-hours bought − draws of its rated segments − refunds − expiry (and any other
    posting that is neither purchase nor usage nor refund, e.g. an arrears settlement).

    Each source is summed once, grouped by pack, in SQL (segments carry no pack index: one scan, not one
    probe per pack), and the per-pack totals are compared here, one row per pack."""
    draws = _per_key(
        RatedSegment.objects.filter(pack__isnull=False)
        .order_by()
        .values("pack_id")
        .annotate(t=Sum("pack_draw"))
        .values_list("pack_id", "t")
    )
    refunds = _per_key(
        PackRefund.objects.order_by()
        .values("pack_id")
        .annotate(t=Sum("card_hours_debited"))
        .values_list("pack_id", "t")
    )
    other = _per_key(
        LedgerEntry.objects.filter(account__kind=AccountKind.PACK)
        .exclude(
            transfer__kind__in=[TransferKind.PACK_PURCHASE, TransferKind.USAGE, TransferKind.PACK_REFUND]
        )
        .order_by()
        .values("account__pack_id")
        .annotate(t=Sum("amount"))
        .values_list("account__pack_id", "t")
    )
    mismatched: list[dict[str, Any]] = []
    accounts = (
        LedgerAccount.objects.filter(kind=AccountKind.PACK)
        .order_by("id")
        .values_list("id", "pack_id", "balance", "pack__card_hours")
        .iterator(chunk_size=10_000)
    )
    for account_id, pack_id, balance, card_hours in accounts:
        bought = card_hours * MICROS
        expected = bought - draws.get(pack_id, 0) - refunds.get(pack_id, 0) + other.get(pack_id, 0)
        if balance != expected:
            mismatched.append(
                {
                    "id": account_id,
                    "pack_id": pack_id,
                    "balance": balance,
                    "bought": bought,
                    "drawn": draws.get(pack_id, 0),
                    "refunded": refunds.get(pack_id, 0),
                    "other": other.get(pack_id, 0),
                    "expected": expected,
                }
            )
    return _breach(
        "pack_balance_mismatch",
        "A pack's balance differs from card-hours bought − rated draws − refunds − expiry.",
        mismatched,
    )


# What a usage transfer posts to each kind of account, from the segments it explains (rating's signs).
_USAGE_FLOWS: dict[str, tuple[Any, str]] = {
    # name: (segment expression, account kind)
    "pack": (-Case(When(pack__isnull=False, then=F("pack_draw")), default=Value(0)), AccountKind.PACK),
    "arrears": (-Case(When(pack__isnull=True, then=F("pack_draw")), default=Value(0)), AccountKind.ARREARS),
    "issuance": (F("pack_draw"), AccountKind.CARD_HOUR_ISSUANCE),
    "buyer_money": (F("buyer_value"), AccountKind.BUYER_MONEY),
    "operator_earnings": (F("commission") - F("gross"), AccountKind.OPERATOR_EARNINGS),
    "platform_commission": (-F("commission"), AccountKind.PLATFORM_COMMISSION),
    "platform_spread": (F("gross") - F("buyer_value"), AccountKind.PLATFORM_SPREAD),
}


def _check_usage_transfers() -> list[Breach]:
    """Each usage transfer posts exactly what its rated segments say, per kind of account; each rated
    record has segments on the transfer that rated it."""
    names = list(_USAGE_FLOWS)
    from_segments: dict[int, dict[str, int]] = {
        row["transfer_id"]: {name: int(row[f"flow_{name}"]) for name in names}
        for row in cast(
            Iterable[dict[str, Any]],
            RatedSegment.objects.order_by()
            .values("transfer_id")
            .annotate(**{f"flow_{name}": _sum(expr) for name, (expr, _kind) in _USAGE_FLOWS.items()}),
        )
    }
    from_entries: dict[int, dict[str, int]] = {
        row["transfer_id"]: {name: int(row[f"flow_{name}"]) for name in names}
        for row in cast(
            Iterable[dict[str, Any]],
            LedgerEntry.objects.filter(transfer__kind=TransferKind.USAGE)
            .order_by()
            .values("transfer_id")
            .annotate(
                **{
                    f"flow_{name}": _sum(
                        Case(
                            When(account__kind=kind, then=F("amount")),
                            default=Value(0),
                            output_field=IntegerField(),
                        )
                    )
                    for name, (_expr, kind) in _USAGE_FLOWS.items()
                }
            ),
        )
    }
    zero = dict.fromkeys(_USAGE_FLOWS, 0)
    mismatched: list[dict[str, Any]] = []
    for transfer_id in sorted(from_segments.keys() | from_entries.keys()):
        segments = from_segments.get(transfer_id, zero)
        entries = from_entries.get(transfer_id, zero)
        if segments != entries:
            diff = {
                k: {"segments": segments[k], "entries": entries[k]}
                for k in segments
                if segments[k] != entries[k]
            }
            mismatched.append({"transfer_id": transfer_id, "differences": diff})
    breaches = [
        _breach(
            "usage_transfer_mismatch",
            "A usage transfer's postings differ from the sums of the rated segments it explains.",
            mismatched,
        ),
        _breach(
            "segment_transfer_mismatch",
            "A usage record's segments are on more than one transfer (it was rated more than once).",
            RatedSegment.objects.order_by()
            .values("usage_record_id")
            .annotate(transfers=Count("transfer_id", distinct=True))
            .filter(transfers__gt=1)
            .values("usage_record_id", "transfers"),
        ),
        _breach(
            "rated_record_without_segments",
            "A usage record is no longer pending rating but has no rated segments.",
            UsageRecord.objects.rated()
            .filter(~Exists(RatedSegment.objects.filter(usage_record_id=OuterRef("pk"))))
            .values("id")
            .order_by("id"),
        ),
        _breach(
            "segment_dangling_reference",
            # What the segments' dropped foreign keys guarded (they cost a parent lookup and lock per row
            # written): each segment's record, transfer (a usage one) and pack exist, the pack is the
            # segment's buyer's, and the segment's buyer and operator are its record's.
            "A rated segment's usage record, usage transfer or pack is missing, or its buyer, operator or "
            "pack is not its record's.",
            _dangling_segments(),
        ),
        _breach(
            "pending_record_mismatch",
            "A usage record's pending-rating row differs from the record, or the record already has "
            "segments (it would be rated twice).",
            _pending_mismatches(),
        ),
        # What the usage table's unique key and the foreign keys to it guarded before it was partitioned:
        # every record has its key row (same operator, key and start — the start locates the partition),
        # every key row and exhaustion flag points at an existing record.
        _breach(
            "usage_key_missing",
            "A usage record has no idempotency-key row, or one with another operator, key or start.",
            _unkeyed_records(),
        ),
        _breach(
            "usage_key_dangling",
            "An idempotency-key row points at no usage record (or at one with another start).",
            _dangling_keys(),
        ),
        _breach(
            "exhaustion_dangling_record",
            "An exhaustion flag points at no usage record.",
            BuyerExhaustion.objects.filter(usage_record_id__isnull=False)
            .filter(~Exists(UsageRecord.objects.filter(pk=OuterRef("usage_record_id"))))
            .values("id", "usage_record_id")
            .order_by("id"),
        ),
        _breach(
            "record_card_seconds_mismatch",
            "A rated record's segments do not add up to its cards × seconds.",
            _card_seconds_mismatches(),
        ),
    ]
    return [b for b in breaches if b is not None]


def _dangling_segments() -> QuerySet[Any, Any]:
    record = UsageRecord.objects.filter(
        pk=OuterRef("usage_record_id"),
        start_at=OuterRef("record_start_at"),  # the record's partition, and its start copied right
        buyer_id=OuterRef("buyer_id"),
        operator_id=OuterRef("operator_id"),
    )
    return (
        RatedSegment.objects.filter(
            ~Exists(record)
            | ~Exists(LedgerTransfer.objects.filter(pk=OuterRef("transfer_id"), kind=TransferKind.USAGE))
            | (
                Q(pack_id__isnull=False)
                & ~Exists(Pack.objects.filter(pk=OuterRef("pack_id"), buyer_id=OuterRef("buyer_id")))
            )
        )
        .values("id", "usage_record_id", "transfer_id", "pack_id")
        .order_by("id")
    )


def _unkeyed_records() -> QuerySet[Any, Any]:
    keyed = UsageKey.objects.filter(
        usage_record_id=OuterRef("pk"),
        operator_id=OuterRef("operator_id"),
        idempotency_key=OuterRef("idempotency_key"),
        start_at=OuterRef("start_at"),
    )
    return UsageRecord.objects.filter(~Exists(keyed)).values("id").order_by("id")


def _dangling_keys() -> QuerySet[Any, Any]:
    record = UsageRecord.objects.filter(pk=OuterRef("usage_record_id"), start_at=OuterRef("start_at"))
    return UsageKey.objects.filter(~Exists(record)).values("usage_record_id").order_by("usage_record_id")


def _pending_mismatches() -> QuerySet[Any, Any]:
    record = UsageRecord.objects.filter(
        pk=OuterRef("usage_record_id"),
        operator_id=OuterRef("operator_id"),
        cluster_id=OuterRef("cluster_id"),
        buyer_id=OuterRef("buyer_id"),
        price_card_id=OuterRef("price_card_id"),
        cards=OuterRef("cards"),
        start_at=OuterRef("start_at"),
        end_at=OuterRef("end_at"),
    )
    return (
        UsagePending.objects.filter(
            ~Exists(record) | Exists(RatedSegment.objects.filter(usage_record_id=OuterRef("usage_record_id")))
        )
        .values("usage_record_id")
        .order_by("usage_record_id")
    )


def _card_seconds_mismatches() -> QuerySet[Any, Any]:
    """Rated records whose segments' card-seconds differ from cards × (end − start), in SQL.

    The segments' sum is a correlated subquery on (record, record start), not a join grouped by the record:
    on PostgreSQL the record's primary key is (id, start_at) (partitioned), so grouping by ``id`` alone
    would not cover its other columns, and the start prunes the segments to the record's month."""
    seconds = (
        RatedSegment.objects.filter(usage_record_id=OuterRef("pk"), record_start_at=OuterRef("start_at"))
        .order_by()
        .values("usage_record_id")
        .annotate(total=Sum("card_seconds"))
        .values("total")
    )
    return (
        UsageRecord.objects.rated()
        .annotate(
            segment_seconds=Coalesce(Subquery(seconds), Value(0), output_field=BigIntegerField()),
            expected=Cast("cards", BigIntegerField()) * (_EpochSeconds("end_at") - _EpochSeconds("start_at")),
        )
        .filter(segment_seconds__gt=0)
        .exclude(segment_seconds=F("expected"))
        .values("id", "cards", "expected", "segment_seconds")
        .order_by("id")
    )


def ledger_reconcile() -> ReconciliationReport:
    """Check the ledger's invariants with set-based aggregates; log every breach at ERROR on
    ``cardhour.ledger`` (the alert) and return the report (``ok`` False on any breach).

    Invariants: each unit sums to zero over all entries; each transfer balances per unit; each entry's unit
    is its account's; each stored balance equals the sum of the account's entries; no non-negative
    account is below zero; every paid order has exactly one pack and one ``pack_purchase:<order id>``
    transfer, and every purchase transfer has its paid order; every pack's balance equals card-hours bought
    − rated draws − refunds − expiry; every usage transfer posts what its rated segments say, each record's
    segments are on one transfer, every record no longer pending rating has segments adding up to its
    card-seconds; every segment's record, usage transfer and pack exist and agree on buyer and operator
    (what the segments' foreign keys used to guard); every pending-rating row matches its record and has no
    segments yet. Reads only, then records the outcome as a ReconciliationRun; takes no locks (a posting commits its entries and balances together, so a
    consistent snapshot — one statement each — sees either all of a transfer or none of it).
    """
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql" and outermost:
            # One snapshot for every check: a rating batch committing between two checks must not look
            # like a breach (segments read before it, entries after).
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        breaches = _run_checks()
    for breach in breaches:
        ledger_logger.error(
            "ledger breach %s: %s (%d rows; sample %s)",
            breach.code,
            breach.message,
            breach.count,
            list(breach.sample),
        )
    checked_at = timezone.now()
    report = ReconciliationReport(ok=not breaches, breaches=breaches, checked_at=checked_at)
    # Kept for the staff dashboard (outside the read-only snapshot above).
    ReconciliationRun.objects.create(
        checked_at=checked_at,
        ok=report.ok,
        breaches=[{"code": b.code, "message": b.message, "count": b.count} for b in breaches],
    )
    if report.ok:
        ledger_logger.info("ledger reconciled: no breach")
    return report


def _run_checks() -> list[Breach]:
    breaches: list[Breach] = []
    for check in (
        _check_units_sum_to_zero,
        _check_transfers_balance,
        _check_entry_units,
        _check_account_balances,
        _check_non_negative,
        _check_pack_balances,
    ):
        found = check()
        if found is not None:
            breaches.append(found)
    breaches += _check_paid_orders()
    breaches += _check_usage_transfers()
    return breaches
