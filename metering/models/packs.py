"""Buyers' billing profiles, the card-hour pack catalogue, orders paid through Stripe, packs, Stripe events."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from core.models import Organisation
from federation.models import Accelerator
from metering.declines import decline_message
from metering.tax import validate_uscc

STANDARD_CLASS = "std"


def pack_class_key(accelerator_slug: str | None) -> str:
    """The class of a pack as it names ledger units: ``std`` for standard cards, else the chip's slug."""
    return STANDARD_CLASS if accelerator_slug is None else accelerator_slug


class BillingProfile(models.Model):
    """What a buyer organisation needs to be billed: invoice details, its tax profile for fapiao (统一社会信用代码,
    invoice title, the e-mail the fapiao goes to) and its Stripe customer. Statements copy these at issue
    (metering.services.statements); editing the profile never changes an issued statement."""

    organisation = models.OneToOneField(
        Organisation, on_delete=models.PROTECT, related_name="billing_profile"
    )
    currency = models.CharField(max_length=3, default="CNY")
    legal_name = models.CharField(max_length=200, blank=True)
    tax_id = models.CharField(_("tax id"), max_length=64, blank=True)
    address = models.TextField(blank=True)
    billing_email = models.EmailField(blank=True)
    unified_social_credit_code = models.CharField(
        _("unified social credit code"),
        max_length=18,
        blank=True,
        validators=[validate_uscc],
        help_text=_("统一社会信用代码: 18 characters, checked against GB 32100-2015."),
    )
    invoice_title = models.CharField(
        max_length=200, blank=True, help_text=_("发票抬头: the buyer's name as the fapiao must print it.")
    )
    fapiao_email = models.EmailField(blank=True, help_text=_("Where the issuing system sends the e-fapiao."))
    stripe_customer_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(currency="CNY"), name="billing_profile_currency_cny"),
            models.UniqueConstraint(
                fields=["stripe_customer_id"],
                condition=~Q(stripe_customer_id=""),
                name="billing_profile_unique_stripe_customer",
            ),
        ]

    def __str__(self) -> str:
        return f"billing profile of {self.organisation}"


class PackProduct(models.Model):
    """A pack in the platform's catalogue: card-hours of one chip model (or standard cards), a price, a
    validity. Managed in the admin; an order copies its figures, so editing a product never changes a sold
    pack."""

    code = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    accelerator = models.ForeignKey(
        Accelerator,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="pack_products",
        help_text=_("Empty for standard cards, usable on any chip at its standard-card factor."),
    )
    card_hours = models.PositiveIntegerField()
    price = models.DecimalField(max_digits=14, decimal_places=2, help_text=_("CNY, tax included."))
    currency = models.CharField(max_length=3, default="CNY")
    validity_days = models.PositiveIntegerField(default=365)
    active = models.BooleanField(default=True)
    sort_order = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["sort_order", "code"]
        constraints = [
            models.CheckConstraint(condition=Q(card_hours__gt=0), name="pack_product_card_hours_positive"),
            models.CheckConstraint(condition=Q(price__gt=0), name="pack_product_price_positive"),
            models.CheckConstraint(condition=Q(validity_days__gt=0), name="pack_product_validity_positive"),
            models.CheckConstraint(condition=Q(currency="CNY"), name="pack_product_currency_cny"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.card_hours} card-hours, {self.price} CNY)"


