"""Metering's closed set of failures. Codes are public API: never rename one.

Helpers append new classes at the end of this file (one ``cat >>`` each) so parallel edits do not clash.
"""

from core.errors import ConflictError, DomainError, InvalidInputError, NotFoundError, PermissionDeniedError


class TariffInvalidError(InvalidInputError):
    """A schedule with a gap, an overlap, an unknown band or zone; ``extra`` names each fault."""

    code = "tariff_invalid"


class TariffNotFoundError(NotFoundError):
    code = "tariff_not_found"


class PriceCardNotFoundError(NotFoundError):
    code = "price_card_not_found"


class PriceCardInvalidError(InvalidInputError):
    code = "price_card_invalid"


class UsageBatchTooLargeError(InvalidInputError):
    code = "usage_batch_too_large"


class UsageConflictError(ConflictError):
    """The idempotency key was used before with a different body."""

    code = "usage_conflict"


class PackProductNotFoundError(NotFoundError):
    code = "pack_product_not_found"


class PackOrderNotFoundError(NotFoundError):
    code = "pack_order_not_found"


class PaymentProviderError(DomainError):
    """Stripe could not be reached or refused the call for a reason that is not the buyer's input."""

    code = "payment_provider_error"
    http_status = 502


class StripeSignatureError(InvalidInputError):
    code = "stripe_signature_invalid"


class LedgerUnbalancedError(DomainError):
    """A posting whose entries do not sum to zero per unit: a programming error, never user input."""

    code = "ledger_unbalanced"
    http_status = 500


class InsufficientBalanceError(DomainError):
    code = "insufficient_balance"
    http_status = 402


class InvoiceNotFoundError(NotFoundError):
    code = "invoice_not_found"


class SettlementNotFoundError(NotFoundError):
    code = "settlement_not_found"


class NotABuyerError(PermissionDeniedError):
    code = "not_a_buyer"


class UsageBatchInvalidError(InvalidInputError):
    """At least one record of a usage batch breaks a rule; ``extra.errors`` lists each by index with its
    own code (end_not_after_start, cards_not_positive, unknown_cluster, cluster_not_yours, ...). Nothing
    of the batch is written."""

    code = "usage_batch_invalid"


class TariffCodeTakenError(ConflictError):
    """The organisation (or the platform, for presets) already has a tariff with this code."""

    code = "tariff_code_taken"


class TariffReadOnlyError(PermissionDeniedError):
    """A preset (platform tariff) changed by an operator: presets change only by the platform."""

    code = "tariff_read_only"


class BillingPeriodInvalidError(InvalidInputError):
    """A billing period must start on the first day of a month (in the billing time zone)."""

    code = "billing_period_invalid"


class BillingPeriodOpenError(ConflictError):
    """A month cannot be closed before it has ended in the billing time zone."""

    code = "billing_period_open"


class UnknownPackProductError(InvalidInputError):
    """The order names a product that is not in the catalogue (or no longer on sale)."""

    code = "unknown_pack_product"


class PackOrderConflictError(ConflictError):
    """The order's idempotency key was used before with a different product or quantity."""

    code = "pack_order_conflict"


class PackNotRefundableError(ConflictError):
    """The pack has nothing left to refund, or was not paid through Stripe."""

    code = "pack_not_refundable"


class LiveModeTestPaymentError(PermissionDeniedError):
    """Test payment methods are refused when the platform runs on live Stripe keys."""

    code = "test_payment_not_allowed"


class StripePaymentMismatchError(DomainError):
    """A Stripe payment that does not match its order (amount, currency, or no such order)."""

    code = "stripe_payment_mismatch"
    http_status = 500


class StripeEventFailedError(DomainError):
    """A verified webhook event could not be processed; it is stored as failed, and the 500 makes Stripe
    deliver it again."""

    code = "stripe_event_failed"
    http_status = 500


class SlaCreditDisputeDecidedError(ConflictError):
    code = "sla_credit_dispute_decided"


class SlaCreditNotFoundError(NotFoundError):
    code = "sla_credit_not_found"


class PartitionNotRetainableError(ConflictError):
    """A month of usage history that cannot be detached yet (inside the late window, pending rating, or
    not on issued statements), or is not a partition at all."""

    code = "partition_not_retainable"
