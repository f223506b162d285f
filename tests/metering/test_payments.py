"""Pack orders, billing profiles, the Stripe gateway's money and mode rules, and the payment selectors."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from core.errors import InvalidInputError
from core.types import Actor
from metering.errors import (
    LiveModeTestPaymentError,
    NotABuyerError,
    PackOrderConflictError,
    PackOrderNotFoundError,
    PaymentProviderError,
    UnknownPackProductError,
)
from metering.integrations import stripe as gateway
from metering.models import BillingProfile, Pack, PackOrder
from metering.selectors.payments import (
    buyer_balance_summary,
    pack_list_for,
    pack_order_get_for,
    pack_product_get_on_sale,
    pack_product_list,
)
from metering.services import ledger
from metering.services.payments import (
    billing_profile_get_or_create,
    pack_order_confirm_test_payment,
    pack_order_create,
)
from tests.factories import BuyerFactory, OperatorFactory
from tests.metering.factories import make_pack_product, make_paid_pack
from tests.metering.localstripe import (  # noqa: F401  # fixtures
    localstripe_fixture,
    stripe_on_localstripe_fixture,
    stripe_webhooks_fixture,
)

pytestmark = pytest.mark.django_db

A800 = "nvidia-a800-sxm4-80gb"


@pytest.fixture
def buyer():
    return BuyerFactory(slug="acme-ai", name="Acme AI")


@pytest.fixture
def product():
    return make_pack_product(
        code="a800-100", accelerator=A800, card_hours=100, price="1000.00", validity_days=90
    )


def create(buyer, product, *, key="order-1", quantity=1):
    return pack_order_create(
        buyer=buyer,
        product=product,
        quantity=quantity,
        idempotency_key=key,
        actor=Actor(organisation=buyer, system_label="test"),
    )


# --- Billing profiles -------------------------------------------------------------------------------


def test_billing_profile_is_created_once_in_cny(buyer):
    profile = billing_profile_get_or_create(buyer=buyer)
    again = billing_profile_get_or_create(buyer=buyer)

    assert profile.pk == again.pk
    assert (profile.currency, profile.legal_name, profile.stripe_customer_id) == ("CNY", "Acme AI", "")
    assert BillingProfile.objects.count() == 1


def test_billing_profile_refuses_an_organisation_that_is_not_a_buyer():
    with pytest.raises(NotABuyerError):
        billing_profile_get_or_create(buyer=OperatorFactory(slug="cucc"))
    assert not BillingProfile.objects.exists()


# --- Orders -----------------------------------------------------------------------------------------


def test_order_copies_the_product_and_opens_a_payment_intent_for_its_amount(
    buyer, product, stripe_on_localstripe
):
    payment = create(buyer, product, quantity=2)

    order = payment.order
    assert payment.created is True
    assert (order.status, order.quantity, order.card_hours, order.amount, order.currency) == (
        PackOrder.Status.PENDING,
        2,
        200,
        Decimal("2000.00"),
        "CNY",
    )
    assert (order.accelerator.slug, order.validity_days, order.livemode) == (A800, 90, False)
    assert order.created_by == "test"
    intent = stripe_on_localstripe.get(f"/v1/payment_intents/{order.stripe_payment_intent_id}")
    assert (intent["amount"], intent["currency"], intent["status"]) == (
        200000,
        "cny",
        "requires_payment_method",
    )
    assert intent["metadata"] == {
        "cardhour_order_id": str(order.pk),
        "cardhour_buyer": "acme-ai",
        "cardhour_product": "a800-100",
    }
    assert payment.client_secret == intent["client_secret"]
    profile = BillingProfile.objects.get(organisation=buyer)
    assert intent["customer"] == profile.stripe_customer_id
    assert profile.stripe_customer_id.startswith("cus_")
    # A catalogue edit never changes an order.
    product.price = Decimal("1.00")
    product.save()
    order.refresh_from_db()
    assert order.amount == Decimal("2000.00")


def test_same_key_same_body_returns_the_same_order_and_payment(buyer, product, stripe_on_localstripe):
    first = create(buyer, product)
    second = create(buyer, product)

    assert second.created is False
    assert second.order.pk == first.order.pk
    assert second.order.stripe_payment_intent_id == first.order.stripe_payment_intent_id
    assert second.client_secret == first.client_secret
    assert PackOrder.objects.count() == 1
    # The customer is made once, too.
    assert BillingProfile.objects.get().stripe_customer_id


def test_same_key_different_body_is_a_conflict_and_writes_nothing(buyer, product, stripe_on_localstripe):
    create(buyer, product)
    other = make_pack_product(code="std-10", card_hours=10, price="80.00")
    before = list(PackOrder.objects.values())

    with pytest.raises(PackOrderConflictError) as excinfo:
        create(buyer, other)
    with pytest.raises(PackOrderConflictError):
        create(buyer, product, quantity=2)

    assert excinfo.value.code == "pack_order_conflict"
    assert list(PackOrder.objects.values()) == before


def test_the_same_key_for_another_buyer_is_another_order(buyer, product, stripe_on_localstripe):
    other = BuyerFactory(slug="beta-lab")
    assert create(buyer, product).order.pk != create(other, product).order.pk


def test_order_refuses_non_buyers_inactive_products_and_bad_quantities(buyer, product):
    with pytest.raises(NotABuyerError):
        create(OperatorFactory(slug="cucc"), product)
    retired = make_pack_product(code="old", card_hours=10, price="10.00", active=False)
    with pytest.raises(UnknownPackProductError):
        create(buyer, retired)
    for quantity in (0, 101):
        with pytest.raises(InvalidInputError):
            create(buyer, product, key=f"q{quantity}", quantity=quantity)
    assert not PackOrder.objects.exists()


def test_stripe_down_leaves_a_pending_order_that_the_same_key_completes(
    buyer, product, settings, localstripe, stripe_webhooks
):
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(PaymentProviderError) as excinfo:
        create(buyer, product)
    assert excinfo.value.http_status == 502
    order = PackOrder.objects.get()
    assert (order.status, order.stripe_payment_intent_id) == (PackOrder.Status.PENDING, "")

    settings.STRIPE_API_BASE = localstripe.url
    payment = create(buyer, product)

    assert payment.order.pk == order.pk and payment.created is False
    assert payment.order.stripe_payment_intent_id.startswith("pi_")
    assert payment.client_secret.startswith(payment.order.stripe_payment_intent_id)


def test_test_payments_are_refused_on_live_keys(buyer, product, settings, stripe_on_localstripe):
    order = create(buyer, product).order
    settings.STRIPE_API_BASE = ""
    settings.STRIPE_SECRET_KEY = "sk_live_example"
    with pytest.raises(LiveModeTestPaymentError):
        pack_order_confirm_test_payment(order=order)


# --- Gateway rules ----------------------------------------------------------------------------------


def test_amounts_become_fen_only_exactly():
    assert gateway.amount_to_minor(amount=Decimal("1000.00"), currency="CNY") == 100000
    assert gateway.amount_to_minor(amount=Decimal("0.01"), currency="cny") == 1
    assert gateway.amount_from_minor(minor=66667, currency="cny") == Decimal("666.67")
    with pytest.raises(ValueError):
        gateway.amount_to_minor(amount=Decimal("1.005"), currency="CNY")
    with pytest.raises(ValueError):
        gateway.amount_to_minor(amount=Decimal("1.00"), currency="USD")


@pytest.mark.parametrize(
    ("base", "key", "mode", "shown"),
    [
        ("http://127.0.0.1:8420", "sk_test_localstripe", "localstripe", "test"),
        ("", "sk_test_abc", "test", "test"),
        ("https://api.stripe.com", "sk_live_abc", "live", "live"),
        ("", "rk_live_abc", "live", "live"),
    ],
)
def test_stripe_mode_labels_everything_but_live_keys_as_test(settings, base, key, mode, shown):
    settings.STRIPE_API_BASE = base
    settings.STRIPE_SECRET_KEY = key
    assert gateway.stripe_mode() == mode
    config = gateway.stripe_public_config()
    assert (config.mode, config.localstripe) == (shown, mode == "localstripe")


def test_no_secret_key_is_a_provider_error_not_a_call(settings, buyer, product):
    settings.STRIPE_SECRET_KEY = ""
    with pytest.raises(PaymentProviderError):
        create(buyer, product)


# --- Selectors --------------------------------------------------------------------------------------


def test_product_list_shows_what_is_on_sale_in_display_order():
    make_pack_product(code="b", card_hours=10, price="10.00", sort_order=2)
    make_pack_product(code="a", card_hours=10, price="10.00", sort_order=1)
    make_pack_product(code="c", card_hours=10, price="10.00", active=False)

    assert [p.code for p in pack_product_list()] == ["a", "b"]
    assert pack_product_get_on_sale(code="a").code == "a"
    with pytest.raises(UnknownPackProductError):
        pack_product_get_on_sale(code="c")


def test_pack_list_carries_the_remaining_balance_from_the_ledger(buyer):
    pack = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00")
    ledger.transfer_post(
        kind="usage",
        idempotency_key="draw",
        description="test",
        posted_by="test",
        postings=[
            (ledger.account_pack(pack=pack), -12_500_000),
            (ledger.account_issuance(class_key=A800), 12_500_000),
        ],
    )
    other = make_paid_pack(buyer=BuyerFactory(slug="beta-lab"), card_hours=5, price="40.00")

    packs = list(pack_list_for(buyer=buyer))

    assert [(p.pk, p.remaining_micros) for p in packs] == [(pack.pk, 87_500_000)]
    assert other.pk not in [p.pk for p in packs]


def test_balance_summary_per_class_counts_only_usable_packs(buyer):
    now = timezone.now()
    make_paid_pack(buyer=buyer, card_hours=10, price="80.00", key="s1")
    make_paid_pack(buyer=buyer, card_hours=5, price="40.00", key="s2", validity_days=30)
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00", key="a1")
    make_paid_pack(buyer=buyer, card_hours=7, price="50.00", key="old", paid_at=now - timedelta(days=400))

    summary = buyer_balance_summary(buyer=buyer, at=now + timedelta(seconds=1))

    assert [(b.class_key, b.remaining_card_hours, b.packs) for b in summary] == [
        ("std", Decimal("15.000000"), 2),
        (A800, Decimal("100.000000"), 1),
    ]
    assert summary[0].accelerator is None
    assert summary[0].next_expiry_at == Pack.objects.get(order__idempotency_key="s2").expires_at


def test_order_get_for_another_buyer_is_not_found(buyer):
    pack = make_paid_pack(buyer=buyer, card_hours=1, price="8.00")
    assert pack_order_get_for(buyer=buyer, order_id=pack.order_id).pk == pack.order_id
    with pytest.raises(PackOrderNotFoundError):
        pack_order_get_for(buyer=BuyerFactory(slug="beta-lab"), order_id=pack.order_id)
