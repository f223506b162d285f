"""Portal pages for buying card-hour packs: balances, packs and orders; the catalogue; the checkout.

Paying mirrors the REST flow (metering.api.payments): the buy form creates the order through
``pack_order_create`` (idempotent on a key fixed when the form is rendered) and the checkout page pays
its PaymentIntent. The pack is credited only when Stripe's webhook confirms the payment; until then the
page shows a pending state that polls ``pack-order-status``.

Two ways to pay, chosen by the Stripe configuration, never by the buyer:

* **Stripe Elements** (live keys, or Stripe's own test mode): Stripe.js from ``STRIPE_JS_URL`` mounts a
  card Element and ``stripe.confirmCardPayment`` pays in the browser (static/portal/checkout.js). A
  declined card leaves the PaymentIntent waiting for another card, so the same page takes the next one.
* **Test mode on localstripe** (``make run``'s stand-in for Stripe): localstripe's Stripe.js cannot
  confirm a PaymentIntent, so the page shows a form labelled "Test mode" that takes one of Stripe's test
  card numbers and pays with the matching test payment method server-side
  (``pack_order_confirm_test_payment``, which refuses live keys). localstripe cannot retry a declined
  PaymentIntent, so after a decline the buyer tries another card on a fresh order.

Either way the page is drawn from the server's state (the order, and the PaymentIntent as Stripe reports
it), so a reload mid-way shows where the payment is.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import URLPattern, path
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from core.errors import InvalidInputError
from core.money import from_micros
from core.portal import portal_view
from federation.models import Accelerator
from metering.declines import decline_message
from metering.errors import (
    PackOrderConflictError,
    PaymentProviderError,
    UnknownPackProductError,
)
from metering.forms.packs import PackBuyForm, TestCardForm, form_apply_domain_error, new_idempotency_key
from metering.integrations.stripe import PaymentIntentInfo, StripePublicConfig
from metering.models import PackOrder, PackProduct
from metering.selectors import payments as selectors
from metering.services import payments as services

PAGE_SIZE = 50
CENT = Decimal("0.01")

# PaymentIntent statuses (Stripe's vocabulary) once the buyer's card has been taken: the money is
# Stripe's to confirm, and the page waits for the webhook.
_TAKEN = frozenset({"succeeded", "processing", "requires_capture"})

# Checkout steps (what the page shows).
STEP_PAY = "pay"  # a card form (Elements, or the test-mode card form)
STEP_DECLINED = "declined"  # test mode: the card was declined, try another card on a new order
STEP_WAITING = "waiting"  # paid in Stripe, waiting for the webhook
STEP_DONE = "done"  # the pack is credited
STEP_CLOSED = "closed"  # canceled or refunded
STEP_UNOPENED = "unopened"  # the order has no PaymentIntent yet (Stripe was down when it was made)
STEP_UNAVAILABLE = "unavailable"  # Stripe cannot be reached to read the payment


@dataclass(frozen=True)
class Checkout:
    step: str
    decline_message: str = ""
    client_secret: str = ""
    provider_error: str = ""


def _class_names(slugs: set[str]) -> dict[str, str]:
    """Display names of chips by slug, in one query."""
    return {
        slug: f"{vendor} {model}"
        for slug, vendor, model in Accelerator.objects.filter(slug__in=slugs).values_list(
            "slug", "vendor", "model"
        )
    }


def _product_class_name(product: PackProduct) -> str:
    """What a pack's card-hours are for: a chip, or standard cards."""
    chip = product.accelerator
    return f"{chip.vendor} {chip.model}" if chip is not None else _("Standard cards")


def _page(request: HttpRequest, items: Any, parameter: str) -> Page:
    return Paginator(items, PAGE_SIZE).get_page(request.GET.get(parameter))


def _pack_list_context(request: HttpRequest, *, form: PackBuyForm) -> dict[str, Any]:
    buyer = request.portal.organisation  # type: ignore[attr-defined]
    balances = selectors.buyer_balance_summary(buyer=buyer)
    names = _class_names({b.accelerator for b in balances if b.accelerator})
    packs = _page(request, selectors.pack_list_for(buyer=buyer), "page")
    packs.object_list = list(packs.object_list)
    for pack in packs.object_list:
        pack.remaining_card_hours = from_micros(int(pack.remaining_micros))
        # What one card-hour of the pack's unit cost (standard card-hours for a standard pack).
        pack.price_per_card_hour = (pack.price / pack.card_hours).quantize(CENT)
    return {
        "balances": [(balance, names.get(balance.accelerator or "", "")) for balance in balances],
        "packs": packs,
        "orders": _page(request, selectors.pack_order_list_for(buyer=buyer), "orders"),
        "form": form,
        "catalogue": [
            (product, _product_class_name(product), (product.price / product.card_hours).quantize(CENT))
            for product in form.products.values()
        ],
        "payment_config": services.payment_public_config(),
    }


