"""Budgets, their pending holds, alerts (an outbox per channel), cap breaches, who accepted each lease, and
the buyer's signed webhook endpoint.

Amounts are CNY of *spend* (core.money: the segments' ``buyer_value``, prepaid value drawn plus arrears),
the figure the usage page and the invoices show. A budget of an organisation, a member or an API token
covers one calendar month in the billing time zone (``CARDHOUR_BILLING_TIME_ZONE``); a job's budget covers
the job's whole life (every lease of it, failover replacements included).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from core.models import ApiToken, Organisation

DEFAULT_THRESHOLDS = [50, 80, 100]
JOB_PERIOD = "job"  # the period key of a job's budget: its whole life


class BudgetScope(models.TextChoices):
    ORGANISATION = "organisation", _("Organisation")
    MEMBER = "member", _("Member")
    TOKEN = "token", _("API token")
    JOB = "job", _("Job")


class Budget(models.Model):
    """A spend limit of a buyer for one scope: an optional soft amount with alert thresholds (percent of
    it) and an optional hard cap, which refuses an acceptance that would cross it and stops the scope's
    running leases once posted spend reaches it."""

    buyer = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="budgets")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=16, choices=BudgetScope.choices, default=BudgetScope.ORGANISATION)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey("broker.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    soft_amount = models.DecimalField(
        max_digits=16,
        decimal_places=2,
        null=True,
        blank=True,
        help_text=_("CNY; alerts are percentages of it."),
    )
    thresholds = models.JSONField(default=list, blank=True, help_text=_("Percentages of the soft amount."))
    hard_cap = models.DecimalField(max_digits=16, decimal_places=2, null=True, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["buyer_id", "scope", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(scope="organisation", user__isnull=True, token__isnull=True, job__isnull=True)
                    | Q(scope="member", user__isnull=False, token__isnull=True, job__isnull=True)
                    | Q(scope="token", user__isnull=True, token__isnull=False, job__isnull=True)
                    | Q(scope="job", user__isnull=True, token__isnull=True, job__isnull=False)
                ),
                name="budget_scope_target",
            ),
            models.CheckConstraint(
                condition=Q(soft_amount__isnull=False) | Q(hard_cap__isnull=False), name="budget_has_a_limit"
            ),
            models.CheckConstraint(
                condition=Q(soft_amount__isnull=True) | Q(soft_amount__gt=0), name="budget_soft_positive"
            ),
            models.CheckConstraint(
                condition=Q(hard_cap__isnull=True) | Q(hard_cap__gte=0), name="budget_cap_not_negative"
            ),
            # One budget per scope target: two caps on one thing would only confuse which one refused.
            models.UniqueConstraint(
                fields=["buyer"], condition=Q(scope="organisation"), name="budget_one_per_organisation"
            ),
            models.UniqueConstraint(
                fields=["buyer", "user"], condition=Q(scope="member"), name="budget_one_per_member"
            ),
            models.UniqueConstraint(
                fields=["buyer", "token"], condition=Q(scope="token"), name="budget_one_per_token"
            ),
            models.UniqueConstraint(
                fields=["buyer", "job"], condition=Q(scope="job"), name="budget_one_per_job"
            ),
        ]

    def __str__(self) -> str:
        return f"budget {self.pk} {self.name} ({self.scope})"

    @property
    def monthly(self) -> bool:
        return self.scope != BudgetScope.JOB


class LeaseOrigin(models.Model):
    """Who accepted a lease (a person or an API token), so member and token budgets can count its spend.
    A failover replacement inherits its original's."""

    lease = models.OneToOneField(
        "broker.Lease", on_delete=models.CASCADE, primary_key=True, related_name="origin"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return f"origin of lease {self.lease_id}"


class BudgetHold(models.Model):
    """A pending hold (TigerBeetle's pending transfer) of a lease's expected cost against a budget, placed
    when the lease is accepted. Its open amount is ``amount`` less what the lease's usage has posted so far
    (never below zero); it is voided when the lease ends, is cancelled or interrupted."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="holds")
    lease = models.ForeignKey("broker.Lease", on_delete=models.CASCADE, related_name="budget_holds")
    period_key = models.CharField(max_length=8, help_text=_("YYYY-MM, or 'job' for a job's budget."))
    amount = models.DecimalField(max_digits=16, decimal_places=2)
    created_at = models.DateTimeField()
    voided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "lease"], name="budget_hold_one_per_lease"),
            models.CheckConstraint(condition=Q(amount__gte=0), name="budget_hold_not_negative"),
        ]
        indexes = [
            models.Index(fields=["budget"], condition=Q(voided_at__isnull=True), name="budget_hold_open"),
        ]

    def __str__(self) -> str:
        return f"hold of {self.amount} for lease {self.lease_id} on budget {self.budget_id}"


class BudgetAlertKind(models.TextChoices):
    THRESHOLD = "threshold", _("Threshold crossed")
    CAP = "cap", _("Hard cap reached")


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    DELIVERED = "delivered", _("Delivered")
    GAVE_UP = "gave_up", _("Gave up")
    SKIPPED = "skipped", _("Nothing to send to")


class BudgetAlert(models.Model):
    """An alert, once per (budget, period, kind, percent) — the unique index is what makes it once. The
    row is also the outbox of its e-mail and webhook deliveries; the portal notice is written with it."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_key = models.CharField(max_length=8)
    kind = models.CharField(max_length=12, choices=BudgetAlertKind.choices)
    percent = models.PositiveSmallIntegerField(help_text=_("The threshold crossed (100 for the cap)."))
    limit_amount = models.DecimalField(
        max_digits=16, decimal_places=2, help_text=_("The soft amount or the cap.")
    )
    spent = models.DecimalField(
        max_digits=16, decimal_places=2, help_text=_("Posted spend when it was raised.")
    )
    created_at = models.DateTimeField()
    email_status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    email_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    webhook_delivered_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_key", "kind", "percent"], name="budget_alert_once_per_period"
            )
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(webhook_status="pending") | Q(email_status="pending"),
                name="budget_alert_due",
            )
        ]

    def __str__(self) -> str:
        return f"alert {self.kind} {self.percent}% of budget {self.budget_id} in {self.period_key}"


class BudgetBreach(models.Model):
    """A budget whose hard cap the posted spend of a period reached while leases ran (like metering's
    BuyerExhaustion): while open, the running leases of its scope are asked to stop. Cleared when the cap
    is raised above the spend, the budget disabled or deleted; a new period needs a new breach."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="breaches")
    period_key = models.CharField(max_length=8)
    raised_at = models.DateTimeField()
    cleared_at = models.DateTimeField(null=True, blank=True)
    spent = models.DecimalField(max_digits=16, decimal_places=2)
    cap = models.DecimalField(max_digits=16, decimal_places=2)

    class Meta:
        ordering = ["-raised_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_key"],
                condition=Q(cleared_at__isnull=True),
                name="budget_breach_one_open",
            )
        ]

    def __str__(self) -> str:
        return f"budget {self.budget_id} over its cap in {self.period_key}"


class BuyerEndpoint(models.Model):
    """Where a buyer's budget alerts are POSTed, signed with an HMAC secret shown once (like an operator's
    lease-event endpoint; the same SSRF rules, core.net)."""

    buyer = models.OneToOneField(Organisation, on_delete=models.CASCADE, related_name="+")
    url = models.URLField(max_length=500, blank=True)
    secret = models.CharField(
        max_length=128, blank=True, help_text=_("HMAC-SHA256 key for X-Cardhour-Signature.")
    )
    enabled = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"alert endpoint of {self.buyer_id}"
