"""Portal pages for card-hour packs: balances and orders, the buy form, and the checkout against a real
localstripe (test mode) — the pack appears only when the recorded webhook delivery reaches the platform."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from core.models import Organisation
from metering.integrations.stripe import PaymentIntentInfo
from metering.models import Pack, PackOrder, PackProduct
from metering.selectors import payments as payment_selectors
from tests.browser.conftest import browser, portal  # noqa: F401  # fixtures
from tests.metering.factories import make_pack_product, make_paid_pack
from tests.metering.localstripe import (  # noqa: F401  # fixtures
    LocalStripe,
    WebhookReceiver,
    deliver,
    localstripe_fixture,
    stripe_on_localstripe_fixture,
    stripe_webhooks_fixture,
)

pytestmark = pytest.mark.django_db

A800 = "nvidia-a800-sxm4-80gb"
SUCCEEDED = "payment_intent.succeeded"
FAILED = "payment_intent.payment_failed"


@pytest.fixture
def product(db: None) -> PackProduct:
    return make_pack_product(
        code="a800-100", name="A800 × 100", accelerator=A800, card_hours=100, price="850.00", validity_days=90
    )


@pytest.fixture
def std_product(db: None) -> PackProduct:
    return make_pack_product(
        code="std-100", name="Standard × 100", card_hours=100, price="1100.00", sort_order=1
    )


def buy(client: Client, *, product: str = "a800-100", quantity: object = 1, key: str = "portal-k1") -> Any:
    return client.post(
        reverse("pack-buy"), {"product": product, "quantity": quantity, "idempotency_key": key}
    )


def html(response: Any) -> str:
    return str(response.content.decode())


def order_of(buyer: Organisation) -> PackOrder:
    return PackOrder.objects.get(buyer=buyer)


# --- The packs page ---------------------------------------------------------------------------------


def test_pack_list_shows_exact_balances_packs_and_orders(
    funded_buyer: Organisation, buyer_client: Client, product: PackProduct, std_product: PackProduct
) -> None:
    make_paid_pack(buyer=funded_buyer, accelerator=None, card_hours=250, price="3000.00", key="std-2")
    PackOrder.objects.create(
        buyer=funded_buyer,
        product=product,
        quantity=2,
        accelerator=product.accelerator,
        card_hours=200,
        amount=Decimal("1700.00"),
        validity_days=90,
        idempotency_key="failed-one",
        status=PackOrder.Status.FAILED,
        failure_message="Your card was declined.",
    )

    response = buyer_client.get(reverse("pack-list"))

    assert response.status_code == 200
    page = html(response)
    balances = re.findall(
        r'<div class="label">([^<]+)</div>\s*<div class="value" title="([^"]+)">([^<]+)<', page
    )
    assert balances == [
        ("Standard cards", "1250.000000", "1,250.00 "),
        ("NVIDIA A800 SXM4 80GB", "1000.000000", "1,000.00 "),
    ]
    assert "2 packs" in page and "1 pack " in page
    packs = response.context["packs"].object_list
    assert [(p.card_hours, p.remaining_card_hours) for p in packs] == [
        (1000, Decimal("1000")),
        (1000, Decimal("1000")),
        (250, Decimal("250")),
    ]
    assert [o.status for o in response.context["orders"].object_list] == ["failed", "paid", "paid", "paid"]
    assert "Your card was declined." in page
    # The catalogue: both products on sale, with their price per card-hour.
    assert 'value="a800-100" data-price="850.00" checked' in page
    assert 'value="std-100" data-price="1100.00"' in page
    assert "¥8.50 per card-hour" in page and "¥11.00 per card-hour" in page
    assert 'name="idempotency_key"' in page


def test_pack_list_guards(
    client: Client, operator_client: Client, login: object, buyer_viewer: User, product: PackProduct
) -> None:
    response = client.get(reverse("pack-list"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert operator_client.get(reverse("pack-list")).status_code == 403
    viewer = login(buyer_viewer)  # type: ignore[operator]
    page = viewer.get(reverse("pack-list"))
    assert page.status_code == 200
    assert reverse("pack-buy") not in html(page) and "read only" in html(page)
    assert buy(viewer).status_code == 403
    assert not PackOrder.objects.exists()


def test_pack_list_query_count_does_not_grow_with_rows(
    buyer: Organisation, buyer_client: Client, product: PackProduct, django_assert_max_num_queries: object
) -> None:
    def count() -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            assert buyer_client.get(reverse("pack-list")).status_code == 200
        return len(queries)

    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=10, price="90.00", key="first")
    few = count()
    for n in range(60):
        make_paid_pack(
            buyer=buyer, accelerator=A800 if n % 2 else None, card_hours=10, price="90.00", key=f"k{n}"
        )
    many = count()
    assert many == few
    with django_assert_max_num_queries(14):  # type: ignore[operator]
        buyer_client.get(reverse("pack-list"))


# --- Buying -----------------------------------------------------------------------------------------


def test_a_double_submit_makes_one_order_and_goes_to_its_checkout(
    buyer: Organisation, buyer_client: Client, product: PackProduct, stripe_on_localstripe: LocalStripe
) -> None:
    first = buy(buyer_client, quantity=2)
    second = buy(buyer_client, quantity=2)

    order = order_of(buyer)
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == reverse("pack-order", args=[order.pk])
    assert (order.quantity, order.card_hours, order.amount, order.status) == (
        2,
        200,
        Decimal("1700.00"),
        "pending",
    )
    assert order.created_by == "user alice"
    intent = stripe_on_localstripe.get(f"/v1/payment_intents/{order.stripe_payment_intent_id}")
    assert (intent["amount"], intent["currency"]) == (170000, "cny")


def test_the_same_form_resubmitted_with_another_quantity_asks_again(
    buyer: Organisation, buyer_client: Client, product: PackProduct, stripe_on_localstripe: LocalStripe
) -> None:
    buy(buyer_client, quantity=1)
    response = buy(buyer_client, quantity=3)

    assert response.status_code == 200
    assert "This form was already used for another order" in html(response)
    assert response.context["form"]["idempotency_key"].value() != "portal-k1"
    assert PackOrder.objects.count() == 1


@pytest.mark.parametrize(
    ("quantity", "message"),
    [
        (0, "Ensure this value is greater than or equal to 1."),
        (101, "Ensure this value is less than or equal to 100."),
        ("many", "Enter a whole number."),
        ("", "This field is required."),
    ],
)
def test_a_bad_quantity_is_an_error_beside_the_field_and_orders_nothing(
    buyer_client: Client, product: PackProduct, quantity: object, message: str
) -> None:
    response = buy(buyer_client, quantity=quantity)

    assert response.status_code == 200
    page = html(response)
    assert f'<ul class="errorlist" id="quantity-errors"><li>{message}</li></ul>' in page
    assert 'class="field has-error"' in page
    assert not PackOrder.objects.exists()


def test_an_unknown_or_withdrawn_product_is_an_error_and_orders_nothing(
    buyer_client: Client, product: PackProduct
) -> None:
    response = buy(buyer_client, product="h800-9999")
    assert '<ul class="errorlist" id="product-errors"><li>This pack is not on sale.</li></ul>' in html(
        response
    )

    product.active = False
    product.save()
    response = buy(buyer_client, product="a800-100")
    assert response.status_code == 200
    assert "This pack is not on sale." in html(response)
    assert not PackOrder.objects.exists()


def test_buy_is_post_only(buyer_client: Client) -> None:
    assert buyer_client.get(reverse("pack-buy")).status_code == 405


# --- The checkout page ------------------------------------------------------------------------------


def _pending_order(
    buyer: Organisation, product: PackProduct, *, intent_id: str = "pi_elements_1"
) -> PackOrder:
    return PackOrder.objects.create(
        buyer=buyer,
        product=product,
        quantity=1,
        accelerator=product.accelerator,
        card_hours=100,
        amount=Decimal("850.00"),
        validity_days=90,
        idempotency_key="elements",
        stripe_payment_intent_id=intent_id,
    )


def _intent(
    intent_id: str, *, status: str = "requires_payment_method", message: str = ""
) -> PaymentIntentInfo:
    return PaymentIntentInfo(
        id=intent_id,
        status=status,
        amount=Decimal("850.00"),
        currency="CNY",
        client_secret=f"{intent_id}_secret_abc",
        livemode=False,
        customer_id="cus_1",
        latest_charge_id="",
        charged_at=None,
        failure_code="card_declined" if message else "",
        failure_message=message,
    )


@pytest.fixture
def stripe_elements(settings: object, monkeypatch: pytest.MonkeyPatch) -> dict[str, PaymentIntentInfo]:
    """Stripe proper (not localstripe) in test mode; the PaymentIntent as Stripe would report it."""
    settings.STRIPE_API_BASE = ""  # type: ignore[attr-defined]
    settings.STRIPE_SECRET_KEY = "sk_test_elements"  # type: ignore[attr-defined]
    settings.STRIPE_PUBLISHABLE_KEY = "pk_test_elements"  # type: ignore[attr-defined]
    settings.STRIPE_JS_URL = "https://js.stripe.com/v3/"  # type: ignore[attr-defined]
    intents: dict[str, PaymentIntentInfo] = {}
    monkeypatch.setattr(
        payment_selectors.gateway,
        "payment_intent_retrieve",
        lambda *, payment_intent_id: intents[payment_intent_id],
    )
    return intents


def test_checkout_with_stripe_elements_loads_only_stripe_js_with_the_publishable_key(
    buyer: Organisation,
    buyer_client: Client,
    product: PackProduct,
    stripe_elements: dict[str, PaymentIntentInfo],
) -> None:
    order = _pending_order(buyer, product)
    stripe_elements[order.stripe_payment_intent_id] = _intent(order.stripe_payment_intent_id)

    response = buyer_client.get(reverse("pack-order", args=[order.pk]))

    assert response.status_code == 200
    page = html(response)
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', page)
    assert scripts == ["/static/portal/portal.js", "https://js.stripe.com/v3/", "/static/portal/checkout.js"]
    assert 'data-publishable-key="pk_test_elements"' in page
    assert 'data-client-secret="pi_elements_1_secret_abc"' in page
    assert 'id="card-element"' in page
    assert 'id="card-errors" class="alert error" role="alert" hidden' in page
    assert "Test mode" in page and "Stripe test keys" in page
    assert reverse("pack-order-test-payment", args=[order.pk]) not in page  # no server-side test payments
    assert "¥850.00" in page


def test_checkout_with_stripe_elements_after_a_decline_shows_it_and_takes_another_card(
    buyer: Organisation,
    buyer_client: Client,
    product: PackProduct,
    stripe_elements: dict[str, PaymentIntentInfo],
) -> None:
    order = _pending_order(buyer, product)
    stripe_elements[order.stripe_payment_intent_id] = _intent(
        order.stripe_payment_intent_id, message="Your card was declined."
    )

    page = html(buyer_client.get(reverse("pack-order", args=[order.pk])))

    assert '<div id="card-errors" class="alert error" role="alert">Your card was declined.</div>' in page
    assert 'id="card-element"' in page  # the same PaymentIntent takes the next card
    # The badge says what the page says (and what the packs list says once the webhook has marked the
    # order failed), not "Awaiting payment".
    assert '<span id="order-status" class="badge bad" data-status="failed">Payment failed</span>' in page
    order.status = PackOrder.Status.FAILED
    order.save(update_fields=["status"])
    listed = html(buyer_client.get(reverse("pack-list")))
    assert '<span class="badge bad">Payment failed</span>' in listed
    assert "Awaiting payment" not in html(buyer_client.get(reverse("pack-order", args=[order.pk])))


def test_checkout_before_any_card_says_awaiting_payment(
    buyer: Organisation,
    buyer_client: Client,
    product: PackProduct,
    stripe_elements: dict[str, PaymentIntentInfo],
) -> None:
    order = _pending_order(buyer, product)
    stripe_elements[order.stripe_payment_intent_id] = _intent(order.stripe_payment_intent_id)
    page = html(buyer_client.get(reverse("pack-order", args=[order.pk])))
    assert 'data-status="pending">Awaiting payment</span>' in page


def test_checkout_on_live_keys_is_not_test_mode_and_refuses_test_payments(
    buyer: Organisation,
    buyer_client: Client,
    product: PackProduct,
    settings: object,
    stripe_elements: dict[str, PaymentIntentInfo],
) -> None:
    settings.STRIPE_SECRET_KEY = "sk_live_real"  # type: ignore[attr-defined]
    settings.STRIPE_PUBLISHABLE_KEY = "pk_live_real"  # type: ignore[attr-defined]
    order = _pending_order(buyer, product)
    stripe_elements[order.stripe_payment_intent_id] = _intent(order.stripe_payment_intent_id)

    page = html(buyer_client.get(reverse("pack-order", args=[order.pk])))
    assert "Test mode" not in page and "test card" not in page.lower()
    assert 'data-publishable-key="pk_live_real"' in page

    response = buyer_client.post(
        reverse("pack-order-test-payment", args=[order.pk]), {"card_number": "4242424242424242"}
    )
    assert response.status_code == 302  # back to the checkout; nothing was confirmed
    order.refresh_from_db()
    assert order.status == PackOrder.Status.PENDING


def test_another_buyers_order_is_404_and_an_operator_403(
    buyer: Organisation,
    other_buyer_client: Client,
    operator_client: Client,
    client: Client,
    product: PackProduct,
) -> None:
    order = _pending_order(buyer, product)
    for name in ("pack-order", "pack-order-status"):
        url = reverse(name, args=[order.pk])
        assert other_buyer_client.get(url).status_code == 404
        assert operator_client.get(url).status_code == 403
        assert client.get(url).status_code == 302
    pay_url = reverse("pack-order-test-payment", args=[order.pk])
    assert other_buyer_client.post(pay_url, {"card_number": "4242424242424242"}).status_code == 404
    assert operator_client.post(pay_url, {"card_number": "4242424242424242"}).status_code == 403


# --- Test mode on localstripe: buy, pay, wait for the webhook ---------------------------------------


def _status(client: Client, order: PackOrder) -> str:
    response = client.get(reverse("pack-order-status", args=[order.pk]))
    assert response.status_code == 200
    return html(response)


def test_test_mode_payment_is_credited_only_when_the_webhook_arrives(
    buyer: Organisation,
    buyer_client: Client,
    product: PackProduct,
    stripe_on_localstripe: LocalStripe,
    stripe_webhooks: WebhookReceiver,
) -> None:
    order_url = buy(buyer_client)["Location"]
    order = order_of(buyer)
    form_page = html(buyer_client.get(order_url))
    assert "Test mode" in form_page and "localstripe" in form_page
    assert 'name="card_number"' in form_page
    assert "<script" not in form_page.split("</main>")[1].replace(
        '<script src="/static/portal/portal.js" defer></script>', ""
    ).replace(
        '<script src="/static/portal/checkout.js" defer></script>', ""
    )  # no Stripe.js: it cannot pay here

    paid = buyer_client.post(
        reverse("pack-order-test-payment", args=[order.pk]), {"card_number": "4242 4242 4242 4242"}
    )
    assert paid.status_code == 302 and paid["Location"] == order_url

    waiting = html(buyer_client.get(order_url))  # a reload mid-way: the state comes from the server
    assert "Payment received — waiting for confirmation" in waiting
    assert f'data-poll-url="{reverse("pack-order-status", args=[order.pk])}?confirmed=1"' in waiting
    assert 'name="card_number"' not in waiting
    status = _status(buyer_client, order)
    assert "data-poll-done" not in status and "waiting for confirmation" in status
    assert not Pack.objects.exists()

    response = deliver(
        stripe_webhooks.wait_for(type=SUCCEEDED, payment_intent_id=order.stripe_payment_intent_id)
    )
    assert response.status_code == 200

    status = _status(buyer_client, order)
    assert "data-poll-done" in status
    assert "100 card-hours added" in status
    assert reverse("pack-list") in status
    pack = Pack.objects.get(order=order)
    assert (pack.buyer, pack.card_hours, pack.price) == (buyer, 100, Decimal("850.00"))
    assert "100 card-hours added" in html(buyer_client.get(order_url))
    balances = html(buyer_client.get(reverse("pack-list")))
    assert 'title="100.000000">100.00 ' in balances


def test_a_declined_test_card_shows_stripes_message_and_credits_nothing(
    buyer: Organisation,
    buyer_client: Client,
    product: PackProduct,
    stripe_on_localstripe: LocalStripe,
    stripe_webhooks: WebhookReceiver,
) -> None:
    order_url = buy(buyer_client, quantity=2)["Location"]
    order = order_of(buyer)

    buyer_client.post(
        reverse("pack-order-test-payment", args=[order.pk]), {"card_number": "4000000000000002"}
    )

    page = html(buyer_client.get(order_url))
    assert '<div class="alert error" role="alert">' in page
    assert "Stripe says: Your card was declined." in page
    assert "Try another card" in page
    assert 'data-status="failed">Payment failed</span>' in page  # before the webhook, too
    deliver(stripe_webhooks.wait_for(type=FAILED, payment_intent_id=order.stripe_payment_intent_id))
    order.refresh_from_db()
    assert (order.status, order.failure_message) == (PackOrder.Status.FAILED, "Your card was declined.")
    assert not Pack.objects.exists()
    assert "Stripe says: Your card was declined." in html(buyer_client.get(order_url))

    # Another card: the same pack and quantity on a fresh order, paid on its own checkout page.
    retry_key = re.search(r'name="idempotency_key" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    retried = buy(buyer_client, quantity=2, key=retry_key)
    fresh = PackOrder.objects.exclude(pk=order.pk).get()
    assert retried["Location"] == reverse("pack-order", args=[fresh.pk])
    assert (fresh.quantity, fresh.status) == (2, "pending")
    assert 'name="card_number"' in html(buyer_client.get(retried["Location"]))


def test_a_card_number_that_is_not_a_test_card_is_an_error_beside_the_field(
    buyer: Organisation, buyer_client: Client, product: PackProduct, stripe_on_localstripe: LocalStripe
) -> None:
    buy(buyer_client)
    order = order_of(buyer)

    response = buyer_client.post(
        reverse("pack-order-test-payment", args=[order.pk]), {"card_number": "5555 5555 5555 4444"}
    )

    assert response.status_code == 200
    assert "Test mode takes only Stripe&#x27;s test cards" in html(response)
    assert 'class="field has-error"' in html(response)
    intent = stripe_on_localstripe.get(f"/v1/payment_intents/{order.stripe_payment_intent_id}")
    assert intent["status"] == "requires_payment_method"  # nothing was confirmed


# --- In a browser: checkout.js with Stripe Elements ---------------------------------------------------

# A stand-in for Stripe.js with the calls checkout.js makes: a card "Element" (one input) and
# confirmCardPayment, which declines 4000 0000 0000 0002 with Stripe's message and pays anything else.
FAKE_STRIPE_JS = """
window.Stripe = function (key) {
  window.stripeKey = key;
  return {
    elements: function () { return { create: function () { return {
      mount: function (selector) {
        this.input = document.createElement("input");
        this.input.id = "fake-card";
        this.input.setAttribute("aria-label", "Card number");
        document.querySelector(selector).appendChild(this.input);
      },
      on: function () {},
      focus: function () { this.input.focus(); }
    }; } }; },
    confirmCardPayment: function (secret, data) {
      window.confirmedWith = secret;
      if (data.payment_method.card.input.value === "4000000000000002") {
        return Promise.resolve({ error: { type: "card_error", message: "Your card was declined." } });
      }
      return Promise.resolve({ paymentIntent: { id: "pi", status: "succeeded" } });
    }
  };
};
"""


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_elements_checkout_in_a_browser_shows_a_decline_then_waits_for_the_webhook(
    portal: Any,  # noqa: F811
    buyer: Organisation,
    buyer_user: User,
    product: PackProduct,
    stripe_elements: Any,
) -> None:
    from metering.services.packs import pack_issue

    order = _pending_order(buyer, product)
    stripe_elements[order.stripe_payment_intent_id] = _intent(order.stripe_payment_intent_id)
    page = portal.page
    page.route(
        "https://js.stripe.com/v3/",
        lambda route: route.fulfill(status=200, content_type="application/javascript", body=FAKE_STRIPE_JS),
    )
    portal.login_as(buyer_user)
    portal.goto(reverse("pack-order", args=[order.pk]))
    assert page.evaluate("window.stripeKey") == "pk_test_elements"

    page.fill("#fake-card", "4000000000000002")
    page.click("#pay-button")
    alert = page.locator("#card-errors")
    alert.wait_for(state="visible")
    assert alert.inner_text() == "Your card was declined."
    assert alert.get_attribute("role") == "alert"
    assert page.is_enabled("#pay-button")  # another card may be tried
    assert page.evaluate("window.confirmedWith") == "pi_elements_1_secret_abc"

    page.fill("#fake-card", "4242424242424242")
    page.click("#pay-button")
    page.get_by_text("Payment received — waiting for confirmation").wait_for()
    assert page.is_hidden("#checkout-form")
    assert not Pack.objects.exists()

    # The webhook credits the pack (as metering.services.payments does on payment_intent.succeeded).
    pack_issue(order=order, paid_at=order.created_at, posted_by="stripe evt_test", payment_reference="pi")
    page.get_by_text("100 card-hours added").wait_for(timeout=10_000)
    assert page.locator("#order-status").inner_text() == "Paid"
    assert portal.problems.all() == []
