"""Hubs, the accelerator catalog, clusters and islands under compute identifiers, and their history."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from core.models import ApiToken, Organisation


class Hub(models.Model):
    """A national computing hub (East Data West Computing), or ``ext`` for anywhere else."""

    class Region(models.TextChoices):
        EAST = "east", _("East (demand)")
        WEST = "west", _("West (supply)")
        OTHER = "other", _("Other")

    code = models.CharField(max_length=8, unique=True)
    name = models.CharField(max_length=100)
    name_zh = models.CharField(_("name (Chinese)"), max_length=100, blank=True)
    region = models.CharField(max_length=8, choices=Region.choices)
    sort_order = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["sort_order", "code"]

    def __str__(self) -> str:
        return f"{self.code} — {self.name}"


class HubLatency(models.Model):
    """Round-trip latency between two hubs, one row per ordered pair (the matrix need not be symmetric).

    Seeded from the policy tiers (a hub to itself) and from documented estimates (between hubs; see
    federation.catalog.hub_latency_seed); replaced by measurements posted through the API.
    """

    class Origin(models.TextChoices):
        POLICY = "policy", _("Policy tier (seed)")
        ESTIMATED = "estimated", _("Estimated from distance (seed)")
        MEASURED = "measured", _("Measured")

    source = models.ForeignKey(Hub, on_delete=models.CASCADE, related_name="latencies_out")
    target = models.ForeignKey(Hub, on_delete=models.CASCADE, related_name="latencies_in")
    latency_ms = models.DecimalField(max_digits=8, decimal_places=3)
    origin = models.CharField(max_length=12, choices=Origin.choices, default=Origin.POLICY)
    measured_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "hub latency"
        verbose_name_plural = "hub latencies"
        ordering = ["source__sort_order", "target__sort_order"]
        constraints = [
            models.UniqueConstraint(fields=["source", "target"], name="hub_latency_unique_pair"),
            models.CheckConstraint(condition=Q(latency_ms__gte=0), name="hub_latency_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.source.code}→{self.target.code}: {self.latency_ms} ms"


class StandardCard(models.Model):
    """The definition of one *standard card* (dense FP16 TFLOPS), versioned: the newest version whose
    ``effective_from`` has passed is in force. A chip's standard-card factor is its TFLOPS / this."""

    version = models.PositiveIntegerField(unique=True)
    dense_fp16_tflops = models.DecimalField(max_digits=10, decimal_places=3)
    effective_from = models.DateTimeField()
    note = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.CheckConstraint(condition=Q(dense_fp16_tflops__gt=0), name="standard_card_positive"),
        ]

    def __str__(self) -> str:
        return f"v{self.version}: {self.dense_fp16_tflops} TFLOPS"


class Fabric(models.TextChoices):
    NVLINK = "nvlink", "NVLink"
    HCCS = "hccs", "HCCS"
    INFINIBAND = "infiniband", "InfiniBand"
    ROCE = "roce", "RoCE"
    PCIE = "pcie", "PCIe"