@require_GET
@portal_view("buyer")
def pack_list(request: HttpRequest) -> HttpResponse:
    """Balances per class, every pack, every order, and the catalogue to buy from."""
    form = PackBuyForm(products=list(selectors.pack_product_list()))
    return render(request, "metering/packs/list.html", _pack_list_context(request, form=form))


@require_POST
@portal_view("buyer", write=True)
def pack_buy(request: HttpRequest) -> HttpResponse:
    """Order packs from the catalogue form, then go to the order's checkout. Bad input re-renders the
    packs page with the errors beside the fields and orders nothing."""
    actor = request.portal  # type: ignore[attr-defined]
    products = list(selectors.pack_product_list())
    form = PackBuyForm(request.POST, products=products)
    if form.is_valid():
        try:
            payment = services.pack_order_create(
                buyer=actor.organisation,
                product=form.cleaned_data["product"],
                quantity=form.cleaned_data["quantity"],
                idempotency_key=form.cleaned_data["idempotency_key"],
                actor=actor.actor,
            )
        except UnknownPackProductError as exc:
            form_apply_domain_error(form, exc, default_field="product")
        except PackOrderConflictError:
            # The form was submitted before with another pack or quantity (the back button): its key
            # belongs to that order. A fresh key lets this choice be ordered.
            form.add_error(
                None,
                _(
                    "This form was already used for another order. Check the pack and the quantity, "
                    "then buy again."
                ),
            )
            data = request.POST.copy()
            data["idempotency_key"] = new_idempotency_key()
            form = _rebound(form, data, products)
        except InvalidInputError as exc:
            form_apply_domain_error(form, exc, default_field="quantity")
        except PaymentProviderError as exc:
            # The order may exist without its payment: the same key (kept in the form) completes it.
            form.add_error(
                None,
                _("Stripe could not be reached, so the payment was not opened: %(error)s")
                % {"error": exc.message},
            )
        else:
            return redirect("pack-order", order_id=payment.order.pk)
    return render(request, "metering/packs/list.html", _pack_list_context(request, form=form))


def _rebound(form: PackBuyForm, data: Any, products: list[PackProduct]) -> PackBuyForm:
    """The same submission under a new key, keeping the errors already found."""
    fresh = PackBuyForm(data, products=products)
    fresh.is_valid()
    for field, errors in form.errors.items():
        for error in errors:
            if error not in fresh.errors.get(field, []):
                fresh.add_error(None if field == "__all__" else field, error)
    return fresh


def _checkout(order: PackOrder, config: StripePublicConfig) -> Checkout:
    """Where the order's payment is, from the order and the PaymentIntent as Stripe reports it now."""
    if order.status == PackOrder.Status.PAID:
        return Checkout(STEP_DONE)
    if order.status in (PackOrder.Status.CANCELED, PackOrder.Status.REFUNDED):
        return Checkout(STEP_CLOSED)
    try:
        intent: PaymentIntentInfo | None = selectors.pack_order_payment_intent(order=order)
    except PaymentProviderError as exc:
        return Checkout(STEP_UNAVAILABLE, provider_error=exc.message)
    if intent is None:
        return Checkout(STEP_UNOPENED)
    if intent.status in _TAKEN:
        return Checkout(STEP_WAITING)
    if intent.status == "canceled":
        return Checkout(STEP_CLOSED)
    declined = bool(intent.failure_message or order.failure_message)
    decline = (
        decline_message(code=intent.failure_code, stripe_message=intent.failure_message)
        if intent.failure_message
        else order.failure_text
    )
    if config.localstripe and (declined or order.status == PackOrder.Status.FAILED):
        return Checkout(STEP_DECLINED, decline_message=decline or _("The payment failed."))
    return Checkout(STEP_PAY, decline_message=decline, client_secret=intent.client_secret)