class PackOrder(models.Model):
    """A buyer's order for ``quantity`` packs of a product, paid by one Stripe PaymentIntent.

    The pack is credited only when Stripe's webhook reports the PaymentIntent succeeded.
    """

    class Status(models.TextChoices):
        PENDING = "pending", _("Awaiting payment")
        PAID = "paid", _("Paid")
        FAILED = "failed", _("Payment failed")
        CANCELED = "canceled", _("Canceled")
        REFUNDED = "refunded", _("Refunded")

    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="pack_orders")
    product = models.ForeignKey(PackProduct, on_delete=models.PROTECT, related_name="orders")
    quantity = models.PositiveSmallIntegerField(default=1)
    accelerator = models.ForeignKey(
        Accelerator, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    card_hours = models.PositiveIntegerField()
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3, default="CNY")
    validity_days = models.PositiveIntegerField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    idempotency_key = models.CharField(max_length=200)
    stripe_payment_intent_id = models.CharField(max_length=64, blank=True)
    livemode = models.BooleanField(default=False)
    failure_code = models.CharField(max_length=64, blank=True)
    failure_message = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["buyer", "idempotency_key"], name="pack_order_unique_key"),
            models.UniqueConstraint(
                fields=["stripe_payment_intent_id"],
                condition=~Q(stripe_payment_intent_id=""),
                name="pack_order_unique_payment_intent",
            ),
            models.CheckConstraint(condition=Q(quantity__gte=1), name="pack_order_quantity_positive"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="pack_order_amount_positive"),
        ]
        indexes = [models.Index(fields=["buyer", "status"], name="pack_order_buyer_status")]

    def __str__(self) -> str:
        return f"order {self.pk} of {self.buyer}: {self.card_hours} card-hours, {self.amount} CNY"

    @property
    def failure_text(self) -> str:
        """The stored decline as the reader's language says it (metering.declines); "" if none."""
        if not self.failure_message:
            return ""
        return decline_message(code=self.failure_code, stripe_message=self.failure_message)


class Pack(models.Model):
    """Prepaid card-hours a buyer holds. The balance lives in the pack's ledger account (non-negative);
    ``card_hours`` is what was credited. Consumption draws the usable pack that expires first."""

    class Status(models.TextChoices):
        ACTIVE = "active", _("Active")
        EXHAUSTED = "exhausted", _("Used up")
        EXPIRED = "expired", _("Expired")
        REFUNDED = "refunded", _("Refunded")

    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="packs")
    order = models.OneToOneField(PackOrder, on_delete=models.PROTECT, related_name="pack")
    accelerator = models.ForeignKey(
        Accelerator, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    card_hours = models.PositiveIntegerField()
    price = models.DecimalField(max_digits=14, decimal_places=2)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE)
    starts_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["expires_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(expires_at__gt=models.F("starts_at")), name="pack_window"),
        ]
        indexes = [models.Index(fields=["buyer", "status", "expires_at"], name="pack_buyer_status_expiry")]

    def __str__(self) -> str:
        return f"pack {self.pk} ({self.card_hours} card-hours of {self.class_key}) of {self.buyer}"

    @property
    def class_key(self) -> str:
        return pack_class_key(self.accelerator.slug if self.accelerator is not None else None)


class StripeEvent(models.Model):
    """Every Stripe webhook event, stored by its id *before* it is handled (received → processed / failed /
    ignored), so a replay is recognised and a failure is visible with its error."""

    class Status(models.TextChoices):
        RECEIVED = "received", _("Received")
        PROCESSED = "processed", _("Processed")
        FAILED = "failed", _("Failed")
        IGNORED = "ignored", _("Ignored (type not handled)")

    event_id = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=100)
    livemode = models.BooleanField(default=False)
    object_id = models.CharField(max_length=100, blank=True, db_index=True)
    stripe_created = models.DateTimeField(null=True, blank=True)
    payload = models.JSONField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RECEIVED)
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    received_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        indexes = [models.Index(fields=["status", "received_at"], name="stripe_event_status")]

    def __str__(self) -> str:
        return f"{self.event_id} {self.type} ({self.status})"


class PackRefund(models.Model):
    """A refund of a pack's unused part, recorded when Stripe reports it (``charge.refunded``); the
    ledger transfer debits the pack's remaining card-hours and Stripe clearing. Unique per Stripe refund."""

    order = models.ForeignKey(PackOrder, on_delete=models.PROTECT, related_name="refunds")
    pack = models.ForeignKey(Pack, on_delete=models.PROTECT, related_name="refunds")
    stripe_refund_id = models.CharField(max_length=100, unique=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2, help_text=_("CNY returned to the buyer."))
    card_hours_debited = models.BigIntegerField(help_text=_("Micro-card-hours taken off the pack."))
    refunded_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-refunded_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(amount__gt=0), name="pack_refund_amount_positive")]

    def __str__(self) -> str:
        return f"refund {self.stripe_refund_id} of order {self.order_id}: {self.amount} CNY"