class Accelerator(models.Model):
    """A chip model in the catalog. Figures are public vendor specifications or NULL: a model whose
    figures are not public has ``spec_status = unknown`` and no invented numbers."""

    class SpecStatus(models.TextChoices):
        PUBLISHED = "published", _("Published specification")
        REPORTED = "reported", _("Reported by others, not the chip vendor")
        UNKNOWN = "unknown", _("Not public (unknown)")

    slug = models.SlugField(max_length=64, unique=True)
    vendor = models.CharField(max_length=64)
    model = models.CharField(max_length=100)
    aliases = models.JSONField(
        default=list,
        blank=True,
        help_text=_("Other spellings seen in fleet inventories, e.g. 'A100-SXM4-80GB'."),
    )
    spec_status = models.CharField(max_length=12, choices=SpecStatus.choices, default=SpecStatus.PUBLISHED)
    dense_fp16_tflops = models.DecimalField(
        _("dense FP16 TFLOPS"),
        max_digits=10,
        decimal_places=3,
        null=True,
        blank=True,
        help_text=_("Dense FP16 tensor TFLOPS, no sparsity."),
    )
    memory_gb = models.DecimalField(max_digits=8, decimal_places=1, null=True, blank=True)
    memory_bandwidth_gbps = models.DecimalField(
        max_digits=10, decimal_places=1, null=True, blank=True, help_text=_("Memory bandwidth in GB/s.")
    )
    interconnect = models.CharField(max_length=200, blank=True)
    default_fabric = models.CharField(max_length=12, choices=Fabric.choices, default=Fabric.PCIE)
    source = models.CharField(max_length=300, blank=True, help_text=_("Where the figures come from."))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["vendor", "model"]
        constraints = [
            models.CheckConstraint(
                condition=Q(spec_status="unknown") | Q(dense_fp16_tflops__isnull=False),
                name="accelerator_published_has_tflops",
            ),
            models.CheckConstraint(
                condition=Q(dense_fp16_tflops__isnull=True) | Q(dense_fp16_tflops__gt=0),
                name="accelerator_tflops_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.vendor} {self.model}"


class ClusterStatus(models.TextChoices):
    # A context: Django merges every catalogue into one table, and "Active" for a token or a pack (有效) is
    # not what an operator calls a cluster in service (在用).
    ACTIVE = "active", pgettext_lazy("cluster status", "Active")
    DRAINING = "draining", _("Draining")
    OFFLINE = "offline", _("Offline")
    RETIRED = "retired", _("Retired")


class Health(models.TextChoices):
    UNKNOWN = "unknown", _("Unknown (no heartbeat yet)")
    OK = "ok", _("OK")
    DEGRADED = "degraded", _("Degraded")
    CRITICAL = "critical", _("Critical")


# What an agent may report; `unknown` only means "no heartbeat yet".
REPORTABLE_HEALTH = [(value, label) for value, label in Health.choices if value != Health.UNKNOWN]


class Cluster(models.Model):
    """One operator's pool of one accelerator model at one site, in one hub.

    ``total_cards`` (K1) and ``available_cards`` (K2) are the sums over its islands, kept by the services
    that change islands, so listings and aggregates never have to join every island.
    """

    class OfflineCause(models.TextChoices):
        NONE = "", _("—")
        HEARTBEAT = "heartbeat", _("Missed heartbeats")
        OPERATOR = "operator", _("Set by the operator")
        STAFF = "staff", _("Set by staff")

    # No single-column indexes on operator and hub: cluster_operator_hub and cluster_hub_chip_status lead
    # with them, and every index is one more insert per registration.
    operator = models.ForeignKey(
        Organisation, on_delete=models.PROTECT, related_name="clusters", db_index=False
    )
    cpi = models.CharField("CPI", max_length=140, unique=True)
    name = models.CharField(max_length=32)
    hub = models.ForeignKey(Hub, on_delete=models.PROTECT, related_name="clusters", db_index=False)
    site = models.CharField(max_length=100)
    accelerator = models.ForeignKey(Accelerator, on_delete=models.PROTECT, related_name="clusters")
    endpoint_url = models.URLField(max_length=500, blank=True)
    status = models.CharField(max_length=12, choices=ClusterStatus.choices, default=ClusterStatus.ACTIVE)
    # Where a cluster taken offline by missed heartbeats returns to when beats come back.
    status_before_offline = models.CharField(max_length=12, choices=ClusterStatus.choices, blank=True)
    offline_cause = models.CharField(max_length=12, choices=OfflineCause.choices, blank=True)
    # When it last went offline, whoever took it there (kept after it comes back). The heartbeat monitor's
    # mass-miss hold counts clusters that went offline for missed beats within the last missed-beat window.
    offline_at = models.DateTimeField(null=True, blank=True)
    health = models.CharField(max_length=12, choices=Health.choices, default=Health.UNKNOWN)
    total_cards = models.PositiveIntegerField(default=0)
    available_cards = models.PositiveIntegerField(default=0)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The heartbeat's own timestamp: an older beat arriving late is ignored.
    last_heartbeat_sent_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cpi"]
        constraints = [
            models.UniqueConstraint(fields=["operator", "hub", "name"], name="cluster_unique_name"),
            models.CheckConstraint(
                condition=Q(available_cards__lte=F("total_cards")), name="cluster_k2_le_k1"
            ),
        ]
        indexes = [
            models.Index(fields=["operator", "hub"], name="cluster_operator_hub"),
            # Operator-level resolution pages clusters by identifier within one operator.
            models.Index(fields=["operator", "cpi"], name="cluster_operator_cpi"),
            models.Index(fields=["hub", "accelerator", "status"], name="cluster_hub_chip_status"),
            # No index on last_heartbeat_at (migration 0009): every heartbeat writes it, and an indexed column
            # makes each beat's update write a new entry in every index of the table instead of a HOT update.
        ]

    def __str__(self) -> str:
        return self.cpi


class Island(models.Model):
    """A high-bandwidth domain inside a cluster (one NVLink/HCCS/IB/RoCE domain)."""

    # island_unique_name (cluster, name) serves every lookup by cluster; no index of its own.
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="islands", db_index=False)
    cpi = models.CharField("CPI", max_length=140, unique=True)
    name = models.CharField(max_length=32)
    cards = models.PositiveIntegerField()
    fabric = models.CharField(max_length=12, choices=Fabric.choices)
    available_cards = models.PositiveIntegerField()
    unhealthy_cards = models.PositiveIntegerField(default=0)
    reported_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="island_unique_name"),
            models.CheckConstraint(condition=Q(cards__gt=0), name="island_cards_positive"),
            models.CheckConstraint(condition=Q(available_cards__lte=F("cards")), name="island_k2_le_k1"),
            models.CheckConstraint(
                condition=Q(unhealthy_cards__lte=F("cards")), name="island_unhealthy_le_cards"
            ),
        ]

    def __str__(self) -> str:
        return self.cpi