def order_status_shown(order: PackOrder, checkout: Checkout) -> str:
    """The status the order's badge shows. Stripe reports a decline on the PaymentIntent at once, and the
    ``payment_failed`` webhook that marks the order failed follows; a page drawn in between would say
    "Awaiting payment" above "Your card was not charged", and keep saying it while the packs list (read
    after the webhook) says "Payment failed". So a decline the checkout shows is the badge's status too;
    a new card on Stripe's own form moves it on (the polled fragment carries the order's status)."""
    if order.status == PackOrder.Status.PENDING and (
        checkout.step == STEP_DECLINED or (checkout.step == STEP_PAY and checkout.decline_message)
    ):
        return PackOrder.Status.FAILED
    return order.status


def _order_context(request: HttpRequest, order: PackOrder, **extra: Any) -> dict[str, Any]:
    config = services.payment_public_config()
    checkout = _checkout(order, config)
    pack = getattr(order, "pack", None)
    status = order_status_shown(order, checkout)
    return {
        "order": order,
        "status": status,
        "status_label": PackOrder.Status(status).label,
        "pack": pack,
        "checkout": checkout,
        "payment_config": config,
        # Stripe.js only where it can pay: localstripe's stand-in cannot confirm a PaymentIntent.
        "use_elements": checkout.step == STEP_PAY and not config.localstripe,
        "test_form": extra.pop("test_form", None) or TestCardForm(),
        "retry_key": new_idempotency_key(),
        **extra,
    }


@require_GET
@portal_view("buyer")
def pack_order(request: HttpRequest, order_id: int) -> HttpResponse:
    """The checkout page of one of the buyer's orders."""
    order = selectors.pack_order_get_for(buyer=request.portal.organisation, order_id=order_id)  # type: ignore[attr-defined]
    return render(request, "metering/packs/order.html", _order_context(request, order))


@require_GET
@portal_view("buyer")
def pack_order_status(request: HttpRequest, order_id: int) -> HttpResponse:
    """The checkout's pending state as a fragment, polled until the webhook has credited the pack (or
    failed the order). Reads the database only: no call to Stripe per poll."""
    order = selectors.pack_order_get_for(buyer=request.portal.organisation, order_id=order_id)  # type: ignore[attr-defined]
    # Waiting while the order is unpaid; a failed order too when the browser saw Stripe take the payment
    # (``confirmed``): the buyer retried after a decline, and the success event is on its way.
    waiting = order.status == PackOrder.Status.PENDING or (
        order.status == PackOrder.Status.FAILED and request.GET.get("confirmed") == "1"
    )
    context = {"order": order, "pack": getattr(order, "pack", None), "waiting": waiting}
    return render(request, "metering/packs/_status.html", context)


@require_POST
@portal_view("buyer", write=True)
def pack_order_test_payment(request: HttpRequest, order_id: int) -> HttpResponse:
    """Test mode on localstripe only: pay the order with the Stripe test card the buyer typed. The pack
    is still credited by the webhook; this only confirms the PaymentIntent, as Stripe.js would."""
    actor = request.portal  # type: ignore[attr-defined]
    order = selectors.pack_order_get_for(buyer=actor.organisation, order_id=order_id)
    config = services.payment_public_config()
    if not config.localstripe or config.mode == "live":
        messages.error(request, _("Test cards are taken only in test mode; pay with the card form."))
        return redirect("pack-order", order_id=order.pk)
    form = TestCardForm(request.POST)
    if not form.is_valid():
        context = _order_context(request, order, test_form=form)
        return render(request, "metering/packs/order.html", context)
    try:
        services.pack_order_confirm_test_payment(order=order, payment_method=form.cleaned_data["card_number"])
    except InvalidInputError:
        messages.info(request, _("This order is no longer waiting for a payment."))
    except PaymentProviderError as exc:
        messages.error(request, exc.message)
    # Success, decline or not: the checkout page shows the PaymentIntent's state.
    return redirect("pack-order", order_id=order.pk)


urlpatterns: list[URLPattern] = [
    path("packs/", pack_list, name="pack-list"),
    path("packs/buy/", pack_buy, name="pack-buy"),
    path("packs/orders/<int:order_id>/", pack_order, name="pack-order"),
    path("packs/orders/<int:order_id>/status/", pack_order_status, name="pack-order-status"),
    path(
        "packs/orders/<int:order_id>/test-payment/", pack_order_test_payment, name="pack-order-test-payment"
    ),
]
