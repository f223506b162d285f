"""Reads for the pack catalogue, a buyer's orders and packs, and its balances per class.

A pack's remaining card-hours live in its ledger account (micro-card-hours, never negative); the pack
row holds only what was credited. Every buyer-scoped read filters by the buyer, so another buyer's
order answers "not found", exactly like a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connections, router
from django.db.models import Count, Min, QuerySet, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _

from core.db import bound_cursor
from core.models import Organisation
from core.money import from_micros
from federation.models import Accelerator
from metering.errors import PackOrderNotFoundError, UnknownPackProductError
from metering.integrations import stripe as gateway
from metering.models import LedgerAccount, Pack, PackOrder, PackProduct, pack_class_key


def pack_product_list(*, include_inactive: bool = False) -> QuerySet[PackProduct]:
    """The catalogue in display order; only products on sale unless ``include_inactive``."""
    products = PackProduct.objects.select_related("accelerator").order_by("sort_order", "code")
    return products if include_inactive else products.filter(active=True)


def pack_product_get_on_sale(*, code: str) -> PackProduct:
    """A product on sale by its code. Raises UnknownPackProductError (400: it is named in a body)."""
    product = pack_product_list().filter(code=code).first()
    if product is None:
        raise UnknownPackProductError(
            _("No pack product %(code)r is on sale.") % {"code": code}, extra={"product": code}
        )
    return product


def pack_order_list_for(*, buyer: Organisation) -> QuerySet[PackOrder]:
    """The buyer's orders, newest first, with product, chip and pack joined."""
    return (
        PackOrder.objects.filter(buyer=buyer)
        .select_related("product", "accelerator", "pack")
        .order_by("-created_at", "-id")
    )


def _pack_order_missing(order_id: object) -> str:
    return _("Pack order %(order)s does not exist.") % {"order": order_id}


def pack_order_get_for(*, buyer: Organisation, order_id: int) -> PackOrder:
    """One of the buyer's orders. Raises PackOrderNotFoundError, for another buyer's order too."""
    order = pack_order_list_for(buyer=buyer).filter(pk=order_id).first()
    if order is None:
        raise PackOrderNotFoundError(_pack_order_missing(order_id), extra={"order": order_id})
    return order


def pack_order_payment_intent(*, order: PackOrder) -> gateway.PaymentIntentInfo | None:
    """The order's PaymentIntent as Stripe reports it now (status, client secret, the last decline), or
    None when the order never got one (Stripe was down when it was created). What a checkout page shows
    after a reload. Raises PaymentProviderError."""
    if not order.stripe_payment_intent_id:
        return None
    return gateway.payment_intent_retrieve(payment_intent_id=order.stripe_payment_intent_id)


def pack_list_for(*, buyer: Organisation, status: str | None = None) -> QuerySet[Pack]:
    """The buyer's packs in the order consumption draws them (earliest expiry first), each annotated
    with ``remaining_micros`` (micro-card-hours left, from its ledger account)."""
    packs = Pack.objects.filter(buyer=buyer)
    if status:
        packs = packs.filter(status=status)
    return (
        packs.select_related("accelerator", "order")
        .annotate(remaining_micros=Coalesce("account__balance", Value(0)))
        .order_by("expires_at", "id")
    )


def pack_balances_usable(
    *, buyer_id: int, at: datetime
) -> list[tuple[int, str, datetime, datetime, int, Decimal, int]]:
    """The buyer's active packs not expired at ``at``, in the order consumption draws them (earliest
    expiry first): ``(pack id, class key, starts_at, expires_at, micro-card-hours left, price, card_hours)``.

    ``pack_list_for``'s rows, narrowed to what a draw plan reads: every quote asks, and building the ORM
    query (two joins, an annotation, whole rows) cost more CPU than running it; on PostgreSQL the statement
    is fixed text with the values bound, the ORM elsewhere. Same rows, same order."""
    connection = connections[router.db_for_read(Pack)]
    if connection.vendor != "postgresql":
        return [
            (pk, pack_class_key(slug), starts_at, expires_at, int(left), price, card_hours)
            for pk, slug, starts_at, expires_at, left, price, card_hours in Pack.objects.filter(
                buyer_id=buyer_id, status=Pack.Status.ACTIVE, expires_at__gt=at
            )
            .annotate(left=Coalesce("account__balance", Value(0)))
            .order_by("expires_at", "id")
            .values_list("pk", "accelerator__slug", "starts_at", "expires_at", "left", "price", "card_hours")
        ]
    # Bound by PostgreSQL and, in production, prepared once per connection (core.db): planning the three-table
    # join cost PostgreSQL several times what running it does, on every quote.
    with bound_cursor(router.db_for_read(Pack)) as cursor:
        cursor.execute(
            PACK_BALANCES_SELECT + " ORDER BY p.expires_at, p.id", pack_balances_params(buyer_id, at)
        )
        return pack_balances_rows(cursor.fetchall())


# The statement's rows as pack_balances_usable returns them, and its text without the order, so that a caller
# can fetch more in the same round trip (broker.selectors.pack_balances_and_pending): seven columns, the
# parameters of pack_balances_params.
PACK_BALANCES_SELECT = (
    "SELECT p.id, a.slug, p.starts_at, p.expires_at, COALESCE(l.balance, 0), p.price, p.card_hours "  # noqa: S608
    f"FROM {Pack._meta.db_table} p "
    f"LEFT JOIN {Accelerator._meta.db_table} a ON a.id = p.accelerator_id "
    f"LEFT JOIN {LedgerAccount._meta.db_table} l ON l.pack_id = p.id "
    "WHERE p.buyer_id = %s AND p.status = %s AND p.expires_at > %s"
)


def pack_balances_params(buyer_id: int, at: datetime) -> list[int | str | datetime]:
    return [buyer_id, Pack.Status.ACTIVE.value, at]


def pack_balances_rows(rows: list[tuple]) -> list[tuple[int, str, datetime, datetime, int, Decimal, int]]:
    """PACK_BALANCES_SELECT's rows as pack_balances_usable returns them (the class key for the slug)."""
    return [
        (pk, pack_class_key(slug), starts_at, expires_at, int(left), price, card_hours)
        for pk, slug, starts_at, expires_at, left, price, card_hours in rows
    ]


@dataclass(frozen=True)
class PackClassBalance:
    """What a buyer can still use of one class: card-hours left in its usable packs."""

    class_key: str  # "std" or an accelerator slug
    accelerator: str | None
    remaining_card_hours: Decimal
    packs: int
    next_expiry_at: datetime | None


def buyer_balance_summary(*, buyer: Organisation, at: datetime | None = None) -> list[PackClassBalance]:
    """Card-hours left per class in the buyer's active packs that have started and not expired at
    ``at`` (now by default), standard cards first, then by chip."""
    at = at or timezone.now()
    rows = (
        Pack.objects.filter(buyer=buyer, status=Pack.Status.ACTIVE, starts_at__lte=at, expires_at__gt=at)
        .values("accelerator__slug")
        .annotate(
            remaining=Coalesce(Sum("account__balance"), Value(0)),
            packs=Count("id"),
            next_expiry_at=Min("expires_at"),
        )
        .order_by("accelerator__slug")
    )
    balances = [
        PackClassBalance(
            class_key=pack_class_key(row["accelerator__slug"]),
            accelerator=row["accelerator__slug"],
            remaining_card_hours=from_micros(int(row["remaining"])),
            packs=row["packs"],
            next_expiry_at=row["next_expiry_at"],
        )
        for row in rows
    ]
    return sorted(balances, key=lambda b: (b.accelerator is not None, b.accelerator or ""))
