"""Jobs, quotes, leases, the capacity calendar and lease events.

The capacity calendar is the set of *active* ``CapacityHold`` rows: cards of one island held over
``[start_at, end_at)``. A lease has one hold (gang placement inside one island) or several (a job allowed to
span the islands of one cluster). ``lease_accept`` locks the island rows and checks, exactly and in
continuous time, that the holds already there plus the new one never exceed the island's cards minus its
unhealthy cards at any instant, so no two leases can oversubscribe an island.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from core.models import Organisation
from federation.models import Cluster, Hub, Island
from metering.models import PriceCard, SlaCredit


class Gang(models.TextChoices):
    ISLAND = "island", _("All cards in one island")
    CLUSTER = "cluster", _("May span the islands of one cluster")


class Preference(models.TextChoices):
    PRICE = "price", _("Cheapest within the latency budget (latency breaks ties)")
    LATENCY = "latency", _("Lowest latency (price breaks ties)")
    WEIGHTED = "weighted", _("A weighted blend of price and latency")
    # Cost less the credit the price card's SLA schedule would give at the cluster's expected availability
    # (its reliability score, broker.services.reliability); latency breaks ties.
    ADJUSTED = "adjusted", _("Cheapest after the expected SLA credit (latency breaks ties)")


class Job(models.Model):
    """A buyer's request for capacity: how many cards of what, from where, within which window."""

    class State(models.TextChoices):
        OPEN = "open", _("Open (no lease yet)")
        PLACED = "placed", _("Placed (has a live lease)")
        COMPLETED = "completed", _("Completed")
        FAILED = "failed", _("Failed")
        CANCELLED = "cancelled", _("Cancelled")

    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=200, blank=True)
    body_hash = models.CharField(max_length=64, blank=True)
    cards = models.PositiveIntegerField(null=True, blank=True)
    standard_cards = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    accelerators = models.JSONField(
        default=list, blank=True, help_text=_("Allowed accelerator slugs; empty = any chip.")
    )
    min_fp16_tflops = models.DecimalField(max_digits=10, decimal_places=3, null=True, blank=True)
    min_memory_gb = models.DecimalField(max_digits=8, decimal_places=1, null=True, blank=True)
    fabrics = models.JSONField(default=list, blank=True, help_text=_("Allowed island fabrics; empty = any."))
    gang = models.CharField(max_length=8, choices=Gang.choices, default=Gang.ISLAND)
    origin_hub = models.ForeignKey(Hub, on_delete=models.PROTECT, related_name="+")
    latency_budget_ms = models.PositiveIntegerField()
    earliest_start_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    duration_seconds = models.PositiveIntegerField()
    max_price_per_card_hour = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text=_("Per standard card-hour when the job asks for standard cards."),
    )
    checkpointable = models.BooleanField(default=False)
    preference = models.CharField(max_length=8, choices=Preference.choices, default=Preference.PRICE)
    price_weight = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=1,
        help_text=_("For a weighted preference: 1 = price only, 0 = latency only."),
    )
    cluster = models.ForeignKey(
        Cluster,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text=_("Pinned to this cluster: only its islands are considered; empty = any cluster."),
    )
    min_reliability = models.DecimalField(
        max_digits=6,
        decimal_places=3,
        null=True,
        blank=True,
        help_text=_(
            "Lowest reliability score accepted, in percent (delivered ÷ sold card-seconds over 30 days, "
            "with the platform's prior); empty = any."
        ),
    )
    state = models.CharField(max_length=12, choices=State.choices, default=State.OPEN)
    failure_reason = models.CharField(max_length=500, blank=True)
    # What the job's latest quote request found (broker.services.quotes.quote_create): when, how many
    # islands were examined and feasible, the islands rejected per reason, the window searched and, when
    # nothing fitted, the nearest relaxations that would produce a quote. Kept so the job page and the API
    # can say why, whoever asked for the quotes.
    quote_summary = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["buyer", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="job_unique_idempotency_key",
            ),
            models.CheckConstraint(
                condition=(Q(cards__isnull=False) & Q(standard_cards__isnull=True))
                | (Q(cards__isnull=True) & Q(standard_cards__isnull=False)),
                name="job_cards_xor_standard_cards",
            ),
            models.CheckConstraint(
                condition=Q(cards__isnull=True) | Q(cards__gt=0), name="job_cards_positive"
            ),
            models.CheckConstraint(
                condition=Q(standard_cards__isnull=True) | Q(standard_cards__gt=0),
                name="job_standard_cards_positive",
            ),
            models.CheckConstraint(condition=Q(duration_seconds__gt=0), name="job_duration_positive"),
            models.CheckConstraint(
                condition=Q(price_weight__gte=0) & Q(price_weight__lte=1), name="job_price_weight_range"
            ),
            models.CheckConstraint(
                condition=Q(min_reliability__isnull=True)
                | (Q(min_reliability__gte=0) & Q(min_reliability__lte=100)),
                name="job_min_reliability_range",
            ),
        ]
        indexes = [models.Index(fields=["buyer", "-created_at"], name="job_buyer_created")]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.name})"


