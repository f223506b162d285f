"""Federation's REST API: thin views over federation.services and federation.selectors.

Reads of the public catalog (hubs, latencies, accelerators, standard cards, resolution) are open to
every authenticated organisation. Cluster management is scoped to the caller's own clusters: another
operator's cluster answers 404 exactly like a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import django_filters
from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import URLValidator
from django.db.models import Prefetch, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.context import actor_from_request
from core.api.fields import AwareDateTimeField
from core.api.pagination import PAGE_SCHEMA, PAGE_SIZE_SCHEMA, StandardPagination
from core.api.permissions import IsOperator, IsOrganisationMember
from core.api.strict import JsonBody
from core.errors import PermissionDeniedError
from federation import identifiers, selectors, services
from federation.api import serializers as out
from federation.api.render import Output
from federation.api.schema import ClusterIdentifierField, HubCodeField, SegmentField, segment_grammar
from federation.models import (
    REPORTABLE_HEALTH,
    Accelerator,
    Cluster,
    ClusterMaintenance,
    ClusterStatus,
    ClusterStatusChange,
    Fabric,
    HubLatency,
    Island,
    StandardCard,
)
from federation.types import IslandReport, IslandSpec, LatencyMeasurement

TAG_CATALOG = "catalog"
TAG_CLUSTERS = "clusters"


class IslandInput(serializers.Serializer):
    name = SegmentField(max_length=32, help_text="Island segment: 1–32 of a–z, 0–9, inner hyphens.")
    cards = serializers.IntegerField(min_value=1, max_value=1_000_000)
    fabric = serializers.ChoiceField(choices=Fabric.choices)


# --- Catalog ----------------------------------------------------------------------------------------


class HubListApi(generics.ListAPIView):
    permission_classes = [IsOrganisationMember]
    serializer_class = out.HubOutput
    queryset = selectors.hub_list()

    @extend_schema(operation_id="hubs_list", tags=[TAG_CATALOG])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class HubLatencyFilter(django_filters.FilterSet):
    source = django_filters.CharFilter(field_name="source__code")
    target = django_filters.CharFilter(field_name="target__code")
    origin = django_filters.ChoiceFilter(choices=HubLatency.Origin.choices)

    class Meta:
        model = HubLatency
        fields = ["source", "target", "origin"]


class HubLatencyListApi(generics.ListAPIView):
    """The hub latency matrix, one row per ordered pair."""

    permission_classes = [IsOrganisationMember]
    serializer_class = out.HubLatencyOutput
    filterset_class = HubLatencyFilter
    queryset = selectors.hub_latency_list()

    @extend_schema(operation_id="hub_latencies_list", tags=[TAG_CATALOG])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


MEASUREMENT_CLOCK_SKEW = timedelta(minutes=5)
MEASUREMENT_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


class IsOperatorOrPlatform(IsOrganisationMember):
    """An operator (its agents report what they measure) or the platform."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        organisation = actor_from_request(request).organisation
        if not (organisation.is_operator or organisation.is_platform):
            raise PermissionDeniedError(
                _("Only operators and the platform can report latencies."), code="not_an_operator"
            )
        return True


