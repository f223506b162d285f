"""Stripe's webhook against a real localstripe: payment succeeded, declined, replayed, out of order,
badly signed, failing, refunded — and the ledger invariant that every Stripe payment is matched by
exactly one credit.

Deliveries are the bytes and signatures localstripe sent (recorded by ``stripe_webhooks``) handed to
the real endpoint; one test has localstripe POST to a live server directly.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from decimal import Decimal

import pytest
import requests
from django.db.models import Sum

from core.money import MICROS, to_micros
from core.types import Actor
from metering.errors import PackNotRefundableError
from metering.integrations import stripe as gateway
from metering.models import (
    LedgerAccount,
    LedgerEntry,
    LedgerTransfer,
    Pack,
    PackOrder,
    PackRefund,
    StripeEvent,
    TransferKind,
)
from metering.services import ledger
from metering.services.payments import pack_refund_request
from tests.factories import BuyerFactory
from tests.metering.factories import make_pack_product
from tests.metering.localstripe import (  # noqa: F401  # fixtures
    DISABLED_EVENTS,
    LIVE_SERVER_WEBHOOK_ID,
    deliver,
    localstripe_fixture,
    order_pack,
    pay,
    post_webhook,
    sign,
    stripe_on_localstripe_fixture,
    stripe_webhooks_fixture,
    synthetic_event,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("stripe_on_localstripe")]

A800 = "nvidia-a800-sxm4-80gb"
SUCCEEDED = "payment_intent.succeeded"
FAILED = "payment_intent.payment_failed"
REFUNDED = "charge.refunded"


@pytest.fixture
def buyer():
    return BuyerFactory(slug="acme-ai", name="Acme AI")


@pytest.fixture
def product():
    return make_pack_product(code="a800-100", accelerator=A800, card_hours=100, price="1000.00")


def balance(key: str) -> int:
    account = LedgerAccount.objects.filter(key=key).first()
    return account.balance if account else 0


def assert_ledger_invariants() -> None:
    """Every transfer balances per unit; every paid order has exactly one purchase posting, for its
    amount; Stripe clearing holds what was paid less what was refunded."""
    for row in LedgerEntry.objects.values("transfer_id", "unit").annotate(total=Sum("amount")):
        assert row["total"] == 0, row
    paid = PackOrder.objects.filter(status__in=[PackOrder.Status.PAID, PackOrder.Status.REFUNDED])
    assert Pack.objects.count() == paid.count()
    for order in paid:
        purchase = LedgerTransfer.objects.get(
            kind=TransferKind.PACK_PURCHASE, idempotency_key=f"pack_purchase:{order.pk}"
        )
        assert purchase.entries.get(account__key="stripe_clearing").amount == to_micros(order.amount)
    assert LedgerTransfer.objects.filter(kind=TransferKind.PACK_PURCHASE).count() == paid.count()
    paid_total = sum((o.amount for o in paid), Decimal(0))
    refunded_total = PackRefund.objects.aggregate(total=Sum("amount"))["total"] or Decimal(0)
    assert balance("stripe_clearing") == to_micros(paid_total - refunded_total)


# --- Payment succeeded ------------------------------------------------------------------------------


def test_payment_succeeded_credits_one_pack_with_its_ledger_postings(buyer, product, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    intent = pay(order)
    assert intent.status == "succeeded"
    assert not Pack.objects.exists()  # confirming is not paying: only the webhook credits

    delivery = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)
    response = deliver(delivery)

    assert response.status_code == 200, response.content
    assert response.json() == {"event": delivery.event_id, "status": "processed"}
    order.refresh_from_db()
    assert order.status == PackOrder.Status.PAID
    pack = Pack.objects.get(order=order)
    assert (pack.buyer, pack.card_hours, pack.price, pack.class_key) == (buyer, 100, Decimal("1000.00"), A800)
    assert pack.expires_at - pack.starts_at == timedelta(days=365)
    transfer = LedgerTransfer.objects.get(kind=TransferKind.PACK_PURCHASE)
    assert {e.account.key: e.amount for e in transfer.entries.select_related("account")} == {
        f"pack:{pack.pk}": 100 * MICROS,
        f"issuance:{A800}": -100 * MICROS,
        "stripe_clearing": 1000 * MICROS,
        f"buyer_money:{buyer.pk}": -1000 * MICROS,
    }
    event = StripeEvent.objects.get(event_id=delivery.event_id)
    assert (event.type, event.status, event.object_id, event.attempts, event.error) == (
        SUCCEEDED,
        "processed",
        order.stripe_payment_intent_id,
        1,
        "",
    )
    assert event.payload == json.loads(delivery.body)
    assert_ledger_invariants()


def test_declined_card_fails_the_order_with_stripes_message_and_credits_nothing(
    buyer, product, stripe_webhooks
):
    order = order_pack(buyer=buyer, product=product)
    intent = pay(order, "pm_card_chargeCustomerFail")
    assert intent.status == "requires_payment_method"

    response = deliver(
        stripe_webhooks.wait_for(type=FAILED, payment_intent_id=order.stripe_payment_intent_id)
    )

    assert response.status_code == 200, response.content
    order.refresh_from_db()
    assert (order.status, order.failure_code, order.failure_message) == (
        PackOrder.Status.FAILED,
        "card_declined",
        "Your card was declined.",
    )
    assert not Pack.objects.exists()
    assert not LedgerTransfer.objects.exists()


def test_the_same_event_replayed_ten_times_credits_one_pack(buyer, product, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    pay(order)
    delivery = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)

    statuses = [deliver(delivery).status_code for _ in range(10)]

    assert statuses == [200] * 10
    assert Pack.objects.filter(order=order).count() == 1
    assert StripeEvent.objects.count() == 1
    assert StripeEvent.objects.get().attempts == 1  # replays of a processed event are not handled again
    assert LedgerTransfer.objects.count() == 1
    assert balance("stripe_clearing") == 1000 * MICROS
    assert_ledger_invariants()


def test_two_orders_two_packs_each_credited_once(buyer, product, stripe_webhooks):
    first = order_pack(buyer=buyer, product=product, key="a")
    second = order_pack(buyer=buyer, product=product, key="b", quantity=3)
    pay(first)
    pay(second)
    for order in (first, second, first, second):
        deliver(stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id))

    assert sorted(Pack.objects.values_list("card_hours", flat=True)) == [100, 300]
    assert balance("stripe_clearing") == 4000 * MICROS
    assert_ledger_invariants()


# --- Out of order -----------------------------------------------------------------------------------


def test_succeeded_before_created_credits_once_and_ignores_created(
    buyer, product, localstripe, stripe_webhooks
):
    order = order_pack(buyer=buyer, product=product)
    # localstripe never sends payment_intent.created: build it around the real PaymentIntent as it was.
    created_body = synthetic_event(
        "payment_intent.created", localstripe.get(f"/v1/payment_intents/{order.stripe_payment_intent_id}")
    )
    pay(order)
    succeeded = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)

    assert deliver(succeeded).status_code == 200
    assert post_webhook(created_body, sign(created_body)).status_code == 200

    order.refresh_from_db()
    assert order.status == PackOrder.Status.PAID
    assert Pack.objects.filter(order=order).count() == 1
    assert dict(StripeEvent.objects.values_list("type", "status")) == {
        SUCCEEDED: "processed",
        "payment_intent.created": "ignored",
    }
    assert_ledger_invariants()


def _declined_then_paid(order, localstripe, stripe_webhooks):
    """The buyer's first card is declined, the second one pays the same PaymentIntent."""
    pay(order, "pm_card_chargeCustomerFail")
    failed = stripe_webhooks.wait_for(type=FAILED, payment_intent_id=order.stripe_payment_intent_id)
    localstripe.allow_retry_after_decline(order.stripe_payment_intent_id)
    pay(order, "pm_card_visa")
    succeeded = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)
    return failed, succeeded