class Quote(models.Model):
    """One ranked candidate placement for a job, valid until ``expires_at``; it holds nothing."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="quotes")
    rank = models.PositiveSmallIntegerField()
    # The cluster and the price card are the catalogue's own (a quote is made from it), and neither is ever
    # deleted (no code path deletes one, the admin refuses, PROTECT refuses through the ORM). No constraint
    # and no index in the database: each of a request's ten rows would otherwise check both, a row lock on
    # the cluster and the card that every concurrent quote of the same cheap offers takes too (a MultiXact
    # per shared row, beside the heartbeats' updates of the same clusters) — most of what a quote's insert
    # costs PostgreSQL beyond the rows themselves (migration 0014). A lease is what money is drawn against,
    # and a lease's cluster and price card keep their constraints: accepting a quote inserts them.
    cluster = models.ForeignKey(
        Cluster, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    # [[island_id, cards], ...]: one pair for gang placement in one island, several when spanning.
    allocation = models.JSONField()
    # [[island_id, cards], ...]: the other islands of the cluster that can take the same offer (same start,
    # cards, price and latency), in id order; accepting takes the first of allocation + these still free.
    alternatives = models.JSONField(default=list, blank=True)
    cards = models.PositiveIntegerField()
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    price_card = models.ForeignKey(
        PriceCard, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    cost = models.DecimalField(max_digits=16, decimal_places=2)
    breakdown = models.JSONField(help_text=_("Cost per tariff band."))
    latency_ms = models.DecimalField(max_digits=8, decimal_places=3)
    saving = models.DecimalField(
        max_digits=16, decimal_places=2, help_text=_("Against starting at the earliest feasible start.")
    )
    expected_draw = models.DecimalField(max_digits=20, decimal_places=6)
    draw_class = models.CharField(max_length=64)
    balance_sufficient = models.BooleanField()
    # Indexed where set only: almost every quote replaces nothing.
    replaces = models.ForeignKey(
        "Lease", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["job_id", "created_at", "rank"]
        indexes = [
            models.Index(fields=["expires_at"], name="quote_expires"),
            models.Index(fields=["replaces"], name="quote_replaces", condition=Q(replaces__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"quote {self.pk} for job {self.job_id}"


class LeaseState(models.TextChoices):
    RESERVED = "reserved", _("Reserved")
    RUNNING = "running", _("Running")
    STOP_REQUESTED = "stop_requested", _("Stop requested")
    COMPLETED = "completed", _("Completed")
    CANCELLED = "cancelled", _("Cancelled")
    INTERRUPTED = "interrupted", _("Interrupted")
    FAILED = "failed", _("Failed")


# States whose lease still holds its cards.
HOLDING_STATES = (LeaseState.RESERVED, LeaseState.RUNNING, LeaseState.STOP_REQUESTED)
FINAL_STATES = (LeaseState.COMPLETED, LeaseState.CANCELLED, LeaseState.INTERRUPTED, LeaseState.FAILED)


class Lease(models.Model):
    """An accepted quote: cards held on one island (or islands of one cluster) for ``[start_at, end_at)``
    at a locked price card."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="leases")
    quote = models.OneToOneField(
        Quote, null=True, blank=True, on_delete=models.SET_NULL, related_name="lease"
    )
    buyer = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="leases")
    operator = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="operated_leases")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="leases")
    cards = models.PositiveIntegerField()
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    price_card = models.ForeignKey(PriceCard, on_delete=models.PROTECT, related_name="leases")
    expected_cost = models.DecimalField(max_digits=16, decimal_places=2)
    expected_draw = models.DecimalField(max_digits=20, decimal_places=6)
    draw_class = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=LeaseState.choices, default=LeaseState.RESERVED)
    state_changed_at = models.DateTimeField()
    replaces = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="replaced_by"
    )
    started_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The end of the latest usage reported against the lease: failover bills up to here, nothing after.
    last_usage_end_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-start_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(end_at__gt=F("start_at")), name="lease_window"),
            models.CheckConstraint(condition=Q(cards__gt=0), name="lease_cards_positive"),
        ]
        indexes = [
            models.Index(fields=["buyer", "state"], name="lease_buyer_state"),
            models.Index(fields=["operator", "state"], name="lease_operator_state"),
            models.Index(fields=["cluster", "state"], name="lease_cluster_state"),
        ]

    def __str__(self) -> str:
        return f"lease {self.pk}"

    @property
    def reference(self) -> str:
        """What usage records reported against this lease carry as their metering reference."""
        return f"lease:{self.pk}"


