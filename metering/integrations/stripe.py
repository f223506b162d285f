"""The one module that talks to Stripe (or to localstripe standing in for it).

Everything else in metering deals in ``Decimal`` CNY and the frozen dataclasses below; amounts become
Stripe's integer minor units (fen) here and nowhere else. A client is built per call from the settings
(``STRIPE_SECRET_KEY``, ``STRIPE_API_BASE``), so tests and the embedded demo can point the platform at a
localstripe server by changing settings alone, and no global ``stripe.api_key`` is ever set.

Transport and provider failures become ``PaymentProviderError`` (502). A card decline is not one: it is
the buyer's card, reported through the PaymentIntent's ``last_payment_error`` and the
``payment_intent.payment_failed`` webhook.

localstripe differs from Stripe in ways this module absorbs: it accepts only a subset of parameters (no
``description``, no ``automatic_payment_methods``), ignores idempotency keys, embeds ``latest_charge`` as
an object rather than an id, and never sends ``charge.refunded`` or ``payment_intent.created``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.translation import gettext as _
from stripe import (
    APIConnectionError,
    CardError,
    RequestsClient,
    SignatureVerificationError,
    StripeClient,
    StripeError,
    WebhookSignature,
)

from core.money import scaled_int
from metering.declines import decline_message
from metering.errors import PaymentProviderError, StripeSignatureError

logger = logging.getLogger(__name__)

MODE_LIVE = "live"
MODE_TEST = "test"
MODE_LOCALSTRIPE = "localstripe"

# Decimal places of each currency's minor unit, as Stripe counts them. Only CNY is sold on the platform.
_MINOR_UNIT_PLACES = {"CNY": 2}
_STRIPE_API_HOSTS = {"api.stripe.com"}
# Stripe signs each delivery with a timestamp; an older delivery is refused (Stripe's own default).
WEBHOOK_TOLERANCE_SECONDS = 300

# PaymentIntent statuses (Stripe's vocabulary).
PI_SUCCEEDED = "succeeded"
PI_CANCELED = "canceled"
PI_REQUIRES_PAYMENT_METHOD = "requires_payment_method"


# --- Mode and configuration -------------------------------------------------------------------------


def stripe_mode() -> str:
    """``localstripe`` when the API base is set to anything but Stripe's own host, else ``live`` for a
    live secret key and ``test`` for a test key. Pages and API answers label everything but ``live`` as
    test mode."""
    base = settings.STRIPE_API_BASE
    if base and urlsplit(base).hostname not in _STRIPE_API_HOSTS:
        return MODE_LOCALSTRIPE
    key = settings.STRIPE_SECRET_KEY
    return MODE_LIVE if key.startswith(("sk_live_", "rk_live_")) else MODE_TEST


@dataclass(frozen=True)
class StripePublicConfig:
    """What a browser needs to confirm a payment with Stripe.js."""

    publishable_key: str
    js_url: str
    mode: str  # "test" or "live": localstripe is test mode too
    localstripe: bool


def stripe_public_config() -> StripePublicConfig:
    mode = stripe_mode()
    return StripePublicConfig(
        publishable_key=settings.STRIPE_PUBLISHABLE_KEY,
        js_url=settings.STRIPE_JS_URL,
        mode=MODE_LIVE if mode == MODE_LIVE else MODE_TEST,
        localstripe=mode == MODE_LOCALSTRIPE,
    )


# --- Money ------------------------------------------------------------------------------------------


def amount_to_minor(*, amount: Decimal, currency: str) -> int:
    """``Decimal`` CNY as Stripe's integer fen. More decimals than the currency has is an error: amounts
    are quantised to the fen before they get here."""
    places = _minor_places(currency)
    return scaled_int(amount, places)


def amount_from_minor(*, minor: int, currency: str) -> Decimal:
    places = _minor_places(currency)
    return (Decimal(int(minor)) / (10**places)).quantize(Decimal(1).scaleb(-places))


def _minor_places(currency: str) -> int:
    try:
        return _MINOR_UNIT_PLACES[currency.upper()]
    except KeyError:
        raise ValueError(f"Currency {currency!r} is not sold on the platform.") from None


# --- Plain results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PaymentIntentInfo:
    id: str
    status: str
    amount: Decimal
    currency: str  # upper case, e.g. "CNY"
    client_secret: str
    livemode: bool
    customer_id: str
    latest_charge_id: str
    # When the charge that paid it was created, when Stripe told us (an expanded latest_charge).
    charged_at: datetime | None
    failure_code: str
    failure_message: str
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RefundInfo:
    id: str
    status: str  # succeeded, pending, requires_action, failed, canceled
    amount: Decimal
    currency: str
    payment_intent_id: str
    charge_id: str
    created_at: datetime | None
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WebhookEvent:
    """A verified webhook event. ``object`` is ``data.object`` as Stripe sent it (a snapshot at the time
    of the event, not the object's current state)."""

    id: str
    type: str
    livemode: bool
    created_at: datetime | None
    object_type: str
    object_id: str
    payload: Mapping[str, Any]
    object: Mapping[str, Any]
    # The PaymentIntent the event is about, where the object names it (PaymentIntent, charge, refund).
    payment_intent_id: str
    charge_id: str


# --- Calls ------------------------------------------------------------------------------------------


# The Stripe API version every request asks for, pinned here rather than taken from whatever the installed
# library defaults to: a library upgrade must not change the shape of what Stripe answers. It is the version
# stripe-python 16.1 (requirements.lock) was generated for; the webhook endpoint in Stripe's dashboard should
# be created with the same version, so events arrive in the shape parsed below. Change both together.
STRIPE_API_VERSION = "2026-10-28.endive"


def _client() -> StripeClient:
    key = settings.STRIPE_SECRET_KEY
    if not key:
        raise PaymentProviderError(_("Payments are not configured: STRIPE_SECRET_KEY is empty."))
    base = settings.STRIPE_API_BASE
    local = stripe_mode() == MODE_LOCALSTRIPE
    return StripeClient(
        key,
        stripe_version=STRIPE_API_VERSION,
        base_addresses={"api": base} if base else None,
        # localstripe ignores idempotency keys, so a retried POST there could create a second object.
        max_network_retries=0 if local else 2,
        http_client=RequestsClient(timeout=(5, 30)),
    )


def _provider_error(exc: StripeError, action: str) -> PaymentProviderError:
    """``action`` is a translated phrase ("create the payment"), completing "Stripe could not …"."""
    logger.warning("Stripe call failed (%s): %s", action, exc)
    # Stripe's user_message is written for end users (in English: Stripe answers the server, not the
    # buyer's browser); the raw text of a transport error names internal hosts and ports, so it stays in
    # the log only. A known decline code is said in the reader's language (decline_message).
    detail = (
        decline_message(code=str(exc.code or ""), stripe_message=exc.user_message)
        if exc.user_message
        else (_("Stripe is unreachable.") if isinstance(exc, APIConnectionError) else "")
    )
    message = _("Stripe could not %(action)s.") % {"action": action}
    return PaymentProviderError(
        f"{message} {detail}" if detail else message,
        extra={"stripe_code": exc.code or "", "http_status": exc.http_status},
    )


def customer_create(*, name: str, email: str, metadata: Mapping[str, str], idempotency_key: str) -> str:
    """Create a Stripe customer; returns its id."""
    params: dict[str, Any] = {"name": name, "metadata": dict(metadata)}
    if email:
        params["email"] = email
    try:
        customer = _client().v1.customers.create(params, {"idempotency_key": idempotency_key})  # type: ignore[arg-type]
    except StripeError as exc:
        raise _provider_error(exc, _("create the customer")) from exc
    return str(customer.id)


def payment_intent_create(
    *,
    amount: Decimal,
    currency: str,
    customer_id: str,
    metadata: Mapping[str, str],
    idempotency_key: str,
) -> PaymentIntentInfo:
    """Create a card PaymentIntent for ``amount`` (the browser confirms it with Stripe.js). The same
    ``idempotency_key`` returns the same PaymentIntent on Stripe (within its 24-hour key window)."""
    params: dict[str, Any] = {
        "amount": amount_to_minor(amount=amount, currency=currency),
        "currency": currency.lower(),
        "payment_method_types": ["card"],
        "metadata": dict(metadata),
    }
    if customer_id:
        params["customer"] = customer_id
    try:
        intent = _client().v1.payment_intents.create(params, {"idempotency_key": idempotency_key})  # type: ignore[arg-type]
    except StripeError as exc:
        raise _provider_error(exc, _("create the payment")) from exc
    return payment_intent_from_object(intent.to_dict())


def payment_intent_retrieve(*, payment_intent_id: str) -> PaymentIntentInfo:
    """The PaymentIntent's current state, with its latest charge expanded."""
    try:
        intent = _client().v1.payment_intents.retrieve(payment_intent_id, {"expand": ["latest_charge"]})
    except StripeError as exc:
        raise _provider_error(exc, _("read payment %(id)s") % {"id": payment_intent_id}) from exc
    return payment_intent_from_object(intent.to_dict())


def payment_intent_confirm_test(*, payment_intent_id: str, payment_method: str) -> PaymentIntentInfo:
    """Confirm a PaymentIntent server-side with a Stripe test payment method (``pm_card_visa``,
    ``pm_card_chargeCustomerFail``...). Test mode only: it is how the embedded demo and the tests pay,
    since localstripe's Stripe.js cannot confirm a card payment. A decline is not an error here: the
    returned PaymentIntent carries it."""
    if stripe_mode() == MODE_LIVE:
        raise PaymentProviderError(_("Test payment methods cannot be used with live Stripe keys."))
    client = _client()
    try:
        # localstripe refuses `payment_method` on /confirm, so set it first, then confirm.
        client.v1.payment_intents.update(payment_intent_id, {"payment_method": payment_method})
        client.v1.payment_intents.confirm(payment_intent_id)
    except CardError:
        pass  # declined: the PaymentIntent records it, and Stripe sends payment_intent.payment_failed
    except StripeError as exc:
        raise _provider_error(exc, _("confirm payment %(id)s") % {"id": payment_intent_id}) from exc
    return payment_intent_retrieve(payment_intent_id=payment_intent_id)


def refund_create(
    *,
    payment_intent_id: str,
    amount: Decimal,
    currency: str,
    metadata: Mapping[str, str],
    idempotency_key: str,
) -> RefundInfo:
    """Refund ``amount`` of a PaymentIntent's charge."""
    params: dict[str, Any] = {
        "payment_intent": payment_intent_id,
        "amount": amount_to_minor(amount=amount, currency=currency),
        "metadata": dict(metadata),
    }
    try:
        refund = _client().v1.refunds.create(params, {"idempotency_key": idempotency_key})  # type: ignore[arg-type]
    except StripeError as exc:
        raise _provider_error(exc, _("refund payment %(id)s") % {"id": payment_intent_id}) from exc
    return refund_from_object(refund.to_dict(), payment_intent_id=payment_intent_id)


def refund_list(*, payment_intent_id: str) -> tuple[RefundInfo, ...]:
    """Every refund of a PaymentIntent (up to 100: a pack is refunded once or a few times)."""
    try:
        page = _client().v1.refunds.list({"payment_intent": payment_intent_id, "limit": 100})
    except StripeError as exc:
        raise _provider_error(
            exc, _("list the refunds of payment %(id)s") % {"id": payment_intent_id}
        ) from exc
    return tuple(
        refund_from_object(item.to_dict(), payment_intent_id=payment_intent_id) for item in page.data
    )


def charge_payment_intent_id(*, charge_id: str) -> str:
    """The PaymentIntent a charge belongs to ("" if none)."""
    try:
        charge = _client().v1.charges.retrieve(charge_id)
    except StripeError as exc:
        raise _provider_error(exc, _("read charge %(id)s") % {"id": charge_id}) from exc
    return _id_of(charge.to_dict().get("payment_intent"))


# --- Webhooks ---------------------------------------------------------------------------------------


def webhook_event_construct(*, payload: bytes, signature: str) -> WebhookEvent:
    """Verify a webhook delivery's ``Stripe-Signature`` against ``STRIPE_WEBHOOK_SECRET`` and parse it.

    Raises StripeSignatureError (400) for a missing or wrong signature, a stale timestamp, a missing
    secret, or a body that is not a Stripe event: nothing about such a request can be trusted."""
    secret = settings.STRIPE_WEBHOOK_SECRET
    if not secret:
        raise StripeSignatureError(_("Webhooks are not configured: STRIPE_WEBHOOK_SECRET is empty."))
    try:
        text = payload.decode("utf-8")
        WebhookSignature.verify_header(text, signature, secret, WEBHOOK_TOLERANCE_SECONDS)
    except (UnicodeDecodeError, SignatureVerificationError) as exc:
        raise StripeSignatureError(_("The Stripe-Signature header does not match the payload.")) from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StripeSignatureError(_("The payload is signed but is not JSON.")) from exc
    return webhook_event_parse(data=data)


def webhook_event_parse(*, data: Any) -> WebhookEvent:
    """An event from its JSON (a verified delivery, or one stored earlier). Raises StripeSignatureError
    when it does not have an event's shape."""
    try:
        obj = data["data"]["object"]
        event_id, event_type = str(data["id"]), str(data["type"])
        if not isinstance(obj, dict) or not event_id or not event_type:
            raise ValueError("not an event")
    except (ValueError, KeyError, TypeError) as exc:
        raise StripeSignatureError(_("The payload is signed but is not a Stripe event.")) from exc

    object_type = str(obj.get("object") or "")
    object_id = str(obj.get("id") or "")
    if object_type == "payment_intent":
        payment_intent_id, charge_id = object_id, _id_of(obj.get("latest_charge"))
    elif object_type == "charge":
        payment_intent_id, charge_id = _id_of(obj.get("payment_intent")), object_id
    elif object_type == "refund":
        payment_intent_id, charge_id = _id_of(obj.get("payment_intent")), _id_of(obj.get("charge"))
    else:
        payment_intent_id, charge_id = "", ""
    return WebhookEvent(
        id=event_id,
        type=event_type,
        livemode=bool(data.get("livemode", False)),
        created_at=_timestamp(data.get("created")),
        object_type=object_type,
        object_id=object_id,
        payload=data,
        object=obj,
        payment_intent_id=payment_intent_id,
        charge_id=charge_id,
    )


# --- Parsing Stripe objects -------------------------------------------------------------------------


def payment_intent_from_object(obj: Mapping[str, Any]) -> PaymentIntentInfo:
    """A PaymentIntent as Stripe (or localstripe) serialises it, e.g. an event's ``data.object``."""
    currency = str(obj.get("currency") or "").upper()
    charge = obj.get("latest_charge")
    error = obj.get("last_payment_error") or {}
    return PaymentIntentInfo(
        id=str(obj["id"]),
        status=str(obj.get("status") or ""),
        amount=amount_from_minor(minor=int(obj["amount"]), currency=currency),
        currency=currency,
        client_secret=str(obj.get("client_secret") or ""),
        livemode=bool(obj.get("livemode", False)),
        customer_id=_id_of(obj.get("customer")),
        latest_charge_id=_id_of(charge),
        charged_at=_timestamp(charge.get("created")) if isinstance(charge, dict) else None,
        failure_code=str(error.get("decline_code") or error.get("code") or "")[:64],
        failure_message=str(error.get("message") or "")[:500],
        metadata={str(k): str(v) for k, v in (obj.get("metadata") or {}).items()},
    )


def refund_from_object(obj: Mapping[str, Any], *, payment_intent_id: str = "") -> RefundInfo:
    currency = str(obj.get("currency") or "").upper()
    return RefundInfo(
        id=str(obj["id"]),
        status=str(obj.get("status") or ""),
        amount=amount_from_minor(minor=int(obj["amount"]), currency=currency),
        currency=currency,
        payment_intent_id=_id_of(obj.get("payment_intent")) or payment_intent_id,
        charge_id=_id_of(obj.get("charge")),
        created_at=_timestamp(obj.get("created")),
        metadata={str(k): str(v) for k, v in (obj.get("metadata") or {}).items()},
    )


def _id_of(value: Any) -> str:
    """An id field that Stripe sends as a string, or as the object itself when expanded (localstripe
    always embeds ``latest_charge``)."""
    if isinstance(value, dict):
        return str(value.get("id") or "")
    return str(value or "")


def _timestamp(value: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(value), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