def test_failed_arriving_after_succeeded_leaves_the_order_paid(buyer, product, localstripe, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    failed, succeeded = _declined_then_paid(order, localstripe, stripe_webhooks)

    assert deliver(succeeded).status_code == 200
    assert deliver(failed).status_code == 200

    order.refresh_from_db()
    assert (order.status, order.failure_code, order.failure_message) == (PackOrder.Status.PAID, "", "")
    assert Pack.objects.filter(order=order).count() == 1
    late = StripeEvent.objects.get(event_id=failed.event_id)
    assert late.status == "processed" and "already paid" in late.error
    assert_ledger_invariants()


def test_failed_then_succeeded_in_order_ends_paid(buyer, product, localstripe, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    failed, succeeded = _declined_then_paid(order, localstripe, stripe_webhooks)

    deliver(failed)
    order.refresh_from_db()
    # Stripe's current word: by the time the failure arrives the PaymentIntent has succeeded, so the
    # re-fetch credits the pack already.
    assert order.status == PackOrder.Status.PAID
    deliver(succeeded)

    order.refresh_from_db()
    assert (order.status, order.failure_code) == (PackOrder.Status.PAID, "")
    assert Pack.objects.filter(order=order).count() == 1
    assert_ledger_invariants()


def test_a_lost_success_event_is_made_up_by_the_failure_event_refetch(
    buyer, product, localstripe, stripe_webhooks
):
    order = order_pack(buyer=buyer, product=product)
    failed, _ = _declined_then_paid(order, localstripe, stripe_webhooks)

    deliver(failed)  # the success event is never delivered

    order.refresh_from_db()
    assert order.status == PackOrder.Status.PAID
    assert Pack.objects.filter(order=order).count() == 1
    assert_ledger_invariants()


def test_canceled_payment_cancels_the_order(buyer, product, localstripe):
    order = order_pack(buyer=buyer, product=product)
    intent = localstripe.post(f"/v1/payment_intents/{order.stripe_payment_intent_id}/cancel", {})
    assert intent["status"] == "canceled"
    body = synthetic_event("payment_intent.canceled", intent)  # localstripe sends no event for it

    assert post_webhook(body, sign(body)).status_code == 200

    order.refresh_from_db()
    assert order.status == PackOrder.Status.CANCELED
    assert not Pack.objects.exists()


def test_a_payment_whose_id_was_never_stored_is_matched_by_its_metadata(buyer, product, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    intent_id = order.stripe_payment_intent_id
    pay(order)
    # As if the process died between creating the PaymentIntent and storing its id.
    PackOrder.objects.filter(pk=order.pk).update(stripe_payment_intent_id="")

    deliver(stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=intent_id))

    order.refresh_from_db()
    assert (order.status, order.stripe_payment_intent_id) == (PackOrder.Status.PAID, intent_id)
    assert Pack.objects.filter(order=order).count() == 1
    assert_ledger_invariants()


# --- Bad signatures ---------------------------------------------------------------------------------


def _bad_deliveries(delivery):
    body, signature = delivery.body, delivery.signature
    tampered = body.replace(b'"amount": 100000', b'"amount": 1')
    assert tampered != body
    stale = int(time.time()) - 3600
    return {
        "tampered-body": (tampered, signature),
        "wrong-secret": (body, sign(body, secret="whsec_someone_else")),
        "no-header": (body, None),
        "garbage-header": (body, "not-a-signature"),
        "stale-timestamp": (body, sign(body, timestamp=stale)),
        "not-utf8": (b"\xff\xfe" + body, sign(b"\xff\xfe" + body)),
    }


def test_bad_signatures_are_400_and_store_and_credit_nothing(buyer, product, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    pay(order)
    delivery = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)

    for label, (body, signature) in _bad_deliveries(delivery).items():
        response = post_webhook(body, signature)
        assert response.status_code == 400, label
        assert response.json()["code"] == "stripe_signature_invalid", label

    assert not StripeEvent.objects.exists()
    assert not Pack.objects.exists()
    assert not LedgerTransfer.objects.exists()
    order.refresh_from_db()
    assert order.status == PackOrder.Status.PENDING


def test_signed_body_that_is_not_an_event_is_400_and_stores_nothing():
    body = b'{"hello": "world"}'
    response = post_webhook(body, sign(body))
    assert response.status_code == 400
    assert response.json()["code"] == "stripe_signature_invalid"
    assert not StripeEvent.objects.exists()


# --- Failures and retries ---------------------------------------------------------------------------


def test_a_processing_error_is_500_stored_failed_and_a_retry_succeeds(buyer, product, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    pay(order)
    delivery = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)
    PackOrder.objects.filter(pk=order.pk).update(amount=Decimal("999.00"))  # payment ≠ order: refuse

    response = deliver(delivery)

    assert response.status_code == 500
    assert response.json()["code"] == "stripe_event_failed"
    event = StripeEvent.objects.get(event_id=delivery.event_id)
    assert event.status == "failed"
    assert "StripePaymentMismatchError" in event.error and "999.00" in event.error
    assert not Pack.objects.exists()
    assert not LedgerTransfer.objects.exists()

    PackOrder.objects.filter(pk=order.pk).update(amount=Decimal("1000.00"))
    response = deliver(delivery)  # Stripe retries after our 500

    assert response.status_code == 200
    event.refresh_from_db()
    assert (event.status, event.error, event.attempts) == ("processed", "", 2)
    assert Pack.objects.filter(order=order).count() == 1
    assert_ledger_invariants()


def test_events_for_other_payments_and_types_are_ignored(localstripe):
    intent = localstripe.get("/v1/payment_intents/" + _foreign_payment_intent(localstripe))
    body = synthetic_event("payment_intent.succeeded", intent)
    other = synthetic_event("customer.created", {"id": "cus_x", "object": "customer"})
    live = json.dumps({**json.loads(other), "id": "evt_live", "livemode": True}).encode()

    for payload in (body, other, live):
        assert post_webhook(payload, sign(payload)).status_code == 200

    assert sorted(StripeEvent.objects.values_list("status", flat=True)) == ["ignored"] * 3
    assert "live-mode event" in StripeEvent.objects.get(event_id="evt_live").error
    assert not Pack.objects.exists()


def _foreign_payment_intent(localstripe) -> str:
    """A PaymentIntent someone else created on the same Stripe account (no Cardhour metadata)."""
    response = requests.post(
        f"{localstripe.url}/v1/payment_intents",
        data={"amount": 500, "currency": "cny", "payment_method": "pm_card_visa", "confirm": "true"},
        headers={"Authorization": "Bearer sk_test_other"},
        timeout=10,
    )
    response.raise_for_status()
    return response.json()["id"]


# --- Refunds ----------------------------------------------------------------------------------------


def _paid_pack(buyer, product, stripe_webhooks, key="order-1") -> Pack:
    order = order_pack(buyer=buyer, product=product, key=key)
    pay(order)
    deliver(stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id))
    return Pack.objects.select_related("order", "accelerator", "buyer").get(order=order)


def _draw(pack: Pack, card_hours: int) -> None:
    """Use card-hours of the pack, as rating would: the pack and the prepaid value it held go down."""
    value = to_micros(pack.price) * card_hours // pack.card_hours
    ledger.transfer_post(
        kind=TransferKind.USAGE,
        idempotency_key=f"test_draw:{pack.pk}:{card_hours}",
        description="test usage",
        posted_by="test",
        postings=[
            (ledger.account_pack(pack=pack), -card_hours * MICROS),
            (ledger.account_issuance(class_key=pack.class_key), card_hours * MICROS),
            (ledger.account_buyer_money(buyer=pack.buyer), value),
            (ledger.account_platform_spread(), -value),
        ],
    )


def test_refund_debits_the_unused_part_and_closes_the_pack(buyer, product, stripe_webhooks):
    pack = _paid_pack(buyer, product, stripe_webhooks)
    _draw(pack, 30)

    refund = pack_refund_request(pack=pack, actor=Actor.system("admin test"))

    assert (refund.amount, refund.currency, refund.status) == (Decimal("700.00"), "CNY", "succeeded")
    assert not PackRefund.objects.exists()  # the ledger moves when the webhook arrives
    delivery = stripe_webhooks.wait_for(type=REFUNDED, payment_intent_id=pack.order.stripe_payment_intent_id)
    assert deliver(delivery).status_code == 200
    assert deliver(delivery).status_code == 200  # a replay changes nothing

    record = PackRefund.objects.get()
    assert (record.stripe_refund_id, record.amount, record.card_hours_debited) == (
        refund.id,
        Decimal("700.00"),
        70 * MICROS,
    )
    pack.refresh_from_db()
    assert pack.status == Pack.Status.REFUNDED and pack.closed_at is not None
    assert PackOrder.objects.get(pk=pack.order_id).status == PackOrder.Status.REFUNDED
    assert balance(f"pack:{pack.pk}") == 0
    transfer = LedgerTransfer.objects.get(kind=TransferKind.PACK_REFUND)
    assert {e.account.key: e.amount for e in transfer.entries.select_related("account")} == {
        f"pack:{pack.pk}": -70 * MICROS,
        f"issuance:{A800}": 70 * MICROS,
        "stripe_clearing": -700 * MICROS,
        f"buyer_money:{buyer.pk}": 700 * MICROS,
    }
    assert balance(f"buyer_money:{buyer.pk}") == 0  # 1000 paid = 300 used + 700 refunded
    assert balance("stripe_clearing") == 300 * MICROS
    assert_ledger_invariants()

    with pytest.raises(PackNotRefundableError):
        pack_refund_request(pack=pack, actor=Actor.system("admin test"))


def test_refund_rounds_to_the_fen_and_the_difference_goes_to_breakage(buyer, stripe_webhooks):
    product = make_pack_product(code="std-3", card_hours=3, price="10.00")
    pack = _paid_pack(buyer, product, stripe_webhooks)
    _draw(pack, 1)  # 2 of 3 card-hours left: worth 6.666667 CNY, refunded as 6.67

    refund = pack_refund_request(pack=pack, actor=Actor.system("admin test"))
    deliver(stripe_webhooks.wait_for(type=REFUNDED, payment_intent_id=pack.order.stripe_payment_intent_id))

    assert refund.amount == Decimal("6.67")
    assert PackRefund.objects.get().card_hours_debited == 2 * MICROS
    assert balance(f"pack:{pack.pk}") == 0
    assert balance("breakage") == 3_333  # the refund paid 0.003333 CNY more than the value released
    assert_ledger_invariants()


def test_a_full_refund_made_in_stripes_dashboard_debits_everything_left(buyer, product, stripe_webhooks):
    pack = _paid_pack(buyer, product, stripe_webhooks)
    _draw(pack, 25)
    gateway.refund_create(  # no Cardhour metadata, as from the dashboard
        payment_intent_id=pack.order.stripe_payment_intent_id,
        amount=Decimal("1000.00"),
        currency="CNY",
        metadata={},
        idempotency_key="dashboard",
    )

    deliver(stripe_webhooks.wait_for(type=REFUNDED, payment_intent_id=pack.order.stripe_payment_intent_id))

    assert PackRefund.objects.get().card_hours_debited == 75 * MICROS
    assert balance(f"pack:{pack.pk}") == 0
    assert balance("breakage") == 250 * MICROS  # goodwill: the used 25 card-hours were refunded too
    assert_ledger_invariants()


def test_a_partial_dashboard_refund_debits_what_the_money_buys_back(buyer, product, stripe_webhooks):
    pack = _paid_pack(buyer, product, stripe_webhooks)
    gateway.refund_create(
        payment_intent_id=pack.order.stripe_payment_intent_id,
        amount=Decimal("100.00"),
        currency="CNY",
        metadata={},
        idempotency_key="partial",
    )

    deliver(stripe_webhooks.wait_for(type=REFUNDED, payment_intent_id=pack.order.stripe_payment_intent_id))

    assert PackRefund.objects.get().card_hours_debited == 10 * MICROS
    pack.refresh_from_db()
    assert pack.status == Pack.Status.ACTIVE
    assert balance(f"pack:{pack.pk}") == 90 * MICROS
    assert_ledger_invariants()


def test_a_refund_that_overtakes_the_success_event_credits_then_refunds(buyer, product, stripe_webhooks):
    order = order_pack(buyer=buyer, product=product)
    pay(order)
    succeeded = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)
    gateway.refund_create(
        payment_intent_id=order.stripe_payment_intent_id,
        amount=Decimal("1000.00"),
        currency="CNY",
        metadata={},
        idempotency_key="early",
    )
    refunded = stripe_webhooks.wait_for(type=REFUNDED, payment_intent_id=order.stripe_payment_intent_id)

    assert deliver(refunded).status_code == 200
    assert deliver(succeeded).status_code == 200

    pack = Pack.objects.get(order=order)
    assert pack.status == Pack.Status.REFUNDED
    assert PackRefund.objects.get().card_hours_debited == 100 * MICROS
    assert balance(f"pack:{pack.pk}") == 0
    assert balance("stripe_clearing") == 0
    assert_ledger_invariants()