class DrawHold(models.Model):
    """A live lease's pending draw on its buyer's packs (a pending transfer, like a budget's BudgetHold):
    ``expected_micros`` is the lease's expected draw (micro chip card-hours × band multiplier, its
    ``expected_draw``), ``posted_micros`` what rating has posted for the lease's usage so far in the same
    unit (packs and arrears alike). Its open amount is expected less posted, never below zero; it is voided
    when the lease reaches a final state (completed, cancelled, interrupted, failed). The buyer's open
    amounts are kept summed per draw class in DrawPending, in the same transactions (broker.draws)."""

    lease = models.OneToOneField(Lease, on_delete=models.CASCADE, primary_key=True, related_name="draw_hold")
    buyer = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="+", db_index=False)
    draw_class = models.CharField(max_length=64, help_text=_("The lease's chip (accelerator slug)."))
    expected_micros = models.BigIntegerField()
    posted_micros = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()
    voided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(expected_micros__gte=0), name="draw_hold_expected_not_negative"
            ),
            models.CheckConstraint(condition=Q(posted_micros__gte=0), name="draw_hold_posted_not_negative"),
        ]
        indexes = [
            models.Index(
                fields=["buyer", "draw_class"], condition=Q(voided_at__isnull=True), name="draw_hold_open"
            ),
        ]

    def __str__(self) -> str:
        return f"draw hold of lease {self.lease_id}"

    @property
    def open_micros(self) -> int:
        return 0 if self.voided_at is not None else max(self.expected_micros - self.posted_micros, 0)