class IssuedIdentifier(models.Model):
    """Every compute identifier ever issued. The primary key makes reuse impossible even if a cluster
    row were removed by hand."""

    class Kind(models.TextChoices):
        CLUSTER = "cluster", _("Cluster")
        ISLAND = "island", _("Island")

    cpi = models.CharField("CPI", max_length=140, primary_key=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    operator = models.ForeignKey(Organisation, on_delete=models.PROTECT, related_name="+")
    issued_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.cpi


class ClusterStatusChange(models.Model):
    """Append-only history of a cluster's status: who, when, why."""

    # status_change_cluster_time (cluster, -changed_at) serves every lookup by cluster.
    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="status_changes", db_index=False
    )
    from_status = models.CharField(max_length=12, choices=ClusterStatus.choices, blank=True)
    to_status = models.CharField(max_length=12, choices=ClusterStatus.choices)
    changed_at = models.DateTimeField()
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_token = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["-changed_at", "-pk"]
        indexes = [models.Index(fields=["cluster", "-changed_at"], name="status_change_cluster_time")]

    def __str__(self) -> str:
        return f"{self.cluster_id}: {self.from_status or '∅'} → {self.to_status}"


class ClusterMaintenance(models.Model):
    """Maintenance an operator announces for a cluster over ``[starts_at, ends_at)``.

    Written once and never edited: ``announced_at`` is when the platform recorded it (never the operator's
    say-so), so whether it was announced far enough ahead (``CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS`` before
    it starts, and before a lease was accepted) is decided from the platform's own clock. SLA attribution
    (broker.services.sla) excludes such windows from a lease's lost time."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="maintenance_windows")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    announced_at = models.DateTimeField()
    reason = models.CharField(max_length=500)
    announced_by = models.CharField(max_length=200)

    class Meta:
        ordering = ["cluster_id", "starts_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="maintenance_window"),
        ]
        indexes = [models.Index(fields=["cluster", "starts_at"], name="maintenance_cluster_start")]

    def __str__(self) -> str:
        return f"maintenance of {self.cluster_id} [{self.starts_at}, {self.ends_at})"
