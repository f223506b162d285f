"""Buying card-hour packs through Stripe: billing profiles, pack orders, the webhook, refunds.

A pack is credited only when Stripe's webhook says its PaymentIntent succeeded — never on the browser's
redirect — and exactly once: ``pack_issue`` locks the order and makes one pack per order, its ledger
posting has an idempotency key per order, and an order has one PaymentIntent (unique in the database).
So every Stripe payment is matched by exactly one credit, however often and in whatever order Stripe
delivers its events. The transaction that credits the pack also settles the buyer's arrears from it,
before any of it is usable (``arrears_settlement`` transfers, metering.services.packs); a replayed event
finds the pack made and settles nothing twice.

Webhook events are stored by their id *before* they are handled (received → processed / ignored /
failed with the error). A replay of a processed event returns the stored row and changes nothing; a
failed one is handled again (Stripe retries after our 500).

Event ordering rule. Stripe does not deliver events in order, so the handlers never move an order
backwards on an event's say-so:

* ``payment_intent.succeeded`` is terminal in Stripe (a succeeded PaymentIntent never changes status),
  so its snapshot is trusted as it is: the pack is issued, whatever the order's status (a ``failed`` or
  ``canceled`` order becomes ``paid``: the buyer retried with another card, and Stripe's word wins).
* ``payment_intent.payment_failed`` and ``payment_intent.canceled`` describe a state that may already
  be stale (the buyer retried and paid). A paid order ignores them. Otherwise the handler re-fetches the
  PaymentIntent from Stripe and applies its *current* state: succeeded → issue the pack (the success
  event may be late or lost), requires_payment_method with an error → failed with Stripe's code and
  message, canceled → canceled, anything in between → unchanged.
* ``charge.refunded`` (and ``refund.created`` / ``refund.updated``) re-lists the PaymentIntent's refunds
  from Stripe and records each succeeded one once (``PackRefund`` is unique per Stripe refund); a refund
  that overtakes the payment's own success event first credits the pack from the re-fetched
  PaymentIntent.
* Everything else (``payment_intent.created``, ``customer.created``...) is stored as ignored.

Refund valuation: a refund debits the pack's unused card-hours — at most what is left — and Stripe
clearing by the refunded money. The card-hours taken are the ones the refund was requested for
(metadata written by ``pack_refund_request``); for a refund made in Stripe's dashboard, everything left
if it completes the refund of the whole payment, else what the money buys back at the pack's own price.
Those card-hours release their prepaid value from the buyer's money account (the telescoping value of
``pack_value_of_draw``, so a pack's values sum to its price); refunded money above that value (a
goodwill refund) or below it (fen rounding) goes to breakage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import F, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from core.errors import InvalidInputError
from core.models import Organisation
from core.money import MICROS, micros_to_fen, round_div, to_micros
from core.types import Actor
from metering.errors import (
    LiveModeTestPaymentError,
    NotABuyerError,
    PackNotRefundableError,
    PackOrderConflictError,
    StripeEventFailedError,
    StripePaymentMismatchError,
    UnknownPackProductError,
)
from metering.integrations import stripe as gateway
from metering.models import (
    BillingProfile,
    LedgerAccount,
    Pack,
    PackOrder,
    PackProduct,
    PackRefund,
    StripeEvent,
    TransferKind,
)
from metering.services import ledger
from metering.services.packs import pack_issue, pack_value_of_draw

logger = logging.getLogger(__name__)

MAX_ORDER_QUANTITY = 100
# Metadata keys on Stripe objects. Stripe limits keys to 40 characters.
META_ORDER_ID = "cardhour_order_id"
META_BUYER = "cardhour_buyer"
META_PRODUCT = "cardhour_product"
META_PACK_ID = "cardhour_pack_id"
META_REFUND_CARD_HOURS = "cardhour_card_hours_micros"
META_REQUESTED_BY = "cardhour_requested_by"

_MAX_CARD_HOURS = 2_147_483_647  # PackOrder.card_hours is a PositiveIntegerField
_MAX_AMOUNT = Decimal("999999999999.99")  # PackOrder.amount: 14 digits, 2 places

_UNPAID = (PackOrder.Status.PENDING, PackOrder.Status.FAILED, PackOrder.Status.CANCELED)


def payment_public_config() -> gateway.StripePublicConfig:
    """What the browser needs to pay (publishable key, Stripe.js URL) and the mode to show."""
    return gateway.stripe_public_config()


# --- Billing profiles -------------------------------------------------------------------------------


@transaction.atomic
def billing_profile_get_or_create(*, buyer: Organisation) -> BillingProfile:
    """The buyer's billing profile, created (CNY, named after the organisation) on first use.

    Raises NotABuyerError for an organisation that is not a buyer.
    """
    _require_buyer(buyer)
    profile, _created = BillingProfile.objects.get_or_create(
        organisation=buyer, defaults={"legal_name": buyer.name}
    )
    return profile


def billing_profile_stripe_customer(*, profile: BillingProfile) -> str:
    """The profile's Stripe customer id, creating the customer in Stripe on first use.

    Not atomic around the Stripe call (no row lock is held across the network); two racing callers
    may both ask Stripe, and the first id stored wins. Raises PaymentProviderError.
    """
    if profile.stripe_customer_id:
        return profile.stripe_customer_id
    organisation = profile.organisation
    customer_id = gateway.customer_create(
        name=profile.legal_name or organisation.name,
        email=profile.billing_email,
        metadata={"cardhour_organisation": organisation.slug},
        # The creation time makes the key unique per installation: a reset database reuses pks.
        idempotency_key=f"cardhour:customer:{organisation.pk}:{int(organisation.created_at.timestamp())}",
    )
    BillingProfile.objects.filter(pk=profile.pk, stripe_customer_id="").update(stripe_customer_id=customer_id)
    profile.refresh_from_db(fields=["stripe_customer_id"])
    return profile.stripe_customer_id


# --- Orders -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackOrderPayment:
    """An order and what the browser needs to pay it: the PaymentIntent's client secret."""

    order: PackOrder
    client_secret: str
    payment_intent_status: str
    created: bool


