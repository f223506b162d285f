"""Crediting packs from paid orders, settling arrears from them, and the value of card-hours drawn.

A pack is bought for ``price`` CNY and holds ``card_hours``. Every draw (usage, expiry, refund, arrears)
consumes prepaid value in proportion: the value of a draw is the telescoping difference
``round(drawn_after × price / card_hours) − round(drawn_before × price / card_hours)``, so the values of
all the draws of a pack sum to its price exactly, to the micro-yuan, however it was drawn.

**Arrears first.** Card-hours a buyer used with no pack are *arrears*: an ARREARS account per chip class
(negative: card-hours owed) and, in buyer money, the operator's price of them (money owed). A newly
credited pack pays them in the same transaction that credits it, so none of it is usable before they are
settled: a chip pack pays the arrears of its chip, a standard pack those of any chip with a standard-card
factor, at that factor (``std card-hours = chip card-hours × factor``, the factor in force at settlement).
One ``arrears_settlement:<order>:<class>`` transfer per class draws the pack (against issuance of its
class), clears the arrears (against issuance of the chip) and the money owed — in proportion when the pack
is smaller than the arrears — and books the prepaid value used against the money cleared, the difference
to the platform's spread as rating does. Each also makes one ArrearsSettlement row (unique per order and
class) that the month's invoice states. A replayed webhook finds the pack made and settles nothing again.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from core.models import Organisation
from core.money import MICROS, round_div, to_micros
from federation.models import Accelerator
from federation.selectors import standard_card_current, standard_card_factor
from metering.errors import PackOrderNotFoundError
from metering.models import (
    STANDARD_CLASS,
    AccountKind,
    ArrearsSettlement,
    BuyerExhaustion,
    LedgerAccount,
    Pack,
    PackOrder,
    RatedSegment,
    TransferKind,
)
from metering.services import ledger

_FACTOR_E4 = 10**4


def pack_value_of_draw(*, price_micros: int, quantity_micros: int, balance_before: int, draw: int) -> int:
    """Micro-yuan of prepaid value consumed by drawing ``draw`` micro-card-hours from a pack holding
    ``balance_before`` of its ``quantity_micros`` (bought for ``price_micros``)."""
    drawn_before = quantity_micros - balance_before
    drawn_after = drawn_before + draw
    return round_div(drawn_after * price_micros, quantity_micros) - round_div(
        drawn_before * price_micros, quantity_micros
    )


@transaction.atomic
def pack_issue(
    *, order: PackOrder, paid_at: datetime, posted_by: str, payment_reference: str = ""
) -> tuple[Pack, bool]:
    """Credit the pack of a paid order, exactly once.

    Locks the order; a second call (a replayed webhook) returns the pack it already made and posts
    nothing. Posts the purchase: the pack gains its card-hours (against issuance of the class), Stripe
    clearing gains the money (against the buyer's prepaid money). Clears the buyer's exhaustion flag for
    every class the pack can serve, unless settling arrears used it all (see the module docstring: the
    buyer's arrears are settled from the pack first, in this transaction). Returns ``(pack, created)``.
    """
    try:
        order = (
            PackOrder.objects.select_for_update(of=("self",))
            .select_related("buyer", "accelerator")
            .get(pk=order.pk)
        )
    except PackOrder.DoesNotExist:
        raise PackOrderNotFoundError(
            _("Pack order %(order)s does not exist.") % {"order": order.pk}
        ) from None
    existing = Pack.objects.filter(order=order).first()
    if existing is not None:
        return existing, False

    pack = Pack.objects.create(
        buyer=order.buyer,
        order=order,
        accelerator=order.accelerator,
        card_hours=order.card_hours,
        price=order.amount,
        starts_at=paid_at,
        expires_at=paid_at + timedelta(days=order.validity_days),
    )
    order.status = PackOrder.Status.PAID
    order.paid_at = paid_at
    order.failure_code = ""
    order.failure_message = ""
    order.save(update_fields=["status", "paid_at", "failure_code", "failure_message"])

    quantity = order.card_hours * MICROS
    price = to_micros(order.amount)
    arrears = _arrears_accounts_lock(buyer=order.buyer, pack=pack)
    ledger.transfer_post(
        kind=TransferKind.PACK_PURCHASE,
        idempotency_key=f"pack_purchase:{order.pk}",
        description=f"Pack {pack.pk} for order {order.pk}"
        + (f" (payment {payment_reference})" if payment_reference else ""),
        posted_by=posted_by,
        postings=[
            (ledger.account_pack(pack=pack), quantity),
            (ledger.account_issuance(class_key=pack.class_key), -quantity),
            (ledger.account_stripe_clearing(), price),
            (ledger.account_buyer_money(buyer=order.buyer), -price),
        ],
        posted_at=paid_at,
    )
    remaining = _arrears_settle(pack=pack, order=order, arrears=arrears, now=paid_at, posted_by=posted_by)
    if remaining == 0:
        # Settling arrears took the whole pack: nothing is usable, so the buyer stays flagged.
        Pack.objects.filter(pk=pack.pk).update(status=Pack.Status.EXHAUSTED, closed_at=timezone.now())
        pack.refresh_from_db(fields=["status", "closed_at"])
        return pack, True

    open_flags = BuyerExhaustion.objects.filter(buyer=order.buyer, cleared_at__isnull=True)
    if pack.class_key != STANDARD_CLASS:
        open_flags = open_flags.filter(Q(pack_class=pack.class_key))
    open_flags.update(cleared_at=timezone.now())
    return pack, True


# --- Arrears ----------------------------------------------------------------------------------------


def _arrears_accounts_lock(*, buyer: Organisation, pack: Pack) -> list[LedgerAccount]:
    """Lock, in id order and in one statement, every account the purchase and the arrears settlements of
    ``pack`` touch, and return the buyer's arrears accounts in arrears (balance < 0) that the pack can pay.

    One ordered lock up front — not account by account as each posting comes — is what rating does too
    (transfer_post locks a batch's accounts in id order), so a webhook and a rating batch of the same
    buyer queue behind each other instead of deadlocking."""
    candidates = LedgerAccount.objects.filter(kind=AccountKind.ARREARS, organisation=buyer, balance__lt=0)
    if pack.class_key != STANDARD_CLASS:
        candidates = candidates.filter(key=f"arrears:{buyer.pk}:{pack.class_key}")
    classes = [key.rsplit(":", 1)[1] for key in candidates.values_list("key", flat=True)]
    touched = [
        ledger.account_pack(pack=pack),
        ledger.account_issuance(class_key=pack.class_key),
        ledger.account_stripe_clearing(),
        ledger.account_buyer_money(buyer=buyer),
    ]
    if classes:
        touched.append(ledger.account_platform_spread())
        for class_key in classes:
            touched.append(ledger.account_issuance(class_key=class_key))
            touched.append(ledger.account_arrears(buyer=buyer, class_key=class_key))
    locked = list(
        LedgerAccount.objects.select_for_update().filter(pk__in={a.pk for a in touched}).order_by("pk")
    )
    return sorted(
        (a for a in locked if a.kind == AccountKind.ARREARS and a.balance < 0),
        key=lambda a: a.key,
    )


def _money_owed(*, buyer: Organisation, class_key: str) -> int:
    """Micro-yuan still owed for the buyer's arrears of one class: the operator's price (gross) of every
    segment rated with no pack, less what earlier settlements cleared."""
    rated = RatedSegment.objects.filter(
        usage_record__buyer=buyer, pack__isnull=True, pack_class=class_key
    ).aggregate(total=Sum("gross"))["total"]
    cleared = ArrearsSettlement.objects.filter(buyer=buyer, arrears_class=class_key).aggregate(
        total=Sum("money_cleared")
    )["total"]
    return int(rated or 0) - int(cleared or 0)


def _standard_factor_e4(*, class_key: str, at: datetime) -> int | None:
    """The chip's standard-card factor at ``at`` in 10⁻⁴ (None for a chip with no published figure)."""
    chip = Accelerator.objects.filter(slug=class_key).first()
    if chip is None:
        return None
    factor = standard_card_factor(tflops=chip.dense_fp16_tflops, standard=standard_card_current(at=at))
    return int(factor * _FACTOR_E4) if factor else None


def _arrears_settle(
    *, pack: Pack, order: PackOrder, arrears: list[LedgerAccount], now: datetime, posted_by: str
) -> int:
    """Pay ``arrears`` (locked, in arrears) from the just-credited ``pack``; return the pack's balance left
    (micro-card-hours). Called only by pack_issue, inside its transaction, with the accounts locked."""
    quantity = pack.card_hours * MICROS
    price = to_micros(pack.price)
    balance = quantity
    for account in arrears:
        if balance <= 0:
            break
        class_key = account.key.rsplit(":", 1)[1]
        owed = -account.balance
        factor_e4 = None if pack.class_key == class_key else _standard_factor_e4(class_key=class_key, at=now)
        if pack.class_key != class_key and factor_e4 is None:
            continue  # a standard pack cannot pay a chip without a standard-card factor
        per = factor_e4 or _FACTOR_E4
        needed = round_div(owed * per, _FACTOR_E4)
        if needed <= balance:
            cleared, draw = owed, needed
        else:
            # The pack is smaller than the arrears: it pays the chip card-hours it covers in full.
            cleared = balance * _FACTOR_E4 // per
            draw = round_div(cleared * per, _FACTOR_E4)
        if cleared <= 0 or draw <= 0:
            continue
        money_owed = max(_money_owed(buyer=pack.buyer, class_key=class_key), 0)
        money = money_owed if cleared == owed else round_div(money_owed * cleared, owed)
        value = pack_value_of_draw(
            price_micros=price, quantity_micros=quantity, balance_before=balance, draw=draw
        )
        transfer, created = ledger.transfer_post(
            kind=TransferKind.ARREARS_SETTLEMENT,
            idempotency_key=f"arrears_settlement:{order.pk}:{class_key}",
            description=(
                f"Arrears of {cleared / MICROS:.6f} {class_key} card-hours settled from pack {pack.pk} "
                f"(order {order.pk})"
            ),
            posted_by=posted_by,
            postings=[
                (ledger.account_pack(pack=pack), -draw),
                (ledger.account_issuance(class_key=pack.class_key), draw),
                (account, cleared),
                (ledger.account_issuance(class_key=class_key), -cleared),
                (ledger.account_buyer_money(buyer=pack.buyer), value - money),
                (ledger.account_platform_spread(), money - value),
            ],
            posted_at=now,
        )
        if not created:  # pack_issue runs once per order; a second key would be a bug, not a replay
            continue
        ArrearsSettlement.objects.create(
            buyer=pack.buyer,
            order=order,
            pack=pack,
            arrears_class=class_key,
            arrears_card_hours=cleared,
            pack_draw=draw,
            factor=None if factor_e4 is None else Decimal(factor_e4).scaleb(-4),
            prepaid_value=value,
            money_cleared=money,
            transfer=transfer,
            settled_at=now,
        )
        balance -= draw
    return balance