class HubLatencyMeasureApi(APIView):
    """Record measured round-trip latencies; they replace the seeded policy tiers and distance estimates.
    The platform may report any pair; an operator's agent only pairs measured from a hub where the
    operator runs a cluster (otherwise 403 latency_source_not_operated). Older measurements than the
    stored one are ignored."""

    permission_classes = [IsOperatorOrPlatform]

    class Input(serializers.Serializer):
        class Measurement(serializers.Serializer):
            source = HubCodeField(max_length=8)  # type: ignore[assignment]  # the field is named `source`
            target = HubCodeField(max_length=8)
            latency_ms = serializers.DecimalField(max_digits=8, decimal_places=3, min_value=0)
            measured_at = AwareDateTimeField(help_text="From 2000 on, and not ahead of the server's clock.")

            def validate_measured_at(self, value: datetime) -> datetime:
                # A measurement from the future would stay the newest one and freeze the pair's latency
                # (older ones are ignored); one before 2000 is a broken clock (and, in the platform's
                # zone, a pre-1901 instant renders with a local-mean-time offset no client parses).
                if value > timezone.now() + MEASUREMENT_CLOCK_SKEW:
                    raise serializers.ValidationError(_("Is ahead of the server's clock."), code="in_future")
                if value < MEASUREMENT_EARLIEST:
                    raise serializers.ValidationError(_("Is before 2000."), code="too_old")
                return value

        measurements = Measurement(many=True, allow_empty=False, max_length=1000)  # type: ignore[call-arg]
        symmetric = serializers.BooleanField(default=True)

    @extend_schema(
        operation_id="hub_latencies_measure",
        request=Input,
        responses={200: out.HubLatencyOutput(many=True)},
        tags=[TAG_CATALOG],
    )
    def post(self, request: Request) -> Response:
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        rows = services.hub_latency_record(
            measurements=[LatencyMeasurement(**m) for m in data.validated_data["measurements"]],
            symmetric=data.validated_data["symmetric"],
            reporter=actor_from_request(request).organisation,
        )
        return Response(out.HubLatencyOutput(rows, many=True).data)


class AcceleratorFilter(django_filters.FilterSet):
    vendor = django_filters.CharFilter(field_name="vendor", lookup_expr="iexact")
    spec_status = django_filters.ChoiceFilter(choices=Accelerator.SpecStatus.choices)

    class Meta:
        model = Accelerator
        fields = ["vendor", "spec_status"]


class AcceleratorListApi(generics.ListAPIView):
    """The accelerator catalog; `standard_card_factor` is computed against the standard card in force."""

    permission_classes = [IsOrganisationMember]
    serializer_class = out.AcceleratorOutput
    filterset_class = AcceleratorFilter
    queryset = selectors.accelerator_list()

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "standard": selectors.standard_card_current()}

    @extend_schema(operation_id="accelerators_list", tags=[TAG_CATALOG])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class AcceleratorDetailApi(APIView):
    permission_classes = [IsOrganisationMember]

    @extend_schema(
        operation_id="accelerators_get", responses={200: out.AcceleratorOutput}, tags=[TAG_CATALOG]
    )
    def get(self, request: Request, slug: str) -> Response:
        accelerator = generics.get_object_or_404(selectors.accelerator_list(), slug=slug)
        context = {"standard": selectors.standard_card_current()}
        return Response(out.AcceleratorOutput(accelerator, context=context).data)


class StandardCardListApi(generics.ListAPIView):
    """Every version of the standard-card definition; `in_force` marks the one used now."""

    permission_classes = [IsOrganisationMember]
    serializer_class = out.StandardCardOutput
    queryset = StandardCard.objects.all()

    def paginate_queryset(self, queryset: Any) -> Any:
        page = super().paginate_queryset(queryset)
        if page is None:
            return None
        current = selectors.standard_card_current()
        for card in page:
            card.in_force = card.pk == current.pk
        return list(page)

    @extend_schema(operation_id="standard_cards_list", tags=[TAG_CATALOG])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


# --- Resolution -------------------------------------------------------------------------------------