def pack_order_create(
    *, buyer: Organisation, product: PackProduct, quantity: int, idempotency_key: str, actor: Actor
) -> PackOrderPayment:
    """Order ``quantity`` packs of ``product`` and open a Stripe PaymentIntent for it.

    Idempotent on ``(buyer, idempotency_key)``: the same key with the same product and quantity returns
    the original order (``created`` False) and its PaymentIntent's client secret; with a different
    product or quantity raises PackOrderConflictError (409) and writes nothing. The order copies the
    product's figures, so a later catalogue edit never changes it.

    Not one transaction: the order is written first, then the PaymentIntent is created in Stripe with no
    lock held, then its id is stored. If Stripe fails (PaymentProviderError, 502) the order stays
    pending without a PaymentIntent and the next call with the same key completes it (Stripe's own
    idempotency key is per order, so it returns the same PaymentIntent).

    Raises NotABuyerError, UnknownPackProductError (inactive product), InvalidInputError (quantity),
    PackOrderConflictError, PaymentProviderError.
    """
    _require_buyer(buyer)
    order, created = _pack_order_get_or_create(
        buyer=buyer, product=product, quantity=quantity, idempotency_key=idempotency_key, actor=actor
    )
    if order.stripe_payment_intent_id:
        intent = gateway.payment_intent_retrieve(payment_intent_id=order.stripe_payment_intent_id)
    else:
        intent = _pack_order_open_payment(order=order)
        order.refresh_from_db()
    return PackOrderPayment(
        order=order, client_secret=intent.client_secret, payment_intent_status=intent.status, created=created
    )


