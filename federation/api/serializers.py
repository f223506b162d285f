"""Output serializers shared by federation's API views (inputs live on each view)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from federation import selectors
from federation.models import (
    Accelerator,
    Cluster,
    ClusterMaintenance,
    ClusterStatusChange,
    Hub,
    HubLatency,
    Island,
    StandardCard,
)


class HubOutput(serializers.ModelSerializer):
    class Meta:
        model = Hub
        fields = ["code", "name", "name_zh", "region"]


class HubLatencyOutput(serializers.ModelSerializer):
    source = serializers.CharField(source="source.code")  # type: ignore[assignment]  # the field is named `source`
    target = serializers.CharField(source="target.code")

    class Meta:
        model = HubLatency
        fields = ["source", "target", "latency_ms", "origin", "measured_at", "updated_at"]


class StandardCardOutput(serializers.ModelSerializer):
    in_force = serializers.BooleanField()

    class Meta:
        model = StandardCard
        fields = ["version", "dense_fp16_tflops", "effective_from", "note", "in_force"]


class AcceleratorOutput(serializers.ModelSerializer):
    """Needs ``context["standard"]``: the standard card the factor is computed against."""

    standard_card_factor = serializers.SerializerMethodField()

    class Meta:
        model = Accelerator
        fields = [
            "slug",
            "vendor",
            "model",
            "aliases",
            "spec_status",
            "dense_fp16_tflops",
            "memory_gb",
            "memory_bandwidth_gbps",
            "interconnect",
            "default_fabric",
            "standard_card_factor",
            "source",
        ]

    @extend_schema_field(serializers.DecimalField(max_digits=10, decimal_places=4, allow_null=True))
    def get_standard_card_factor(self, accelerator: Accelerator) -> str | None:
        factor = selectors.standard_card_factor(
            tflops=accelerator.dense_fp16_tflops, standard=self.context["standard"]
        )
        return None if factor is None else str(factor)


# What K2 means, for every field that carries it (federation.selectors has the rule in code).
K2_HELP = (
    "K2, as the operator's agent last reported it: the healthy cards Cardhour may hold, i.e. the cards minus "
    "the unhealthy ones minus those busy with anything that is not a Cardhour lease. Cards running (or "
    "reserved for) Cardhour leases count as available: the platform subtracts its own holds itself, once. "
    "It binds every lease start before the report expires (last heartbeat + "
    "CARDHOUR_HEARTBEAT_INTERVAL_SECONDS × CARDHOUR_HEARTBEAT_MISSED_LIMIT, 90 s by default); later starts "
    "use the declared cards."
)


class IslandOutput(serializers.ModelSerializer):
    class Meta:
        model = Island
        fields = ["cpi", "name", "cards", "fabric", "available_cards", "unhealthy_cards", "reported_at"]
        extra_kwargs = {
            "available_cards": {"help_text": K2_HELP},
            "reported_at": {"help_text": "The sent_at of the heartbeat that last reported this island."},
        }


class ClusterOutput(serializers.ModelSerializer):
    """An operator's own cluster, as it manages it (includes the dispatch endpoint)."""

    operator = serializers.CharField(source="operator.slug")
    hub = serializers.CharField(source="hub.code")
    accelerator = serializers.CharField(source="accelerator.slug")
    islands = IslandOutput(many=True)

    class Meta:
        model = Cluster
        fields = [
            "cpi",
            "operator",
            "hub",
            "site",
            "accelerator",
            "endpoint_url",
            "status",
            "offline_cause",
            "health",
            "total_cards",
            "available_cards",
            "last_heartbeat_at",
            "registered_at",
            "updated_at",
            "islands",
        ]
        extra_kwargs = {"available_cards": {"help_text": "K2: the sum over the islands (see an island's)."}}