class ResolveApi(APIView):
    """Resolve a compute identifier hierarchically: `cpi:<operator>` lists the operator's hubs and
    clusters, `cpi:<operator>:<hub>` its clusters in that hub, and a full cluster or island identifier
    returns the resource description (chip spec, standard-card equivalents, islands, K1/K2, status,
    last heartbeat; the dispatch endpoint only for its own operator)."""

    permission_classes = [IsOrganisationMember]

    @extend_schema(
        operation_id="resolve",
        parameters=[
            OpenApiParameter(
                "identifier", str, OpenApiParameter.PATH, description="e.g. cpi:cucc:nx:zw-ai01"
            ),
            OpenApiParameter("page", PAGE_SCHEMA, description="Page of clusters (operator and hub levels)."),
            OpenApiParameter("page_size", PAGE_SIZE_SCHEMA, description="Clusters per page (max 500)."),
        ],
        responses={200: out.ResolutionOutput},
        tags=[TAG_CATALOG],
    )
    def get(self, request: Request, identifier: str) -> Response:
        viewer = actor_from_request(request).organisation
        paginator = StandardPagination()
        paginator.paging_check(request)
        resolution = selectors.resolve(identifier=identifier, viewer=viewer)
        data: dict[str, Any] = {
            "identifier": resolution.identifier,
            "level": resolution.level,
            "operator": {"slug": resolution.operator.slug, "name": resolution.operator.name},
            "hubs": None,
            "clusters": None,
            "cluster": None,
            "island": None,
        }
        if resolution.clusters is not None:
            page = paginator.paginate_queryset(resolution.clusters, request, view=self)
            data["clusters"] = paginator.get_paginated_response(_CLUSTER_SUMMARY.many(page or [])).data
        if resolution.hubs is not None:
            data["hubs"] = _HUB_SUMMARY.many(resolution.hubs)
        if resolution.cluster is not None:
            data["cluster"] = _CLUSTER_DESCRIPTION.one(resolution.cluster)
        if resolution.island is not None:
            data["island"] = _ISLAND_DESCRIPTION.one(resolution.island)
        return Response(data)


# Resolution renders its declared output serializers without instantiating them per request
# (federation.api.render): the same fields, bound once.
_CLUSTER = Output(out.ClusterOutput)
_CLUSTER_SUMMARY = Output(out.ClusterSummaryOutput)
_HUB_SUMMARY = Output(out.HubSummaryOutput)
_CLUSTER_DESCRIPTION = Output(out.ClusterDescriptionOutput)
_ISLAND_DESCRIPTION = Output(out.IslandDescriptionOutput)


# --- Cluster management (own clusters only) ---------------------------------------------------------


def _own_clusters(request: Request) -> QuerySet[Cluster]:
    operator = actor_from_request(request).organisation
    return selectors.cluster_list_for_operator(operator=operator).prefetch_related(
        Prefetch("islands", queryset=Island.objects.order_by("name"))
    )


class ClusterFilter(django_filters.FilterSet):
    hub = django_filters.CharFilter(field_name="hub__code")
    accelerator = django_filters.CharFilter(field_name="accelerator__slug")
    status = django_filters.ChoiceFilter(choices=ClusterStatus.choices)

    class Meta:
        model = Cluster
        fields = ["hub", "accelerator", "status"]