@transaction.atomic
def _pack_order_get_or_create(
    *, buyer: Organisation, product: PackProduct, quantity: int, idempotency_key: str, actor: Actor
) -> tuple[PackOrder, bool]:
    existing = PackOrder.objects.filter(buyer=buyer, idempotency_key=idempotency_key).first()
    if existing is not None:
        _check_same_order(existing, product=product, quantity=quantity)
        return existing, False
    if not product.active:
        raise UnknownPackProductError(_("Pack product %(pack)s is not on sale.") % {"pack": product.code})
    if not 1 <= quantity <= MAX_ORDER_QUANTITY:
        raise InvalidInputError(
            _("Quantity must be between 1 and %(max)d.") % {"max": MAX_ORDER_QUANTITY},
            extra={"fields": {"quantity": [_("Between 1 and %(max)d.") % {"max": MAX_ORDER_QUANTITY}]}},
        )
    card_hours = product.card_hours * quantity
    amount = product.price * quantity
    if card_hours > _MAX_CARD_HOURS or amount > _MAX_AMOUNT:
        raise InvalidInputError(
            _("The order is too large."), extra={"fields": {"quantity": [_("Too many packs in one order.")]}}
        )
    order = PackOrder(
        buyer=buyer,
        product=product,
        quantity=quantity,
        accelerator=product.accelerator,
        card_hours=card_hours,
        amount=amount,
        currency=product.currency,
        validity_days=product.validity_days,
        idempotency_key=idempotency_key,
        created_by=actor.label[:200],
    )
    try:
        with transaction.atomic():
            order.save()
    except IntegrityError:
        # A concurrent request with the same key committed first (the unique index made us wait).
        existing = PackOrder.objects.get(buyer=buyer, idempotency_key=idempotency_key)
        _check_same_order(existing, product=product, quantity=quantity)
        return existing, False
    return order, True


def _check_same_order(order: PackOrder, *, product: PackProduct, quantity: int) -> None:
    if order.product_id != product.pk or order.quantity != quantity:
        raise PackOrderConflictError(
            _(
                "The idempotency key %(key)r was used for order %(order)s with a different product or quantity."
            )
            % {"key": order.idempotency_key, "order": order.pk},
            extra={"order": order.pk, "product": order.product.code, "quantity": order.quantity},
        )


def _pack_order_open_payment(*, order: PackOrder) -> gateway.PaymentIntentInfo:
    profile = billing_profile_get_or_create(buyer=order.buyer)
    customer_id = billing_profile_stripe_customer(profile=profile)
    intent = gateway.payment_intent_create(
        amount=order.amount,
        currency=order.currency,
        customer_id=customer_id,
        metadata={
            META_ORDER_ID: str(order.pk),
            META_BUYER: order.buyer.slug,
            META_PRODUCT: order.product.code,
        },
        idempotency_key=f"cardhour:pack-order:{order.pk}:{int(order.created_at.timestamp())}",
    )
    with transaction.atomic():
        locked = PackOrder.objects.select_for_update().get(pk=order.pk)
        if not locked.stripe_payment_intent_id:
            locked.stripe_payment_intent_id = intent.id
            locked.livemode = intent.livemode
            locked.save(update_fields=["stripe_payment_intent_id", "livemode"])
            return intent
        winner = locked.stripe_payment_intent_id
    # A concurrent call stored its PaymentIntent first (only possible where idempotency keys are
    # ignored, as on localstripe); ours is never confirmed and expires unused.
    return gateway.payment_intent_retrieve(payment_intent_id=winner)


