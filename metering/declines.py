"""A card decline in the reader's language.

Stripe writes ``last_payment_error.message`` in English (it answers the platform's server, not the buyer's
browser) and it is stored on the order as received. What a buyer reads is chosen when the page is drawn:
the decline code's sentence from our catalogue (Stripe's own English wording as the msgid, so an English
page reads exactly what Stripe said), or Stripe's message as it came for a code we do not know.
"""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

# Stripe's decline and card-error codes (docs.stripe.com/declines/codes) with the English sentence Stripe's
# API gives for each ("Your card was declined." checked against localstripe; the others as Stripe words
# them in its error-code documentation). Any code missing here shows Stripe's message unchanged.
_DECLINES = {
    "card_declined": _("Your card was declined."),
    "generic_decline": _("Your card was declined."),
    "do_not_honor": _("Your card was declined."),
    "insufficient_funds": _("Your card has insufficient funds."),
    "lost_card": _("Your card was declined."),
    "stolen_card": _("Your card was declined."),
    "fraudulent": _("Your card was declined."),
    "expired_card": _("Your card has expired."),
    "incorrect_cvc": _("Your card's security code is incorrect."),
    "invalid_cvc": _("Your card's security code is invalid."),
    "incorrect_number": _("Your card number is incorrect."),
    "invalid_number": _("Your card number is invalid."),
    "invalid_expiry_month": _("Your card's expiration month is invalid."),
    "invalid_expiry_year": _("Your card's expiration year is invalid."),
    "processing_error": _("An error occurred while processing your card. Try again in a little bit."),
    "card_velocity_exceeded": _("Your card was declined for making repeated attempts too frequently."),
    "authentication_required": _("Your card was declined. This transaction requires authentication."),
    "card_not_supported": _("Your card does not support this type of purchase."),
    "currency_not_supported": _("Your card does not support this currency."),
}


def decline_message(*, code: str, stripe_message: str) -> str:
    """What to show for a decline: ours for a known code, else Stripe's message ("" when there is none)."""
    known = _DECLINES.get(code)
    if known is None:
        return stripe_message
    return str(known)  # a lazy string: rendered in the active language