class ClusterListApi(generics.ListAPIView):
    """List the caller's clusters, or register one (POST)."""

    permission_classes = [IsOperator]
    serializer_class = out.ClusterOutput
    filterset_class = ClusterFilter

    class Input(serializers.Serializer):
        cpi = ClusterIdentifierField(max_length=140, help_text="cpi:<your operator>:<hub>:<cluster>")
        site = serializers.CharField(max_length=100)
        accelerator = serializers.CharField(
            max_length=100,
            help_text="Catalog slug (e.g. nvidia-h800-sxm5-80gb) or an alias of exactly one model (e.g. H20). "
            "An alias of several models (bare H100: SXM5 or PCIe) is 400 accelerator_ambiguous, listing "
            "the candidates.",
        )
        endpoint_url = serializers.URLField(max_length=500, required=False, allow_blank=True, default="")
        islands = IslandInput(  # type: ignore[call-arg]  # DRF ≥ 3.15 accepts max_length; the stubs lag
            many=True, allow_empty=False, max_length=settings.CARDHOUR_MAX_ISLANDS_PER_CLUSTER
        )

    queryset = Cluster.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self) -> QuerySet[Cluster]:
        return _own_clusters(self.request)

    @extend_schema(operation_id="clusters_list", tags=[TAG_CLUSTERS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="clusters_register",
        request=Input,
        responses={201: out.ClusterOutput, 200: out.ClusterOutput},
        description="Register a cluster with its islands. Repeating an identical registration returns "
        "the existing cluster with 200; the same identifier with a different body is 409 identifier_taken.",
        tags=[TAG_CLUSTERS],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        values = _registration_plain(request.data)
        if values is None:  # anything unusual, and every error, is the serializer's
            data = self.Input(data=request.data)
            data.is_valid(raise_exception=True)
            values = data.validated_data
        cluster, created = services.cluster_register_idempotent(
            actor=actor,
            operator=actor.organisation,
            cpi=values["cpi"],
            site=values["site"],
            accelerator_slug=values["accelerator"],
            endpoint_url=values["endpoint_url"],
            islands=[IslandSpec(**island) for island in values["islands"]],
        )
        if not created:  # a retry: show the cluster as it is stored (a new one comes with its islands)
            cluster = _own_clusters(request).get(pk=cluster.pk)
        return Response(_CLUSTER.one(cluster), status=status.HTTP_201_CREATED if created else 200)


# A registration body in its plain form is checked here without building the Input serializer (which
# deep-copies its fields and runs each island through a nested serializer: about a third of a registration's
# CPU). ClusterListApi.Input stays the one declaration (schema, validation, every error answer): this
# accepts only bodies whose every value is of the declared JSON type, already trimmed, ASCII and within the
# declared bounds, and then returns what the serializer's validated_data would hold; anything else returns
# None and goes through the serializer. tests/federation/test_api_clusters.py holds the two side by side.
_INPUT_FIELDS = ClusterListApi.Input._declared_fields
_ISLAND_FIELDS = IslandInput._declared_fields
_FABRICS = frozenset(Fabric.values)
_url_check = URLValidator()


def _plain_text(value: Any, field: serializers.Field, *, blank: bool = False) -> bool:
    # DRF's CharField would trim, refuse blank, NUL and surrogates, and bound the length: a value it
    # would change or might refuse is not plain.
    return (
        type(value) is str
        and value.isascii()
        and (bool(value) or blank)
        and value == value.strip()
        and "\x00" not in value
        and len(value) <= field.max_length  # type: ignore[attr-defined]
    )


def _registration_plain(data: Any) -> dict[str, Any] | None:
    """The registration body's validated data, as ``ClusterListApi.Input`` would return it, when the body is
    plainly valid; None when the serializer has to look at it."""
    if type(data) is not JsonBody:
        return None
    cpi, site, chip = data.get("cpi"), data.get("site"), data.get("accelerator")
    endpoint_url = data.get("endpoint_url", "")
    islands = data.get("islands")
    if not (
        _plain_text(cpi, _INPUT_FIELDS["cpi"])
        and _plain_text(site, _INPUT_FIELDS["site"])
        and _plain_text(chip, _INPUT_FIELDS["accelerator"])
        and _plain_text(endpoint_url, _INPUT_FIELDS["endpoint_url"], blank=True)
        and type(islands) is list
        and 0 < len(islands) <= _INPUT_FIELDS["islands"].max_length  # type: ignore[attr-defined]
    ):
        return None
    if endpoint_url:
        try:
            _url_check(endpoint_url)
        except DjangoValidationError:
            return None
    name_field, cards_field = _ISLAND_FIELDS["name"], _ISLAND_FIELDS["cards"]
    least, most = cards_field.min_value, cards_field.max_value  # type: ignore[attr-defined]
    parsed = []
    for island in islands:
        if type(island) is not dict:
            return None
        name, cards, fabric = island.get("name"), island.get("cards"), island.get("fabric")
        if not (
            _plain_text(name, name_field)
            and type(cards) is int
            and least <= cards <= most
            and type(fabric) is str
            and fabric in _FABRICS
        ):
            return None
        parsed.append({"name": name, "cards": cards, "fabric": fabric})
    return {"cpi": cpi, "site": site, "accelerator": chip, "endpoint_url": endpoint_url, "islands": parsed}


class ClusterDetailApi(APIView):
    permission_classes = [IsOperator]

    class Input(serializers.Serializer):
        site = serializers.CharField(max_length=100, required=False)
        endpoint_url = serializers.URLField(max_length=500, required=False, allow_blank=True)
        status = serializers.ChoiceField(choices=ClusterStatus.choices, required=False)
        reason = serializers.CharField(max_length=500, required=False, default="")

    @extend_schema(operation_id="clusters_get", responses={200: out.ClusterOutput}, tags=[TAG_CLUSTERS])
    def get(self, request: Request, cpi: str) -> Response:
        operator = actor_from_request(request).organisation
        cluster = selectors.cluster_get_for_operator(operator=operator, cpi=cpi)
        return Response(out.ClusterOutput(_own_clusters(request).get(pk=cluster.pk)).data)

    @extend_schema(
        operation_id="clusters_update", request=Input, responses={200: out.ClusterOutput}, tags=[TAG_CLUSTERS]
    )
    def patch(self, request: Request, cpi: str) -> Response:
        actor = actor_from_request(request)
        cluster = selectors.cluster_get_for_operator(operator=actor.organisation, cpi=cpi)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        services.cluster_update(actor=actor, cluster=cluster, **data.validated_data)
        return Response(out.ClusterOutput(_own_clusters(request).get(pk=cluster.pk)).data)


class ClusterStatusHistoryApi(generics.ListAPIView):
    permission_classes = [IsOperator]
    serializer_class = out.StatusChangeOutput
    queryset = ClusterStatusChange.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self) -> QuerySet[Any]:
        operator = actor_from_request(self.request).organisation
        cluster = selectors.cluster_get_for_operator(operator=operator, cpi=self.kwargs["cpi"])
        return selectors.cluster_status_history(cluster=cluster)

    @extend_schema(operation_id="clusters_status_history", tags=[TAG_CLUSTERS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class ClusterMaintenanceApi(generics.ListAPIView):
    """Maintenance you announced for one of your clusters, latest start first; POST announces a window.

    Announced maintenance is excluded from the lost time of a lease's SLA (so no credit is owed for it) only
    when it was announced at least CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS (24 h by default) before it starts
    and before the lease was accepted; the platform's clock decides. An announcement is never edited."""

    permission_classes = [IsOperator]
    serializer_class = out.MaintenanceOutput
    queryset = ClusterMaintenance.objects.none()  # for the schema; requests use get_queryset

    class Input(serializers.Serializer):
        starts_at = AwareDateTimeField(help_text="In the future, with an offset.")
        ends_at = AwareDateTimeField(help_text="After starts_at; at most 7 days later.")
        reason = serializers.CharField(
            max_length=500, help_text="What the maintenance is, for buyers and staff."
        )

    def get_queryset(self) -> QuerySet[Any]:
        operator = actor_from_request(self.request).organisation
        cluster = selectors.cluster_get_for_operator(operator=operator, cpi=self.kwargs["cpi"])
        return selectors.cluster_maintenance_list(cluster=cluster)

    @extend_schema(operation_id="clusters_maintenance_list", tags=[TAG_CLUSTERS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="clusters_maintenance_announce",
        request=Input,
        responses={201: out.MaintenanceOutput},
        tags=[TAG_CLUSTERS],
    )
    def post(self, request: Request, cpi: str) -> Response:
        actor = actor_from_request(request)
        cluster = selectors.cluster_get_for_operator(operator=actor.organisation, cpi=cpi)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        window = services.cluster_maintenance_announce(actor=actor, cluster=cluster, **data.validated_data)
        return Response(out.MaintenanceOutput(window).data, status=status.HTTP_201_CREATED)


class IslandAddApi(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="islands_add",
        request=IslandInput,
        responses={201: out.IslandOutput},
        tags=[TAG_CLUSTERS],
    )
    def post(self, request: Request, cpi: str) -> Response:
        actor = actor_from_request(request)
        cluster = selectors.cluster_get_for_operator(operator=actor.organisation, cpi=cpi)
        data = IslandInput(data=request.data)
        data.is_valid(raise_exception=True)
        island = services.island_add(actor=actor, cluster=cluster, spec=IslandSpec(**data.validated_data))
        return Response(out.IslandOutput(island).data, status=status.HTTP_201_CREATED)


class IslandUpdateApi(APIView):
    permission_classes = [IsOperator]

    class Input(serializers.Serializer):
        cards = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False)
        fabric = serializers.ChoiceField(choices=Fabric.choices, required=False)

    @extend_schema(
        operation_id="islands_update", request=Input, responses={200: out.IslandOutput}, tags=[TAG_CLUSTERS]
    )
    def patch(self, request: Request, cpi: str, name: str) -> Response:
        actor = actor_from_request(request)
        island = selectors.island_get_for_operator(operator=actor.organisation, cpi=cpi, name=name)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        island = services.island_update(actor=actor, island=island, **data.validated_data)
        return Response(out.IslandOutput(island).data)


class HeartbeatApi(APIView):
    """An operator agent's periodic report: the cluster is alive, with K2 (available) and unhealthy cards
    per island. `available_cards` is the island's healthy cards minus those busy with anything that is
    not a Cardhour lease: cards running (or reserved for) Cardhour leases count as available, because
    the platform subtracts its own holds itself. Until the report expires (this beat + interval × missed
    limit, 90 s by default) no lease may start on more than that; later starts use the declared cards.
    Islands not named keep their last figures. Send every CARDHOUR_HEARTBEAT_INTERVAL_SECONDS (30 s by
    default); a cluster that misses three in a row goes offline and comes back with the next beat. Safe to
    retry: a beat not newer than the last applied one is acknowledged with `applied: false`."""

    throttle_purpose = "heartbeat"  # its own budget per token (core.api.throttling)

    permission_classes = [IsOperator]

    class Input(serializers.Serializer):
        class IslandLine(serializers.Serializer):
            # Checked here, before a stale beat is acknowledged without reading its islands.
            name = SegmentField(max_length=32, validators=[segment_grammar])
            available_cards = serializers.IntegerField(min_value=0, help_text=out.K2_HELP)
            unhealthy_cards = serializers.IntegerField(
                min_value=0, default=0, help_text="Cards out of service; available + unhealthy ≤ cards."
            )

        sent_at = AwareDateTimeField(help_text="The agent's clock when it sent the beat (with offset).")
        health = serializers.ChoiceField(choices=REPORTABLE_HEALTH)
        islands = IslandLine(many=True, max_length=settings.CARDHOUR_MAX_ISLANDS_PER_CLUSTER, default=list)  # type: ignore[call-arg]

    class Output(serializers.Serializer):
        cpi = serializers.CharField(source="cluster_cpi")
        status = serializers.CharField()
        applied = serializers.BooleanField()
        detail = serializers.CharField()
        server_time = serializers.DateTimeField()
        interval_seconds = serializers.IntegerField()

    @extend_schema(
        operation_id="clusters_heartbeat", request=Input, responses={200: Output}, tags=[TAG_CLUSTERS]
    )
    def post(self, request: Request, cpi: str) -> Response:
        actor = actor_from_request(request)
        values = _heartbeat_plain(request.data)
        if values is not None:  # the cluster is found and locked in the service's one read
            result = services.heartbeat_record_for_operator(
                actor=actor,
                operator=actor.organisation,
                cpi=cpi,
                sent_at=values["sent_at"],
                health=values["health"],
                islands=values["islands"],
            )
        else:  # anything unusual, and every error in the body, is the serializer's (after a 404 for the cluster)
            cluster = selectors.cluster_get_for_operator(operator=actor.organisation, cpi=cpi)
            data = self.Input(data=request.data)
            data.is_valid(raise_exception=True)
            values = data.validated_data
            result = services.heartbeat_record(
                actor=actor,
                cluster=cluster,
                sent_at=values["sent_at"],
                health=values["health"],
                islands=[IslandReport(**line) for line in values["islands"]],
            )
        return Response(
            _HEARTBEAT_OUTPUT.one(
                _HeartbeatAnswer(
                    cluster_cpi=result.cluster_cpi,
                    status=result.status,
                    applied=result.applied,
                    detail=result.detail,
                    server_time=timezone.now(),
                    interval_seconds=settings.CARDHOUR_HEARTBEAT_INTERVAL_SECONDS,
                )
            )
        )


class HeartbeatBatchApi(APIView):
    """Many clusters' heartbeats in one request: an agent that runs many clusters (an operator's site, a
    region) reports them together, so the request, its authentication and its transaction are paid once, not
    per cluster. Each beat is exactly what `POST /clusters/{cpi}/heartbeats` takes, with the cluster's `cpi`,
    and has exactly that endpoint's effect and answer: the beats are independent, so one that fails (an unknown
    or retired cluster, an unknown island, impossible counts, a clock ahead) answers its error in its place in
    `results` (the code and message the single endpoint would answer) and leaves nothing of its own, while the
    others are applied. A body that is not a valid batch (a malformed beat, a cluster named twice, more than
    CARDHOUR_HEARTBEAT_BATCH_MAX beats) is a 400 and nothing is written. Safe to retry, as a single beat is:
    a beat not newer than the last one applied is acknowledged with `applied: false`, `detail: "stale"`. The
    batch has its own rate budget per token (`heartbeat_batch`), counted in requests."""

    throttle_purpose = "heartbeat_batch"  # its own budget per token (core.api.throttling)

    permission_classes = [IsOperator]

    class Input(serializers.Serializer):
        class Beat(HeartbeatApi.Input):
            cpi = serializers.CharField(
                max_length=140, help_text="The cluster: cpi:<your operator>:<hub>:<cluster>"
            )

        beats = Beat(  # type: ignore[call-arg]
            many=True, min_length=1, max_length=settings.CARDHOUR_HEARTBEAT_BATCH_MAX
        )

    class Output(serializers.Serializer):
        class Result(serializers.Serializer):
            class Error(serializers.Serializer):
                code = serializers.CharField()
                message = serializers.CharField()
                extra = serializers.DictField()

            cpi = serializers.CharField()
            status = serializers.CharField(
                allow_null=True, help_text="The cluster's status; null on an error."
            )
            applied = serializers.BooleanField()
            detail = serializers.CharField(
                help_text='"stale" for a beat not newer than the last one applied.'
            )
            error = Error(allow_null=True, help_text="Why this beat was refused; null when it was taken.")

        results = Result(many=True, help_text="One per beat, in the order of `beats`.")
        server_time = serializers.DateTimeField()
        interval_seconds = serializers.IntegerField()

    @extend_schema(
        operation_id="clusters_heartbeat_batch", request=Input, responses={200: Output}, tags=[TAG_CLUSTERS]
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        beats = _heartbeat_batch_plain(request.data)
        if beats is None:  # anything unusual, and every error in the body, is the serializer's
            data = self.Input(data=request.data)
            data.is_valid(raise_exception=True)
            beats = [
                services.HeartbeatBeat(
                    cpi=beat["cpi"],
                    sent_at=beat["sent_at"],
                    health=beat["health"],
                    islands=[IslandReport(**line) for line in beat["islands"]],
                )
                for beat in data.validated_data["beats"]
            ]
        outcomes = services.heartbeats_record_batch(actor=actor, operator=actor.organisation, beats=beats)
        results = []
        for outcome in outcomes:
            if outcome.error is not None:
                error = outcome.error
                results.append(
                    {
                        "cpi": outcome.cpi,
                        "status": None,
                        "applied": False,
                        "detail": "",
                        "error": {"code": error.code, "message": str(error.message), "extra": error.extra},
                    }
                )
            else:
                assert outcome.result is not None
                results.append(
                    {
                        "cpi": outcome.result.cluster_cpi,
                        "status": outcome.result.status,
                        "applied": outcome.result.applied,
                        "detail": outcome.result.detail,
                        "error": None,
                    }
                )
        return Response(
            {
                "results": results,
                "server_time": _SERVER_TIME.to_representation(timezone.now()),
                "interval_seconds": settings.CARDHOUR_HEARTBEAT_INTERVAL_SECONDS,
            }
        )


_SERVER_TIME = serializers.DateTimeField()


@dataclass(frozen=True)
class _HeartbeatAnswer:
    cluster_cpi: str
    status: str
    applied: bool
    detail: str
    server_time: datetime
    interval_seconds: int


_HEARTBEAT_OUTPUT = Output(HeartbeatApi.Output)

# A heartbeat body in its plain form is read here without building the Input serializer (for ten island lines
# the serializer took ~1.6 ms of CPU, this ~0.13 ms), as the registration's is above: HeartbeatApi.Input stays
# the one declaration (schema, validation, every error answer). This takes only bodies whose every value is of
# the declared JSON type and within the declared bounds (a time the declared field itself parses, a listed
# health, island names already trimmed and in the segment grammar, counts ints from 0 to an island's most
# cards) and returns what the serializer's validated_data would hold, the lines as IslandReports; anything
# else returns None and goes through the serializer. tests/federation/test_heartbeat_paths.py holds the two
# side by side, over the API too (status, answer and rows).
_BEAT_FIELDS = HeartbeatApi.Input._declared_fields
_BEAT_LINE_FIELDS = HeartbeatApi.Input.IslandLine._declared_fields
_HEALTHS = frozenset(value for value, _label in REPORTABLE_HEALTH)
# An island has at most this many cards (IslandInput), so a larger count is an error either way: its answer
# is left to the serializer and the service (an integer too long for DRF to print is DRF's `invalid`).
_PLAIN_COUNT_MAX = IslandInput._declared_fields["cards"].max_value  # type: ignore[attr-defined]


def _heartbeat_plain(data: Any) -> dict[str, Any] | None:
    """The heartbeat body's validated data, as ``HeartbeatApi.Input`` would return it (islands as
    IslandReports), when the body is plainly valid; None when the serializer has to look at it."""
    if type(data) is not JsonBody:
        return None
    return _beat_plain(data)


_BATCH_BEATS = HeartbeatBatchApi.Input._declared_fields["beats"]
_BATCH_CPI = HeartbeatBatchApi.Input.Beat._declared_fields["cpi"]


def _heartbeat_batch_plain(data: Any) -> list[services.HeartbeatBeat] | None:
    """A batch body's beats, as ``HeartbeatBatchApi.Input`` would validate them, when every beat is plainly
    valid (_beat_plain, and a cpi of at most the declared length); None when the serializer has to look."""
    if type(data) is not JsonBody or set(data) != {"beats"}:
        return None
    beats = data["beats"]
    if type(beats) is not list or not 1 <= len(beats) <= _BATCH_BEATS.max_length:  # type: ignore[attr-defined]
        return None
    plain = []
    for beat in beats:
        if type(beat) is not dict:
            return None
        cpi = beat.get("cpi")
        if not (type(cpi) is str and _plain_text(cpi, _BATCH_CPI)):
            return None
        values = _beat_plain(beat)
        if values is None:
            return None
        plain.append(services.HeartbeatBeat(cpi=cpi, **values))
    return plain


def _beat_plain(data: dict[str, Any]) -> dict[str, Any] | None:
    """One beat's validated data (sent_at, health, islands as IslandReports) when it is plainly valid."""
    sent_at, health, lines = data.get("sent_at"), data.get("health"), data.get("islands", [])
    if not (
        type(sent_at) is str
        and type(health) is str
        and health in _HEALTHS
        and type(lines) is list
        and len(lines) <= _BEAT_FIELDS["islands"].max_length  # type: ignore[attr-defined]
    ):
        return None
    try:
        at = _BEAT_FIELDS["sent_at"].to_internal_value(sent_at)
    except (serializers.ValidationError, ValueError, TypeError):
        return None
    name_field = _BEAT_LINE_FIELDS["name"]
    reports = []
    for line in lines:
        if type(line) is not dict:
            return None
        name, available, unhealthy = (
            line.get("name"),
            line.get("available_cards"),
            line.get("unhealthy_cards", 0),
        )
        if not (
            type(name) is str
            and _plain_text(name, name_field)
            and identifiers.is_segment(name)
            and type(available) is int
            and 0 <= available <= _PLAIN_COUNT_MAX
            and type(unhealthy) is int
            and 0 <= unhealthy <= _PLAIN_COUNT_MAX
        ):
            return None
        reports.append(IslandReport(name=name, available_cards=available, unhealthy_cards=unhealthy))
    return {"sent_at": at, "health": health, "islands": reports}