class DrawPending(models.Model):
    """The sum of a buyer's open DrawHold amounts of one draw class: what a quote reads instead of the
    buyer's live leases (one row per chip the buyer has live leases of, whatever their number)."""

    buyer = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="+", db_index=False)
    draw_class = models.CharField(max_length=64)
    open_micros = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["buyer", "draw_class"], name="draw_pending_one_per_class"),
            models.CheckConstraint(condition=Q(open_micros__gte=0), name="draw_pending_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.open_micros} µ{self.draw_class} pending for buyer {self.buyer_id}"


class CapacityHold(models.Model):
    """Cards of one island held by a lease over ``[start_at, end_at)`` while ``active``."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="holds")
    island = models.ForeignKey(Island, on_delete=models.PROTECT, related_name="+", db_index=False)
    cards = models.PositiveIntegerField()
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    active = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(end_at__gt=F("start_at")), name="hold_window"),
            models.CheckConstraint(condition=Q(cards__gt=0), name="hold_cards_positive"),
            models.UniqueConstraint(fields=["lease", "island"], name="hold_unique_island"),
        ]
        indexes = [
            models.Index(
                fields=["island", "start_at", "end_at"], condition=Q(active=True), name="hold_active_island"
            )
        ]

    def __str__(self) -> str:
        return f"{self.cards} cards of island {self.island_id} for lease {self.lease_id}"


class LeaseTransition(models.Model):
    """Append-only history of a lease's state. Its id is also the cursor operators pull with, and what the
    matcher's in-memory calendar follows to stay current."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="transitions")
    operator = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="+", db_index=False)
    from_state = models.CharField(max_length=16, choices=LeaseState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=LeaseState.choices)
    at = models.DateTimeField()
    actor_label = models.CharField(max_length=200)
    reason = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["operator", "id"], name="lease_transition_operator"),
            models.Index(fields=["at"], name="lease_transition_at"),
        ]

    def __str__(self) -> str:
        return f"lease {self.lease_id}: {self.from_state or '∅'} → {self.to_state}"


class OperatorEndpoint(models.Model):
    """Where (and with which secret) lease events are POSTed to an operator, besides being pulled."""

    operator = models.OneToOneField(Organisation, on_delete=models.CASCADE, related_name="+")
    secret = models.CharField(max_length=128, help_text=_("HMAC-SHA256 key for X-Cardhour-Signature."))
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"lease-event endpoint of {self.operator}"