def pack_order_confirm_test_payment(
    *, order: PackOrder, payment_method: str = "pm_card_visa"
) -> gateway.PaymentIntentInfo:
    """Pay an order server-side with one of Stripe's test payment methods (``pm_card_visa`` succeeds,
    ``pm_card_chargeCustomerFail`` is declined). For test mode and localstripe only — localstripe's
    Stripe.js cannot confirm a card payment, so this is how the demo and the tests pay. Changes nothing
    here: the pack is credited when the webhook arrives.

    Raises LiveModeTestPaymentError on live keys, InvalidInputError for an order without a payment.
    """
    if gateway.stripe_mode() == gateway.MODE_LIVE:
        raise LiveModeTestPaymentError(_("Test payment methods are refused on live Stripe keys."))
    if not order.stripe_payment_intent_id or order.status != PackOrder.Status.PENDING:
        raise InvalidInputError(_("Order %(order)s is not awaiting payment.") % {"order": order.pk})
    return gateway.payment_intent_confirm_test(
        payment_intent_id=order.stripe_payment_intent_id, payment_method=payment_method
    )


# --- Webhook events ---------------------------------------------------------------------------------


def stripe_event_receive(*, payload: bytes, signature: str) -> StripeEvent:
    """Verify, store and handle one webhook delivery.

    The signature is checked first: a bad one raises StripeSignatureError (400) and stores nothing.
    The event is then stored by its id (status ``received``) in its own transaction, so a crash while
    handling it leaves a visible row. A replay of an event already processed or ignored returns the
    stored row untouched; a new or previously failed one is handled by ``stripe_event_process``.
    Raises StripeEventFailedError (500, so Stripe delivers it again) when handling fails.
    """
    verified = gateway.webhook_event_construct(payload=payload, signature=signature)
    with transaction.atomic():
        event, _created = StripeEvent.objects.get_or_create(
            event_id=verified.id,
            defaults={
                "type": verified.type[:100],
                "livemode": verified.livemode,
                "object_id": verified.object_id[:100],
                "stripe_created": verified.created_at,
                "payload": dict(verified.payload),
            },
        )
    if event.status in (StripeEvent.Status.PROCESSED, StripeEvent.Status.IGNORED):
        return event
    return stripe_event_process(event=event)


def stripe_event_process(*, event: StripeEvent) -> StripeEvent:
    """Handle a stored event (see the module docstring for what each type does and the ordering rule).

    Safe to run twice, concurrently too: every effect is idempotent on its own (one pack per order, one
    ``PackRefund`` per Stripe refund, ledger keys), so the event row is not locked across the Stripe
    calls some handlers make. Marks the event processed or ignored; on any error marks it failed with
    the error text and raises StripeEventFailedError.
    """
    StripeEvent.objects.filter(pk=event.pk).update(attempts=F("attempts") + 1)
    try:
        verified = gateway.webhook_event_parse(data=event.payload)
        status, note = _stripe_event_dispatch(verified)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        logger.exception("Stripe event %s (%s) failed", event.event_id, event.type)
        _stripe_event_finish(event, StripeEvent.Status.FAILED, error)
        raise StripeEventFailedError(
            f"Event {event.event_id} ({event.type}) could not be processed; it is stored as failed.",
            extra={"event_id": event.event_id, "error": error[:500]},
        ) from exc
    return _stripe_event_finish(event, status, note)


def _stripe_event_finish(event: StripeEvent, status: str, error: str = "") -> StripeEvent:
    event.status = status
    event.error = error
    event.processed_at = timezone.now()
    StripeEvent.objects.filter(pk=event.pk).update(
        status=status, error=error, processed_at=event.processed_at
    )
    event.refresh_from_db(fields=["attempts"])
    return event


def _stripe_event_dispatch(event: gateway.WebhookEvent) -> tuple[str, str]:
    live = gateway.stripe_mode() == gateway.MODE_LIVE
    if event.livemode != live:
        return StripeEvent.Status.IGNORED, (
            f"A {'live' if event.livemode else 'test'}-mode event on a "
            f"{'live' if live else 'test'}-mode platform."
        )
    if event.type == "payment_intent.succeeded":
        return _on_payment_intent_succeeded(event)
    if event.type in ("payment_intent.payment_failed", "payment_intent.canceled"):
        return _on_payment_intent_unsettled(event)
    if event.type in ("charge.refunded", "charge.refund.updated", "refund.created", "refund.updated"):
        return _on_refund_activity(event)
    return StripeEvent.Status.IGNORED, ""