class ClusterSummaryOutput(serializers.ModelSerializer):
    """A cluster in a resolution listing: public catalog data, no endpoint."""

    hub = serializers.CharField(source="hub.code")
    accelerator = serializers.CharField(source="accelerator.slug")

    class Meta:
        model = Cluster
        fields = [
            "cpi",
            "hub",
            "site",
            "accelerator",
            "status",
            "health",
            "total_cards",
            "available_cards",
            "last_heartbeat_at",
        ]
        extra_kwargs = {"available_cards": {"help_text": "K2: the sum over the islands (see an island's)."}}


class StatusChangeOutput(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = ClusterStatusChange
        fields = ["from_status", "to_status", "changed_at", "actor", "reason"]


class MaintenanceOutput(serializers.ModelSerializer):
    notice_met = serializers.SerializerMethodField(
        help_text="Whether it was announced at least CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS before it starts."
    )

    class Meta:
        model = ClusterMaintenance
        fields = ["id", "starts_at", "ends_at", "announced_at", "announced_by", "reason", "notice_met"]

    def get_notice_met(self, obj: ClusterMaintenance) -> bool:
        return obj.announced_at <= obj.starts_at - timedelta(
            hours=settings.CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS
        )


# --- Resolution (built from federation.types dataclasses) ---------------------------------------


class ChipSpecOutput(serializers.Serializer):
    slug = serializers.CharField()
    vendor = serializers.CharField()
    model = serializers.CharField()
    spec_status = serializers.CharField()
    dense_fp16_tflops = serializers.DecimalField(max_digits=10, decimal_places=3, allow_null=True)
    memory_gb = serializers.DecimalField(max_digits=8, decimal_places=1, allow_null=True)
    memory_bandwidth_gbps = serializers.DecimalField(max_digits=10, decimal_places=1, allow_null=True)
    interconnect = serializers.CharField()
    standard_card_factor = serializers.DecimalField(max_digits=10, decimal_places=4, allow_null=True)


class IslandDescriptionOutput(serializers.Serializer):
    cpi = serializers.CharField()
    name = serializers.CharField()
    fabric = serializers.CharField()
    cards = serializers.IntegerField(help_text="K1: cards in the island.")
    available_cards = serializers.IntegerField(help_text=K2_HELP)
    unhealthy_cards = serializers.IntegerField()
    standard_cards = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)
    reported_at = serializers.DateTimeField(allow_null=True)


class ClusterDescriptionOutput(serializers.Serializer):
    cpi = serializers.CharField()
    operator = serializers.CharField()
    operator_name = serializers.CharField()
    hub = serializers.CharField()
    site = serializers.CharField()
    chip = ChipSpecOutput()
    status = serializers.CharField()
    health = serializers.CharField()
    total_cards = serializers.IntegerField(help_text="K1: total cards.")
    available_cards = serializers.IntegerField(help_text="K2: the sum over the islands (see an island's).")
    total_standard_cards = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)
    available_standard_cards = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    endpoint_url = serializers.CharField(
        allow_null=True, help_text="Shown to the cluster's own operator only."
    )
    islands = IslandDescriptionOutput(many=True)


class HubSummaryOutput(serializers.Serializer):
    hub = serializers.CharField()
    clusters = serializers.IntegerField()
    total_cards = serializers.IntegerField()
    available_cards = serializers.IntegerField()


class ClusterPageOutput(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = ClusterSummaryOutput(many=True)


class ResolutionOutput(serializers.Serializer):
    identifier = serializers.CharField()
    level = serializers.ChoiceField(choices=["operator", "hub", "cluster", "island"])
    operator = serializers.DictField(child=serializers.CharField())
    hubs = HubSummaryOutput(many=True, allow_null=True, help_text="Operator level only.")
    clusters = ClusterPageOutput(allow_null=True, help_text="Operator and hub levels: a page of clusters.")
    cluster = ClusterDescriptionOutput(allow_null=True, help_text="Cluster and island levels.")
    island = IslandDescriptionOutput(allow_null=True, help_text="Island level only.")
