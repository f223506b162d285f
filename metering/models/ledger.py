"""The double-entry ledger: accounts, transfers and their entries, append-only.

Amounts are signed integers in micro-units of the entry's unit (``CNY`` or ``card_hours:<class>``, see
core.money). Each transfer's entries sum to zero per unit (checked by the posting service, by a deferred
constraint trigger on PostgreSQL and by the reconciliation task). Account balances are maintained in the same
transaction as the entries; a pack account carries ``non_negative`` and the database refuses a negative
balance.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from core.models import Organisation
from metering.models.packs import Pack

CNY_UNIT = "CNY"


def card_hour_unit(class_key: str) -> str:
    return f"card_hours:{class_key}"


class AccountKind(models.TextChoices):
    STRIPE_CLEARING = "stripe_clearing", _("Stripe clearing (CNY)")
    BUYER_MONEY = "buyer_money", _("Buyer money: prepaid value not yet used (CNY)")
    PACK = "pack", _("Pack balance (card-hours)")
    CARD_HOUR_ISSUANCE = "card_hour_issuance", _("Card-hours issued to packs (card-hours)")
    ARREARS = "arrears", _("Buyer arrears: card-hours used with no pack (card-hours)")
    OPERATOR_EARNINGS = "operator_earnings", _("Operator earnings, payable (CNY)")
    PLATFORM_COMMISSION = "platform_commission", _("Platform commission revenue (CNY)")
    PLATFORM_SPREAD = "platform_spread", _("Platform spread: pack value over operator price (CNY)")
    BREAKAGE = "breakage", _("Expiry and breakage (CNY)")


class LedgerAccount(models.Model):
    key = models.CharField(max_length=160, unique=True)
    kind = models.CharField(max_length=24, choices=AccountKind.choices)
    unit = models.CharField(max_length=80)
    organisation = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, null=True, blank=True, related_name="ledger_accounts"
    )
    pack = models.OneToOneField(Pack, on_delete=models.PROTECT, null=True, blank=True, related_name="account")
    balance = models.BigIntegerField(default=0, help_text=_("Micro-units of the account's unit."))
    non_negative = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["key"]
        constraints = [
            models.CheckConstraint(
                condition=Q(non_negative=False) | Q(balance__gte=0), name="ledger_account_non_negative"
            ),
            models.CheckConstraint(
                condition=~Q(kind="pack") | Q(pack__isnull=False), name="ledger_account_pack_has_pack"
            ),
        ]
        indexes = [models.Index(fields=["kind", "organisation"], name="ledger_account_kind_org")]

    def __str__(self) -> str:
        return self.key


class TransferKind(models.TextChoices):
    PACK_PURCHASE = "pack_purchase", _("Pack purchase")
    USAGE = "usage", _("Usage rating")
    PACK_EXPIRY = "pack_expiry", _("Pack expiry")
    PACK_REFUND = "pack_refund", _("Pack refund")
    ARREARS_SETTLEMENT = "arrears_settlement", _("Arrears settled from a new pack")
    SLA_CREDIT = "sla_credit", _("SLA credit")
    SLA_CREDIT_REVERSAL = "sla_credit_reversal", _("SLA credit reversed after a dispute")


class LedgerTransfer(models.Model):
    """One balanced posting. ``idempotency_key`` (unique) makes every posting happen at most once:
    ``stripe_pi:<id>``, ``usage_batch:<first record id>…``, ``pack_expiry:<pack id>``…"""

    kind = models.CharField(max_length=24, choices=TransferKind.choices)
    idempotency_key = models.CharField(max_length=200, unique=True)
    description = models.CharField(max_length=500)
    posted_at = models.DateTimeField()
    posted_by = models.CharField(max_length=200)

    class Meta:
        ordering = ["-posted_at", "-id"]
        indexes = [models.Index(fields=["kind", "posted_at"], name="ledger_transfer_kind_posted")]

    def __str__(self) -> str:
        return f"{self.kind} {self.pk}: {self.description}"


class LedgerEntry(models.Model):
    transfer = models.ForeignKey(LedgerTransfer, on_delete=models.PROTECT, related_name="entries")
    account = models.ForeignKey(LedgerAccount, on_delete=models.PROTECT, related_name="entries")
    unit = models.CharField(max_length=80)
    amount = models.BigIntegerField(help_text=_("Signed micro-units; + raises the account's balance."))

    class Meta:
        ordering = ["transfer_id", "id"]
        verbose_name_plural = "ledger entries"
        constraints = [models.CheckConstraint(condition=~Q(amount=0), name="ledger_entry_non_zero")]
        indexes = [models.Index(fields=["account", "transfer"], name="ledger_entry_account")]

    def __str__(self) -> str:
        return f"{self.account.key} {self.amount:+d} {self.unit}"