def _on_payment_intent_succeeded(event: gateway.WebhookEvent) -> tuple[str, str]:
    intent = gateway.payment_intent_from_object(event.object)
    order = _order_for_intent(intent)
    if order is None:
        return StripeEvent.Status.IGNORED, "Not a Cardhour pack payment."
    if intent.status != gateway.PI_SUCCEEDED:  # not what Stripe sends; trust only its current state
        intent = gateway.payment_intent_retrieve(payment_intent_id=intent.id)
    _pack_order_apply_intent(order=order, intent=intent, paid_at=event.created_at, posted_by=event.id)
    return StripeEvent.Status.PROCESSED, ""


def _on_payment_intent_unsettled(event: gateway.WebhookEvent) -> tuple[str, str]:
    snapshot = gateway.payment_intent_from_object(event.object)
    order = _order_for_intent(snapshot)
    if order is None:
        return StripeEvent.Status.IGNORED, "Not a Cardhour pack payment."
    if order.status not in _UNPAID:
        return StripeEvent.Status.PROCESSED, f"Order {order.pk} is already {order.status}; left as it is."
    current = gateway.payment_intent_retrieve(payment_intent_id=snapshot.id)
    _pack_order_apply_intent(order=order, intent=current, paid_at=event.created_at, posted_by=event.id)
    return StripeEvent.Status.PROCESSED, ""


def _order_for_intent(intent: gateway.PaymentIntentInfo) -> PackOrder | None:
    """The order a PaymentIntent pays: by its stored id, or — when the PaymentIntent was created but its
    id never stored (a crash in between) — by the order id in its metadata. None when it is not ours."""
    order = PackOrder.objects.select_related("buyer").filter(stripe_payment_intent_id=intent.id).first()
    if order is not None:
        return order
    raw = intent.metadata.get(META_ORDER_ID, "")
    if not raw:
        return None
    with transaction.atomic():
        order = PackOrder.objects.select_for_update().filter(pk=int(raw) if raw.isdigit() else 0).first()
        if order is None or (order.stripe_payment_intent_id and order.stripe_payment_intent_id != intent.id):
            raise StripePaymentMismatchError(
                f"PaymentIntent {intent.id} names order {raw!r}, which does not exist or has another payment."
            )
        order.stripe_payment_intent_id = intent.id
        order.livemode = intent.livemode
        order.save(update_fields=["stripe_payment_intent_id", "livemode"])
    return order


def _pack_order_apply_intent(
    *, order: PackOrder, intent: gateway.PaymentIntentInfo, paid_at: datetime | None, posted_by: str
) -> None:
    """Bring the order in line with its PaymentIntent's state (see the ordering rule)."""
    if intent.status == gateway.PI_SUCCEEDED:
        if intent.currency != order.currency or intent.amount != order.amount:
            raise StripePaymentMismatchError(
                f"PaymentIntent {intent.id} took {intent.amount} {intent.currency}; order {order.pk} is "
                f"for {order.amount} {order.currency}."
            )
        pack_issue(
            order=order,
            paid_at=intent.charged_at or paid_at or timezone.now(),
            posted_by=f"stripe {posted_by}",
            payment_reference=intent.id,
        )
    elif intent.status == gateway.PI_CANCELED:
        _pack_order_settle_unpaid(order=order, status=PackOrder.Status.CANCELED)
    elif intent.status == gateway.PI_REQUIRES_PAYMENT_METHOD and (
        intent.failure_code or intent.failure_message
    ):
        _pack_order_settle_unpaid(
            order=order,
            status=PackOrder.Status.FAILED,
            failure_code=intent.failure_code,
            failure_message=intent.failure_message,
        )


