"""Crediting packs from paid orders, and the value of card-hours drawn from a pack.

A pack is bought for ``price`` CNY and holds ``card_hours``. Every draw (usage, expiry, refund) consumes
prepaid value in proportion: the value of a draw is the telescoping difference
``round(drawn_after × price / card_hours) − round(drawn_before × price / card_hours)``, so the values of
all the draws of a pack sum to its price exactly, to the micro-yuan, however it was drawn.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.money import MICROS, round_div, to_micros
from metering.errors import PackOrderNotFoundError
from metering.models import STANDARD_CLASS, BuyerExhaustion, Pack, PackOrder, TransferKind
from metering.services import ledger


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
    every class the pack can serve. Returns ``(pack, created)``.
    """
    try:
        order = (
            PackOrder.objects.select_for_update(of=("self",))
            .select_related("buyer", "accelerator")
            .get(pk=order.pk)
        )
    except PackOrder.DoesNotExist:
        raise PackOrderNotFoundError(f"Pack order {order.pk} does not exist.") from None
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

    open_flags = BuyerExhaustion.objects.filter(buyer=order.buyer, cleared_at__isnull=True)
    if pack.class_key != STANDARD_CLASS:
        open_flags = open_flags.filter(Q(pack_class=pack.class_key))
    open_flags.update(cleared_at=timezone.now())
    return pack, True
