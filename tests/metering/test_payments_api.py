"""The pack API: catalogue, orders, packs — good paths, idempotency, and who may see and do what."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.models import ApiToken
from metering.models import BillingProfile, PackOrder
from tests.factories import BuyerFactory, OperatorFactory
from tests.metering.factories import make_pack_product, make_paid_pack
from tests.metering.localstripe import (  # noqa: F401  # fixtures
    deliver,
    localstripe_fixture,
    pay,
    stripe_on_localstripe_fixture,
    stripe_webhooks_fixture,
)

pytestmark = pytest.mark.django_db

A800 = "nvidia-a800-sxm4-80gb"
ORDERS = "/api/v1/pack-orders"


@pytest.fixture
def buyer():
    return BuyerFactory(slug="acme-ai", name="Acme AI")


@pytest.fixture
def buyer_api(buyer, token_client) -> APIClient:
    return token_client(buyer)


@pytest.fixture
def product():
    return make_pack_product(code="a800-100", accelerator=A800, card_hours=100, price="1000.00")


def order_body(**changes):
    return {"product": "a800-100", "quantity": 1, "idempotency_key": "order-1", **changes}


# --- Catalogue --------------------------------------------------------------------------------------


def test_any_organisation_lists_the_products_on_sale(api, product):
    make_pack_product(code="std-10", card_hours=10, price="80.00", sort_order=0)
    make_pack_product(code="retired", card_hours=10, price="80.00", active=False)

    response = api.get("/api/v1/pack-products")  # an operator: the catalogue is public to members

    assert response.status_code == 200
    assert response.json()["results"] == [
        {
            "code": "a800-100",
            "name": "a800-100",
            "pack_class": A800,
            "accelerator": A800,
            "card_hours": 100,
            "price": "1000.00",
            "currency": "CNY",
            "validity_days": 365,
        },
        {
            "code": "std-10",
            "name": "std-10",
            "pack_class": "std",
            "accelerator": None,
            "card_hours": 10,
            "price": "80.00",
            "currency": "CNY",
            "validity_days": 365,
        },
    ]


def test_the_catalogue_needs_credentials(product):
    assert APIClient().get("/api/v1/pack-products").status_code == 401


# --- Ordering ---------------------------------------------------------------------------------------


def test_order_returns_the_order_and_what_stripe_js_needs(buyer_api, product, stripe_on_localstripe):
    response = buyer_api.post(ORDERS, order_body(quantity=2), format="json")

    assert response.status_code == 201, response.json()
    data = response.json()
    order = PackOrder.objects.get()
    payment = data.pop("payment")
    assert data == {
        "id": order.pk,
        "product": "a800-100",
        "pack_class": A800,
        "accelerator": A800,
        "quantity": 2,
        "card_hours": 200,
        "amount": "2000.00",
        "currency": "CNY",
        "validity_days": 365,
        "status": "pending",
        "failure_code": "",
        "failure_message": "",
        "livemode": False,
        "idempotency_key": "order-1",
        "created_at": data["created_at"],
        "paid_at": None,
        "pack": None,
    }
    assert payment == {
        "payment_intent": order.stripe_payment_intent_id,
        "payment_intent_status": "requires_payment_method",
        "client_secret": payment["client_secret"],
        "publishable_key": "pk_test_cardhour_tests",
        "stripe_js_url": f"{stripe_on_localstripe.url}/js.stripe.com/v3/",
        "mode": "test",
        "localstripe": True,
    }
    assert payment["client_secret"].startswith(f"{order.stripe_payment_intent_id}_secret_")
    assert order.created_by.startswith("token test")


def test_repeating_an_order_returns_it_and_a_different_body_is_409(buyer_api, product, stripe_on_localstripe):
    first = buyer_api.post(ORDERS, order_body(), format="json").json()

    again = buyer_api.post(ORDERS, order_body(), format="json")
    conflict = buyer_api.post(ORDERS, order_body(quantity=3), format="json")

    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert again.json()["payment"]["client_secret"] == first["payment"]["client_secret"]
    assert conflict.status_code == 409
    assert conflict.json()["code"] == "pack_order_conflict"
    assert PackOrder.objects.count() == 1


@pytest.mark.parametrize(
    ("changes", "status", "code"),
    [
        ({"product": "no-such-pack"}, 400, "unknown_pack_product"),
        ({"product": "retired"}, 400, "unknown_pack_product"),
        ({"quantity": 0}, 400, "invalid"),
        ({"quantity": 101}, 400, "invalid"),
        ({"idempotency_key": ""}, 400, "invalid"),
        ({"idempotency_key": "k" * 201}, 400, "invalid"),
    ],
)
def test_bad_orders_are_4xx_and_write_nothing(buyer_api, product, changes, status, code):
    make_pack_product(code="retired", card_hours=1, price="1.00", active=False)
    response = buyer_api.post(ORDERS, order_body(**changes), format="json")
    assert response.status_code == status, response.json()
    assert response.json()["code"] == code
    assert not PackOrder.objects.exists()
    assert not BillingProfile.objects.exists()


def test_stripe_unreachable_is_502(buyer_api, product):
    response = buyer_api.post(ORDERS, order_body(), format="json")  # test settings: nothing on :9
    assert response.status_code == 502
    assert response.json()["code"] == "payment_provider_error"


# --- Authorisation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url"),
    [("get", ORDERS), ("post", ORDERS), ("get", f"{ORDERS}/1"), ("get", "/api/v1/packs")],
)
def test_an_operator_only_organisation_is_not_a_buyer(api, product, method, url):
    response = getattr(api, method)(url, order_body(), format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "not_a_buyer"
    assert not PackOrder.objects.exists()


def test_a_read_only_token_cannot_order(buyer, product, token_client):
    client = token_client(buyer, scope=ApiToken.Scope.READ_ONLY)

    response = client.post(ORDERS, order_body(), format="json")

    assert response.status_code == 403
    assert response.json()["code"] == "read_only_credential"
    assert client.get(ORDERS).status_code == 200
    assert not PackOrder.objects.exists()


def test_another_buyers_orders_and_packs_are_invisible(buyer, buyer_api, token_client):
    theirs = make_paid_pack(buyer=BuyerFactory(slug="beta-lab"), card_hours=5, price="40.00")
    mine = make_paid_pack(buyer=buyer, card_hours=10, price="80.00")

    other_order = buyer_api.get(f"{ORDERS}/{theirs.order_id}")
    own_order = buyer_api.get(f"{ORDERS}/{mine.order_id}")

    assert other_order.status_code == 404
    assert other_order.json()["code"] == "pack_order_not_found"
    assert own_order.status_code == 200
    assert own_order.json()["pack"] == mine.pk
    assert [o["id"] for o in buyer_api.get(ORDERS).json()["results"]] == [mine.order_id]
    assert [p["id"] for p in buyer_api.get("/api/v1/packs").json()["results"]] == [mine.pk]


def test_a_buyer_that_is_also_an_operator_may_buy(token_client, product, stripe_on_localstripe):
    both = OperatorFactory(slug="zwicc", is_buyer=True)
    response = token_client(both).post(ORDERS, order_body(), format="json")
    assert response.status_code == 201


# --- Lists ------------------------------------------------------------------------------------------


def test_order_list_filters_by_status(buyer, buyer_api):
    paid = make_paid_pack(buyer=buyer, card_hours=10, price="80.00")
    PackOrder.objects.create(
        buyer=buyer,
        product=paid.order.product,
        card_hours=10,
        amount="80.00",
        validity_days=365,
        idempotency_key="pending-one",
    )

    everything = buyer_api.get(ORDERS).json()
    only_paid = buyer_api.get(ORDERS, {"status": "paid"}).json()

    assert everything["count"] == 2
    assert [o["id"] for o in only_paid["results"]] == [paid.order_id]
    assert only_paid["results"][0]["status"] == "paid" and only_paid["results"][0]["paid_at"]


def test_packs_show_remaining_card_hours_as_exact_decimals(buyer, buyer_api):
    std = make_paid_pack(buyer=buyer, card_hours=10, price="80.00", validity_days=30)
    a800 = make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="1000.00")

    results = buyer_api.get("/api/v1/packs").json()["results"]

    assert [p["id"] for p in results] == [std.pk, a800.pk]  # the pack that expires first comes first
    assert results[0] == {
        "id": std.pk,
        "order": std.order_id,
        "pack_class": "std",
        "accelerator": None,
        "card_hours": 10,
        "remaining_card_hours": "10.000000",
        "price": "80.00",
        "currency": "CNY",
        "status": "active",
        "starts_at": results[0]["starts_at"],
        "expires_at": results[0]["expires_at"],
        "closed_at": None,
    }
    assert results[1]["pack_class"] == A800 and results[1]["remaining_card_hours"] == "100.000000"
    assert buyer_api.get("/api/v1/packs", {"status": "refunded"}).json()["results"] == []


def test_buy_pay_and_see_the_pack_through_the_api(
    buyer, buyer_api, product, stripe_on_localstripe, stripe_webhooks
):
    created = buyer_api.post(ORDERS, order_body(), format="json").json()
    order = PackOrder.objects.get(pk=created["id"])
    pay(order)
    deliver(
        stripe_webhooks.wait_for(
            type="payment_intent.succeeded", payment_intent_id=order.stripe_payment_intent_id
        )
    )

    shown = buyer_api.get(f"{ORDERS}/{order.pk}").json()
    packs = buyer_api.get("/api/v1/packs").json()["results"]

    assert shown["status"] == "paid" and shown["pack"] == packs[0]["id"]
    assert packs[0]["remaining_card_hours"] == "100.000000"


# --- The webhook endpoint ---------------------------------------------------------------------------


def test_the_webhook_is_not_in_the_openapi_document_and_needs_no_credentials(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    assert "/api/v1/pack-orders" in schema
    assert "stripe/webhook" not in schema

    response = APIClient().post("/api/v1/stripe/webhook", b"{}", content_type="application/json")
    assert response.status_code == 400  # judged by its signature, not by a session or token
    assert response.json()["code"] == "stripe_signature_invalid"


def test_the_webhook_is_csrf_exempt(buyer):
    client = APIClient(enforce_csrf_checks=True)
    response = client.post(
        "/api/v1/stripe/webhook", b"{}", content_type="application/json", HTTP_STRIPE_SIGNATURE="t=1,v1=00"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "stripe_signature_invalid"