@transaction.atomic
def _pack_order_settle_unpaid(
    *, order: PackOrder, status: str, failure_code: str = "", failure_message: str = ""
) -> None:
    """Mark an unpaid order failed or canceled. A paid order never goes back (the lock orders this
    against ``pack_issue``, which takes the same lock)."""
    locked = PackOrder.objects.select_for_update().get(pk=order.pk)
    if locked.status not in _UNPAID or Pack.objects.filter(order=locked).exists():
        return
    locked.status = status
    locked.failure_code = failure_code[:64]
    locked.failure_message = failure_message[:500]
    locked.save(update_fields=["status", "failure_code", "failure_message"])


# --- Refunds ----------------------------------------------------------------------------------------


def pack_refund_request(*, pack: Pack, actor: Actor) -> gateway.RefundInfo:
    """Ask Stripe to refund the value of the pack's unused card-hours, rounded to the fen (the admin's
    "refund a pack"). Changes nothing here: the ledger moves when Stripe's webhook reports the refund.

    The value is what the remaining card-hours are worth at the pack's price (the telescoping value, so
    a pack never refunds more than it was paid, less earlier refunds). Raises PackNotRefundableError when
    the pack is not active, has nothing left, or was not paid through Stripe; PaymentProviderError.
    """
    order = pack.order
    if not order.stripe_payment_intent_id or order.status != PackOrder.Status.PAID:
        raise PackNotRefundableError(_("Pack %(pack)s was not paid through Stripe.") % {"pack": pack.pk})
    if pack.status != Pack.Status.ACTIVE:
        raise PackNotRefundableError(
            _("Pack %(pack)s is %(status)s.") % {"pack": pack.pk, "status": pack.status},
            extra={"status": pack.status},
        )
    balance = LedgerAccount.objects.filter(pack=pack).values_list("balance", flat=True).first() or 0
    if balance <= 0:
        raise PackNotRefundableError(_("Pack %(pack)s has no card-hours left.") % {"pack": pack.pk})
    value = pack_value_of_draw(
        price_micros=to_micros(pack.price),
        quantity_micros=pack.card_hours * MICROS,
        balance_before=balance,
        draw=balance,
    )
    refunded = PackRefund.objects.filter(order=order).aggregate(total=Sum("amount"))["total"] or Decimal(0)
    amount = min(micros_to_fen(value), order.amount - refunded)
    if amount <= 0:
        raise PackNotRefundableError(_("Pack %(pack)s has nothing left to refund.") % {"pack": pack.pk})
    return gateway.refund_create(
        payment_intent_id=order.stripe_payment_intent_id,
        amount=amount,
        currency=order.currency,
        metadata={
            META_ORDER_ID: str(order.pk),
            META_PACK_ID: str(pack.pk),
            META_REFUND_CARD_HOURS: str(balance),
            META_REQUESTED_BY: actor.label[:200],
        },
        # Per pack and remaining balance: a double click asks Stripe for one refund.
        idempotency_key=f"cardhour:pack-refund:{pack.pk}:{balance}",
    )


def _on_refund_activity(event: gateway.WebhookEvent) -> tuple[str, str]:
    payment_intent_id = event.payment_intent_id
    if not payment_intent_id and event.charge_id:
        payment_intent_id = gateway.charge_payment_intent_id(charge_id=event.charge_id)
    order = (
        PackOrder.objects.select_related("buyer").filter(stripe_payment_intent_id=payment_intent_id).first()
        if payment_intent_id
        else None
    )
    if order is None:
        return StripeEvent.Status.IGNORED, "Not a Cardhour pack payment."
    if not Pack.objects.filter(order=order).exists():
        # The refund overtook the payment's success event: credit the pack from Stripe's current word.
        intent = gateway.payment_intent_retrieve(payment_intent_id=payment_intent_id)
        _pack_order_apply_intent(order=order, intent=intent, paid_at=event.created_at, posted_by=event.id)
        if not Pack.objects.filter(order=order).exists():
            raise StripePaymentMismatchError(f"Refund of order {order.pk}, which was never paid.")

    refunds = sorted(
        (r for r in gateway.refund_list(payment_intent_id=payment_intent_id) if r.status == "succeeded"),
        key=lambda r: (r.created_at or timezone.now(), r.id),
    )
    refunded = Decimal(0)
    for refund in refunds:
        refunded += refund.amount
        pack_refund_record(
            order=order, refund=refund, completes_payment=refunded >= order.amount, posted_by=event.id
        )
    return StripeEvent.Status.PROCESSED, ""