def test_refund_request_refuses_packs_with_nothing_to_refund(buyer, product, stripe_webhooks):
    pack = _paid_pack(buyer, product, stripe_webhooks)
    _draw(pack, 100)
    with pytest.raises(PackNotRefundableError):
        pack_refund_request(pack=pack, actor=Actor.system("admin test"))


# --- Over the network: localstripe POSTs to a live server ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_webhook_delivered_by_localstripe_to_live_server(live_server, localstripe, stripe_webhooks):
    buyer = BuyerFactory(slug="acme-ai")
    product = make_pack_product(code="std-50", card_hours=50, price="400.00")
    url = live_server.url.replace("localhost", "127.0.0.1") + "/api/v1/stripe/webhook"
    localstripe.register_webhook(LIVE_SERVER_WEBHOOK_ID, url)
    try:
        order = order_pack(buyer=buyer, product=product)
        pay(order)
        # localstripe posts to the live server first, then to the receiver: once the receiver has the
        # event, the live server has answered it.
        delivery = stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)
    finally:
        localstripe.register_webhook(
            LIVE_SERVER_WEBHOOK_ID, f"{stripe_webhooks.url}/unused", events=DISABLED_EVENTS
        )

    event = StripeEvent.objects.get(event_id=delivery.event_id)
    assert event.status == "processed"
    order.refresh_from_db()
    assert order.status == PackOrder.Status.PAID
    pack = Pack.objects.get(order=order)
    assert pack.class_key == "std"
    assert balance(f"pack:{pack.pk}") == 50 * MICROS
    assert_ledger_invariants()
