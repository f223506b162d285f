"""SLA credit notes and the decisions on operators' disputes of them (issue 16 item 3).

A credit note is written once, by metering.services.sla.sla_credit_issue, with the balanced ``sla_credit``
ledger transfer it explains, and is never edited. It carries every figure the buyer reads: the lease and its
window, the time lost and excluded, the availability against the card's service level, the tier applied,
and the amounts per pack (card-hours) or money (CNY). The lease is named by id and reference only: metering
has never heard of a lease (broker attributes the lost time and calls metering with plain values).

A dispute decision is a second row: an accepted dispute posts a reversing ``sla_credit_reversal`` transfer;
a rejected one posts nothing. The credit note and its transfer stay as they were either way.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from core.models import Organisation
from federation.models import Cluster
from metering.models.ledger import LedgerTransfer
from metering.models.tariffs import PriceCard


class SlaCredit(models.Model):
    """A credit note: part of a lease's charge given back because its cluster missed the card's service
    level. Amounts are integer micro-units (core.money); ``lines`` lists what each pack (or the arrears of a
    class, or the money balance for a pack that can no longer be drawn) got back:
    ``[{"pack_id", "class", "to", "card_hours_micros", "value_micros", "gross_micros", "commission_micros"}]``
    with ``to`` one of ``pack`` / ``arrears`` / ``money``."""

    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="sla_credits")
    operator = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="sla_credits_given")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    price_card = models.ForeignKey(PriceCard, on_delete=models.PROTECT, related_name="+")
    lease_id = models.BigIntegerField(
        unique=True, help_text=_("The broker's lease (one credit note per lease).")
    )
    reference = models.CharField(max_length=200)
    window_start_at = models.DateTimeField()
    window_end_at = models.DateTimeField()
    window_seconds = models.BigIntegerField()
    lost_seconds = models.BigIntegerField(help_text=_("Seconds of the window lost to the operator."))
    excluded_buyer_seconds = models.BigIntegerField(
        default=0, help_text=_("Seconds after the buyer stopped or cancelled, or the lease ended.")
    )
    excluded_maintenance_seconds = models.BigIntegerField(
        default=0, help_text=_("Seconds inside maintenance announced ahead.")
    )
    availability_percent = models.DecimalField(max_digits=7, decimal_places=3)
    service_level_percent = models.DecimalField(max_digits=6, decimal_places=3)
    tier_below_percent = models.DecimalField(max_digits=6, decimal_places=3)
    credit_percent = models.DecimalField(max_digits=6, decimal_places=3)
    charge_gross = models.BigIntegerField(help_text=_("The lease's rated charge, micro-CNY."))
    credit_gross = models.BigIntegerField(help_text=_("Credited part of the charge, micro-CNY."))
    credit_commission = models.BigIntegerField(help_text=_("The platform's commission on it, micro-CNY."))
    credit_buyer_value = models.BigIntegerField(
        help_text=_("What the buyer gets back, micro-CNY: prepaid value of pack hours plus money.")
    )
    lines = models.JSONField(default=list)
    # The attribution behind the figures, as ISO instants: {"lost": [[start, end], …], "excluded_buyer": […],
    # "excluded_maintenance": […]} — what the credit-note page draws on the window's timeline.
    intervals = models.JSONField(default=dict)
    transfer = models.OneToOneField(LedgerTransfer, on_delete=models.PROTECT, related_name="sla_credit")
    issued_at = models.DateTimeField()
    # The operator's settlement that states the debit (set once, at the close after the note, like a rated
    # segment's settlement): an issued settlement never changes, so a note lands on the next one.
    settlement = models.ForeignKey(
        "metering.Settlement", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # The buyer's invoice that states the credit (set once, at the close after the note).
    invoice = models.ForeignKey(
        "metering.Invoice", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-issued_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(credit_gross__gt=0), name="sla_credit_positive"),
            models.CheckConstraint(
                condition=Q(credit_gross__lte=models.F("charge_gross")), name="sla_credit_within_charge"
            ),
        ]
        indexes = [
            models.Index(fields=["buyer", "-issued_at"], name="sla_credit_buyer_issued"),
            models.Index(fields=["operator", "-issued_at"], name="sla_credit_operator_issued"),
        ]

    def __str__(self) -> str:
        return f"SLA credit {self.pk} for lease {self.lease_id}"

    @property
    def service_level_text(self) -> str:
        return format(self.service_level_percent.normalize(), "f")

    @property
    def credit_percent_text(self) -> str:
        return format(self.credit_percent.normalize(), "f")


class SlaCreditDispute(models.Model):
    """Staff's decision on an operator's dispute of a credit note: one per note. Accepted posts the
    reversing transfer; rejected posts nothing. Nothing else changes."""

    class Outcome(models.TextChoices):
        ACCEPTED = "accepted", _("Accepted: credit reversed")
        REJECTED = "rejected", _("Rejected: credit stands")

    credit = models.OneToOneField(SlaCredit, on_delete=models.PROTECT, related_name="dispute")
    outcome = models.CharField(max_length=8, choices=Outcome.choices)
    reason = models.CharField(max_length=500)
    decided_by = models.CharField(max_length=200)
    decided_at = models.DateTimeField()
    reversal_transfer = models.OneToOneField(
        LedgerTransfer, on_delete=models.PROTECT, null=True, blank=True, related_name="sla_credit_reversal"
    )
    # The settlement and the invoice that state an accepted dispute's reversal.
    settlement = models.ForeignKey(
        "metering.Settlement", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    invoice = models.ForeignKey(
        "metering.Invoice", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-decided_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(outcome="accepted") & Q(reversal_transfer__isnull=False))
                | (Q(outcome="rejected") & Q(reversal_transfer__isnull=True)),
                name="sla_dispute_reversal_iff_accepted",
            )
        ]

    def __str__(self) -> str:
        return f"dispute of SLA credit {self.credit_id}: {self.outcome}"