@transaction.atomic
def pack_refund_record(
    *, order: PackOrder, refund: gateway.RefundInfo, completes_payment: bool, posted_by: str
) -> tuple[PackRefund, bool]:
    """Record a succeeded Stripe refund of an order's payment, exactly once per Stripe refund.

    Debits the pack by the card-hours the refund stands for (see the module docstring), at most what is
    left, under a lock on the pack's ledger account so concurrent usage cannot make it overdraw. Posts
    ``pack_refund:<refund id>``: pack −D / issuance +D; Stripe clearing −amount, buyer money +value of D,
    breakage the difference. A pack left with nothing becomes ``refunded`` (and its order too). Returns
    ``(refund, created)``.
    """
    existing = PackRefund.objects.filter(stripe_refund_id=refund.id).first()
    if existing is not None:
        return existing, False
    if refund.currency != order.currency:
        raise StripePaymentMismatchError(f"Refund {refund.id} is in {refund.currency}, not {order.currency}.")
    pack = (
        Pack.objects.select_for_update(of=("self",)).select_related("buyer", "accelerator").get(order=order)
    )
    account = ledger.account_pack(pack=pack)
    balance = LedgerAccount.objects.select_for_update().values_list("balance", flat=True).get(pk=account.pk)
    quantity = pack.card_hours * MICROS
    price = to_micros(pack.price)
    amount = to_micros(refund.amount)

    requested = refund.metadata.get(META_REFUND_CARD_HOURS, "")
    if requested.isdigit():
        wanted = int(requested)
    elif completes_payment:
        wanted = balance
    else:
        wanted = round_div(amount * quantity, price)
    draw = max(0, min(balance, wanted))
    value = (
        pack_value_of_draw(price_micros=price, quantity_micros=quantity, balance_before=balance, draw=draw)
        if draw
        else 0
    )
    refunded_at = refund.created_at or timezone.now()
    ledger.transfer_post(
        kind=TransferKind.PACK_REFUND,
        idempotency_key=f"pack_refund:{refund.id}",
        description=f"Refund {refund.id} of pack {pack.pk} (order {order.pk}): {refund.amount} {refund.currency}",
        posted_by=f"stripe {posted_by}",
        postings=[
            (account, -draw),
            (ledger.account_issuance(class_key=pack.class_key), draw),
            (ledger.account_stripe_clearing(), -amount),
            (ledger.account_buyer_money(buyer=pack.buyer), value),
            (ledger.account_breakage(), amount - value),
        ],
        posted_at=refunded_at,
    )
    record = PackRefund.objects.create(
        order=order,
        pack=pack,
        stripe_refund_id=refund.id,
        amount=refund.amount,
        card_hours_debited=draw,
        refunded_at=refunded_at,
    )
    if draw and draw == balance:
        pack.status = Pack.Status.REFUNDED
        pack.closed_at = timezone.now()
        pack.save(update_fields=["status", "closed_at"])
        PackOrder.objects.filter(pk=order.pk).update(status=PackOrder.Status.REFUNDED)
    return record, True


def _require_buyer(organisation: Organisation) -> None:
    if not organisation.is_buyer:
        raise NotABuyerError(
            _("%(organisation)s is not a buyer organisation.") % {"organisation": organisation.slug}
        )
