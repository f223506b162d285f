"""Forms of the pack pages: the catalogue's buy form and the test-mode card form of the checkout page."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django import forms
from django.utils.functional import lazy
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.errors import DomainError
from metering.models import PackProduct
from metering.services.payments import MAX_ORDER_QUANTITY

# Stripe's test cards the test-mode checkout accepts, and the test payment method each one pays with.
# The decline is Stripe's "charge declined" test method: localstripe declines 4000 0000 0000 0002 only
# when a card is attached to a customer, not when a payment is confirmed, so the same card number is
# paid with the payment method localstripe (and Stripe) declines at the charge.
TEST_CARDS: dict[str, str] = {
    "4242424242424242": "pm_card_visa",
    "4000000000000002": "pm_card_chargeCustomerFail",
}


def new_idempotency_key() -> str:
    """A key for one rendering of the buy form: submitting that form twice makes one order."""
    return f"portal-{uuid.uuid4().hex}"


def form_apply_domain_error(
    form: forms.Form, error: DomainError, *, default_field: str | None = None
) -> None:
    """Put a domain error's field faults (``extra["fields"]``) beside the form's fields; the message
    itself goes on ``default_field`` (or the whole form) when it names no field of the form."""
    fields = error.extra.get("fields") if isinstance(error.extra.get("fields"), dict) else {}
    placed = False
    for name, messages in (fields or {}).items():
        if name in form.fields:
            for message in messages if isinstance(messages, list | tuple) else [messages]:
                form.add_error(name, str(message))
            placed = True
    if not placed:
        form.add_error(default_field if default_field in form.fields else None, error.message)


class PackBuyForm(forms.Form):
    """Which pack, how many. The hidden idempotency key is fixed when the form is rendered, so a double
    submit (or a reload of the POST) returns the order the first submit made."""

    product = forms.ChoiceField(
        label=_("Pack"),
        widget=forms.RadioSelect,
        error_messages={"invalid_choice": _("This pack is not on sale.")},
    )
    quantity = forms.IntegerField(
        label=_("Quantity"),
        min_value=1,
        max_value=MAX_ORDER_QUANTITY,
        initial=1,
        # Interpolated when shown: a lazy string's % evaluates at once, here at import, in English.
        help_text=lazy(
            lambda: gettext("Up to %(max)d packs in one order.") % {"max": MAX_ORDER_QUANTITY}, str
        )(),
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=200)

    def __init__(self, *args: Any, products: Sequence[PackProduct], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.products = {product.code: product for product in products}
        product_field = self.fields["product"]
        assert isinstance(product_field, forms.ChoiceField)
        product_field.choices = [(product.code, product.name) for product in products]
        if not self.is_bound:
            self.initial.setdefault("idempotency_key", new_idempotency_key())
            if products:
                self.initial.setdefault("product", products[0].code)

    def clean_product(self) -> PackProduct:
        return self.products[self.cleaned_data["product"]]


class TestCardForm(forms.Form):
    """The test-mode checkout's card: a Stripe test card number, paid with Stripe's matching test
    payment method server-side. Never shown, and refused, with live Stripe keys."""

    card_number = forms.CharField(
        label=_("Test card number"),
        max_length=32,
        help_text=_("4242 4242 4242 4242 is paid; 4000 0000 0000 0002 is declined."),
        widget=forms.TextInput(attrs={"inputmode": "numeric", "autocomplete": "off", "spellcheck": "false"}),
    )

    def clean_card_number(self) -> str:
        number = "".join(self.cleaned_data["card_number"].split()).replace("-", "")
        payment_method = TEST_CARDS.get(number)
        if payment_method is None:
            raise forms.ValidationError(
                _("Test mode takes only Stripe's test cards: 4242 4242 4242 4242 or 4000 0000 0000 0002."),
                code="not_a_test_card",
            )
        return payment_method