class LeaseEventDelivery(models.Model):
    """One lease event to POST to the cluster's endpoint (outbox), retried with backoff until delivered."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        DELIVERED = "delivered", _("Delivered")
        GAVE_UP = "gave_up", _("Gave up")

    transition = models.OneToOneField(LeaseTransition, on_delete=models.CASCADE, related_name="delivery")
    url = models.URLField(max_length=500)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "lease event deliveries"
        indexes = [
            models.Index(
                fields=["next_attempt_at"], condition=Q(status="pending"), name="delivery_pending_due"
            )
        ]

    def __str__(self) -> str:
        return f"delivery of transition {self.transition_id} ({self.status})"


class BuyerNotice(models.Model):
    """What the broker tells a buyer about its jobs (failover, failure, stop for exhausted packs)."""

    buyer = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="broker_notices")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="notices")
    lease = models.ForeignKey(Lease, null=True, blank=True, on_delete=models.CASCADE, related_name="notices")
    kind = models.CharField(max_length=32)
    message = models.CharField(max_length=1000)
    created_at = models.DateTimeField()
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["buyer", "-created_at"], name="notice_buyer_created")]

    def __str__(self) -> str:
        return f"{self.kind} for {self.buyer_id}"


class BuyerPreference(models.Model):
    """A buyer's portal preferences: the hub its work comes from (the marketplace measures latency from
    it, and the job form defaults a job's origin hub to it)."""

    buyer = models.OneToOneField(Organisation, on_delete=models.CASCADE, related_name="buyer_preference")
    home_hub = models.ForeignKey(Hub, on_delete=models.PROTECT, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"preferences of {self.buyer_id}"


class ClusterReliability(models.Model):
    """A cluster's reliability score over the rolling window before ``computed_at``, with its inputs.

    Recomputed from scratch by the hourly beat (broker.services.reliability.cluster_reliability_refresh,
    which documents exactly what "sold" and "delivered" are), one row per listed cluster. The score is
    delivered ÷ sold card-seconds with a Bayesian prior: as if the cluster had also sold
    ``prior_card_hours`` card-hours and delivered ``prior_percent`` of them. The prior is a platform
    choice (settings CARDHOUR_RELIABILITY_PRIOR_*), not an official figure; a cluster with nothing sold in
    the window scores exactly the prior ("new — prior")."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="reliability")
    window_start_at = models.DateTimeField()
    computed_at = models.DateTimeField()
    sold_card_seconds = models.BigIntegerField()
    delivered_card_seconds = models.BigIntegerField()
    interruptions = models.PositiveIntegerField()
    # Card-hours sold in the window: what the interruption rate is counted over.
    card_hours = models.DecimalField(max_digits=20, decimal_places=6)
    prior_card_hours = models.DecimalField(max_digits=12, decimal_places=3)
    prior_percent = models.DecimalField(max_digits=6, decimal_places=3)
    reliability_percent = models.DecimalField(max_digits=6, decimal_places=3)
    # Null when nothing was sold in the window (no card-hours to count over).
    interruptions_per_1000_card_hours = models.DecimalField(
        max_digits=14, decimal_places=3, null=True, blank=True
    )

    class Meta:
        verbose_name_plural = "cluster reliabilities"
        constraints = [
            models.CheckConstraint(
                condition=Q(delivered_card_seconds__gte=0)
                & Q(delivered_card_seconds__lte=F("sold_card_seconds")),
                name="reliability_delivered_within_sold",
            ),
            models.CheckConstraint(
                condition=Q(reliability_percent__gte=0) & Q(reliability_percent__lte=100),
                name="reliability_percent_range",
            ),
        ]

    def __str__(self) -> str:
        return f"reliability of {self.cluster_id}: {self.reliability_percent} %"

    @property
    def has_history(self) -> bool:
        """Whether anything was sold in the window; without it the score is the prior alone."""
        return self.sold_card_seconds > 0


class SlaAssessment(models.Model):
    """How much of a lease's window was lost to its operator, assessed once after the lease ended
    (broker.services.sla): one row per lease whether or not it earned a credit, so it is never redone.

    ``intervals`` keeps what the figures were computed from, in ISO instants:
    ``{"lost": [[start, end], …], "excluded_buyer": […], "excluded_maintenance": […]}``."""

    class Outcome(models.TextChoices):
        CREDITED = "credited", _("Credit note issued")
        WITHIN_LEVEL = "within_level", _("No credit: in no tier of the credit schedule")
        NO_SCHEDULE = "no_schedule", _("No credit: the price card has no credit schedule")
        NO_CHARGE = "no_charge", _("No credit: nothing was charged")

    lease = models.OneToOneField(Lease, on_delete=models.PROTECT, related_name="sla_assessment")
    assessed_at = models.DateTimeField()
    window_seconds = models.BigIntegerField()
    lost_seconds = models.BigIntegerField()
    excluded_buyer_seconds = models.BigIntegerField()
    excluded_maintenance_seconds = models.BigIntegerField()
    availability_percent = models.DecimalField(max_digits=7, decimal_places=3)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    credit = models.OneToOneField(
        SlaCredit, null=True, blank=True, on_delete=models.PROTECT, related_name="assessment"
    )
    intervals = models.JSONField(default=dict)

    class Meta:
        ordering = ["-assessed_at", "-id"]

    def __str__(self) -> str:
        return f"SLA assessment of lease {self.lease_id}: {self.outcome}"


# Budgets and caps live in their own package (broker/budgets); imported here so Django registers them.
from broker.budgets.models import (  # noqa: E402, F401
    Budget,
    BudgetAlert,
    BudgetBreach,
    BudgetHold,
    BuyerEndpoint,
    LeaseOrigin,
)
