"""Month-end statements: buyer invoices and operator settlements, final once issued.

An issued statement is *frozen* (``frozen_at``): everything it shows about the parties (seller, buyer or
operator: legal names, tax ids, addresses) is copied into ``parties`` and its PDF is rendered once into a
StatementDocument with its SHA-256; every later download serves those bytes. On PostgreSQL, triggers refuse
any UPDATE or DELETE of a frozen statement, of its lines and of its document (migration
0007_frozen_statements); corrections are new statements or credit lines, never edits.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from core.models import Organisation
from federation.models import Cluster
from metering.models.ledger import LedgerTransfer
from metering.models.packs import Pack, PackOrder
from metering.models.tariffs import Band
from metering.tax import ProductKind


class BillingCloseRun(models.Model):
    """One month-end close. Unique per period: a second run of the job resumes the first instead of
    starting again; each statement is itself unique per (organisation, period)."""

    period_start = models.DateField(unique=True, help_text=_("First day of the month closed."))
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    invoices_issued = models.PositiveIntegerField(default=0)
    settlements_issued = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-period_start"]

    def __str__(self) -> str:
        return f"close {self.period_start:%Y-%m}"


class Invoice(models.Model):
    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="invoices")
    period_start = models.DateField()
    period_end = models.DateField(help_text=_("First day after the period."))
    number = models.CharField(max_length=40, unique=True)
    currency = models.CharField(max_length=3, default="CNY")
    packs_amount = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    refunds_amount = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    usage_value = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    arrears_amount = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    total_paid = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    amount_due = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    arrears_brought_forward = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        default=0,
        help_text=_("The amount due on the buyer's previous invoice."),
    )
    arrears_settled = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        default=0,
        help_text=_("Arrears paid in the period from new packs (negative: it reduces the amount due)."),
    )
    net_amount = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        null=True,
        blank=True,
        help_text=_("Net of VAT of what was paid (packs less refunds); empty on invoices issued before VAT."),
    )
    tax_amount = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        null=True,
        blank=True,
        help_text=_("VAT in what was paid (packs less refunds): the sum of those lines' tax."),
    )
    issued_at = models.DateTimeField()
    frozen_at = models.DateTimeField(
        null=True, blank=True, help_text=_("When its parties and PDF were frozen; read-only from then on.")
    )
    parties = models.JSONField(
        default=dict, blank=True, help_text=_("Seller and buyer details as they were at issue.")
    )

    class Meta:
        ordering = ["-period_start", "buyer_id"]
        constraints = [
            models.UniqueConstraint(fields=["buyer", "period_start"], name="invoice_unique_period"),
        ]

    def __str__(self) -> str:
        return self.number


class InvoiceLine(models.Model):
    class Kind(models.TextChoices):
        PACK_PURCHASE = "pack_purchase", _("Pack bought")
        USAGE = "usage", _("Card-hours used")
        PRIOR_PERIOD = "prior_period", _("Usage from an earlier period, reported late")
        REFUND = "refund", _("Refund (credit)")
        ARREARS = "arrears", _("Card-hours used with no pack")
        ARREARS_PAID = "arrears_paid", _("Arrears settled from a new pack")
        SLA_CREDIT = "sla_credit", _("SLA credit")
        SLA_REVERSAL = "sla_reversal", _("SLA credit reversed after a dispute")

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    description = models.CharField(max_length=300)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    band = models.CharField(max_length=16, choices=Band.choices, blank=True)
    pack = models.ForeignKey(Pack, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    order = models.ForeignKey(PackOrder, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    card_seconds = models.BigIntegerField(default=0)
    card_hours_drawn = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    amount = models.DecimalField(max_digits=14, decimal_places=2, help_text=_("Gross: VAT included."))
    # VAT (metering.tax): empty on lines issued before invoices carried it.
    product_kind = models.CharField(max_length=24, choices=ProductKind.choices, blank=True)
    vat_rate = models.DecimalField(max_digits=5, decimal_places=4, null=True, blank=True)
    net_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    tax_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    arrears_settlement = models.ForeignKey(
        "ArrearsSettlement", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    sla_credit = models.ForeignKey(
        "metering.SlaCredit", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["invoice_id", "seq"]
        # net + tax = amount holds by construction (metering.tax.vat_split); not a CHECK, because SQLite
        # compares decimals in floating point (see settlement_issue).
        constraints = [models.UniqueConstraint(fields=["invoice", "seq"], name="invoice_line_unique_seq")]

    def __str__(self) -> str:
        return f"{self.invoice.number} #{self.seq} {self.description}"


class Settlement(models.Model):
    operator = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="settlements")
    period_start = models.DateField()
    period_end = models.DateField()
    number = models.CharField(max_length=40, unique=True)
    currency = models.CharField(max_length=3, default="CNY")
    gross = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    commission = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    payable = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    issued_at = models.DateTimeField()
    frozen_at = models.DateTimeField(
        null=True, blank=True, help_text=_("When its parties and PDF were frozen; read-only from then on.")
    )
    parties = models.JSONField(
        default=dict, blank=True, help_text=_("Platform and operator details as they were at issue.")
    )

    class Meta:
        ordering = ["-period_start", "operator_id"]
        constraints = [
            models.UniqueConstraint(fields=["operator", "period_start"], name="settlement_unique_period"),
            models.CheckConstraint(
                condition=Q(payable=models.F("gross") - models.F("commission")), name="settlement_payable"
            ),
        ]

    def __str__(self) -> str:
        return self.number


class SettlementLine(models.Model):
    """A line of a settlement: usage of one cluster in one band (``kind`` usage), or an SLA credit note
    debited from the operator (negative amounts) or its reversal after an accepted dispute (positive)."""

    class Kind(models.TextChoices):
        USAGE = "usage", _("Usage")
        SLA_CREDIT = "sla_credit", _("SLA credit")
        SLA_CREDIT_REVERSAL = "sla_credit_reversal", _("SLA credit reversed after a dispute")

    settlement = models.ForeignKey(Settlement, on_delete=models.CASCADE, related_name="lines")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.USAGE)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    band = models.CharField(max_length=16, choices=Band.choices, blank=True)
    sla_credit = models.ForeignKey(
        "metering.SlaCredit", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    prior_period = models.BooleanField(default=False)
    card_seconds = models.BigIntegerField()
    gross = models.DecimalField(max_digits=14, decimal_places=2)
    commission = models.DecimalField(max_digits=14, decimal_places=2)
    payable = models.DecimalField(max_digits=14, decimal_places=2)

    class Meta:
        ordering = ["settlement_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["settlement", "seq"], name="settlement_line_unique_seq")
        ]

    def __str__(self) -> str:
        return f"{self.settlement.number} #{self.seq}"


class StatementDocument(models.Model):
    """The PDF of an issued statement, rendered once at issue and served byte for byte ever after.

    Kept in the database beside the statement (a few tens of kB each, one per statement per month), so a
    backup of the database is a backup of every document issued, and the hash can be checked against the
    bytes in one row. Never updated or deleted (a PostgreSQL trigger refuses both)."""

    invoice = models.OneToOneField(
        Invoice, null=True, blank=True, on_delete=models.PROTECT, related_name="document"
    )
    settlement = models.OneToOneField(
        Settlement, null=True, blank=True, on_delete=models.PROTECT, related_name="document"
    )
    media_type = models.CharField(max_length=60, default="application/pdf")
    content = models.BinaryField()
    sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    rendered_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(invoice__isnull=False, settlement__isnull=True)
                | Q(invoice__isnull=True, settlement__isnull=False),
                name="statement_document_one_statement",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.invoice or self.settlement} ({self.sha256[:12]})"


class ArrearsSettlement(models.Model):
    """Arrears of one class (card-hours a buyer used with no pack) paid from a newly credited pack.

    Made when the pack is credited (metering.services.arrears), before any of it is usable, one per (order,
    arrears class); its ledger transfer (``arrears_settlement:<order>:<class>``) draws the pack and clears
    the arrears account and the money owed. Amounts are exact micro-units (core.money), like the ledger;
    the invoice of the month it happens in shows it as a line that reduces the amount due."""

    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="arrears_settlements")
    order = models.ForeignKey(PackOrder, on_delete=models.PROTECT, related_name="arrears_settlements")
    pack = models.ForeignKey(Pack, on_delete=models.PROTECT, related_name="arrears_settlements")
    arrears_class = models.CharField(max_length=80, help_text=_("The chip whose card-hours were owed."))
    arrears_card_hours = models.BigIntegerField(help_text=_("Micro-card-hours of the chip cleared."))
    pack_draw = models.BigIntegerField(help_text=_("Micro-card-hours drawn from the pack, in its unit."))
    factor = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text=_("The chip's standard-card factor when a standard pack paid; empty for a chip pack."),
    )
    prepaid_value = models.BigIntegerField(help_text=_("Micro-yuan of the pack's prepaid value used."))
    money_cleared = models.BigIntegerField(help_text=_("Micro-yuan of money owed that this cleared."))
    transfer = models.OneToOneField(LedgerTransfer, on_delete=models.PROTECT, related_name="+")
    settled_at = models.DateTimeField()
    invoice = models.ForeignKey(
        Invoice, on_delete=models.PROTECT, null=True, blank=True, related_name="arrears_settlements"
    )

    class Meta:
        ordering = ["settled_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["order", "arrears_class"], name="arrears_settlement_unique"),
            models.CheckConstraint(
                condition=Q(arrears_card_hours__gt=0, pack_draw__gt=0, money_cleared__gte=0),
                name="arrears_settlement_positive",
            ),
        ]
        indexes = [models.Index(fields=["buyer", "invoice"], name="arrears_settlement_buyer")]

    def __str__(self) -> str:
        return f"arrears settlement {self.pk} of {self.buyer} from pack {self.pack_id}"
