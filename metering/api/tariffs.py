"""Tariffs and price cards over REST: thin views over metering's tariff services and selectors.

Every organisation may read the presets and its own tariffs; only operators define tariffs and set price
cards, and only for themselves: another operator's tariff or cluster answers 404 like a missing one.
Times of day are ``"HH:MM"`` in the tariff's zone (``"24:00"`` ends a window at midnight), weekdays are
``mon``…``sun``, months 1–12; money and multipliers are decimal strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import QuerySet
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.context import actor_from_request
from core.api.fields import AwareDateTimeField
from core.api.permissions import IsOperator, IsOrganisationMember
from federation import selectors as federation_selectors
from metering.models import ALL_MONTHS, ALL_WEEKDAYS, Band, PriceCard, Tariff, TariffVersion
from metering.selectors import tariffs as selectors
from metering.services import tariffs as services
from metering.tariffs import (
    DEFAULT_TIME_ZONE,
    MAX_WINDOWS,
    TariffSpec,
    WindowSpec,
    minute_label,
    months_mask,
    weekdays_mask,
)

TAG_TARIFFS = "tariffs"
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
STRIP_FIRST_DATE = date(1971, 1, 1)
STRIP_LAST_DATE = date(2199, 12, 31)
LocalDate = date  # a serializer field below is named `date`


# --- Fields and shared serializers ------------------------------------------------------------------


def _minutes(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def _weekday_names(mask: int) -> list[str]:
    return [name for i, name in enumerate(WEEKDAYS) if mask >> i & 1]


def _month_numbers(mask: int) -> list[int]:
    return [month for month in range(1, 13) if mask >> (month - 1) & 1]


class BandInput(serializers.Serializer):
    band = serializers.ChoiceField(choices=Band.choices)
    multiplier = serializers.DecimalField(
        max_digits=8,
        decimal_places=4,
        min_value=Decimal("0.0001"),
        help_text="Multiplier on the price card's rate (> 0).",
    )


class WindowInput(serializers.Serializer):
    band = serializers.ChoiceField(choices=Band.choices)
    start = serializers.RegexField(
        r"^(?:[01]\d|2[0-3]):[0-5]\d\Z", max_length=5, help_text="Local time of day, HH:MM (00:00–23:59)."
    )
    end = serializers.RegexField(
        r"^(?:(?:[01]\d|2[0-3]):[0-5]\d|24:00)\Z",
        max_length=5,
        help_text="HH:MM, exclusive; 24:00 is midnight. An end at or before start wraps past midnight.",
    )
    weekdays = serializers.ListField(
        child=serializers.ChoiceField(choices=WEEKDAYS),
        allow_empty=False,
        max_length=7,
        required=False,
        help_text="Days the window applies to (default all).",
    )
    months = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=12),
        allow_empty=False,
        max_length=12,
        required=False,
        help_text="Months the window applies to, 1–12 (default all).",
    )


class ScheduleInput(serializers.Serializer):
    bands = BandInput(many=True, allow_empty=False, max_length=len(Band.values))  # type: ignore[call-arg]
    windows = WindowInput(many=True, allow_empty=False, max_length=MAX_WINDOWS)  # type: ignore[call-arg]

    def validate_bands(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = [row["band"] for row in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise serializers.ValidationError(
                _("Each band once: %(bands)s repeated.") % {"bands": ", ".join(duplicates)}
            )
        return value


def _spec_from(values: dict[str, Any], *, time_zone: str) -> TariffSpec:
    return TariffSpec(
        time_zone=time_zone,
        multipliers={row["band"]: row["multiplier"] for row in values["bands"]},
        windows=tuple(
            WindowSpec(
                band=row["band"],
                start_minute=_minutes(row["start"]),
                end_minute=_minutes(row["end"]),
                weekdays=weekdays_mask(WEEKDAYS.index(d) for d in row["weekdays"])
                if "weekdays" in row
                else ALL_WEEKDAYS,
                months=months_mask(row["months"]) if "months" in row else ALL_MONTHS,
            )
            for row in values["windows"]
        ),
    )


class TariffBandOutput(serializers.Serializer):
    band = serializers.CharField()
    multiplier = serializers.DecimalField(max_digits=8, decimal_places=4)


class TariffWindowOutput(serializers.Serializer):
    band = serializers.CharField()
    start = serializers.CharField(help_text="HH:MM")
    end = serializers.CharField(help_text="HH:MM; 24:00 is midnight; at or before start wraps.")
    weekdays = serializers.ListField(child=serializers.CharField())
    months = serializers.ListField(child=serializers.IntegerField())

    def to_representation(self, instance: Any) -> dict[str, Any]:
        return {
            "band": instance.band,
            "start": minute_label(instance.start_minute),
            "end": minute_label(instance.end_minute),
            "weekdays": _weekday_names(instance.weekdays),
            "months": _month_numbers(instance.months),
        }


class TariffVersionOutput(serializers.ModelSerializer):
    in_force = serializers.SerializerMethodField()
    bands = TariffBandOutput(many=True)
    windows = TariffWindowOutput(many=True)

    class Meta:
        model = TariffVersion
        fields = ["version", "effective_from", "created_at", "in_force", "bands", "windows"]

    def get_in_force(self, version: TariffVersion) -> bool:
        return bool(self.context.get("in_force_id") == version.pk)


class TariffOutput(serializers.ModelSerializer):
    """A tariff in a listing: no schedule, the version in force now."""

    owner = serializers.CharField(source="owner.slug", allow_null=True, default=None)
    is_preset = serializers.SerializerMethodField()
    current_version = serializers.IntegerField(allow_null=True, help_text="In force now; null if none yet.")

    class Meta:
        model = Tariff
        fields = [
            "id",
            "code",
            "name",
            "owner",
            "is_preset",
            "time_zone",
            "source",
            "created_at",
            "current_version",
        ]

    def get_is_preset(self, tariff: Tariff) -> bool:
        return tariff.owner_id is None


class TariffDetailOutput(TariffOutput):
    versions = TariffVersionOutput(many=True)

    class Meta(TariffOutput.Meta):
        fields = [*TariffOutput.Meta.fields, "versions"]


def _tariff_detail(tariff: Tariff) -> dict[str, Any]:
    """Render a tariff fetched by selectors.tariff_get_for (versions prefetched)."""
    now = timezone.now()
    versions: Sequence[TariffVersion] = list(tariff.versions.all())
    in_force = max(
        (v for v in versions if v.effective_from <= now),
        key=lambda v: (v.effective_from, v.version),
        default=None,
    )
    tariff.current_version = in_force.version if in_force else None  # type: ignore[attr-defined]
    return dict(TariffDetailOutput(tariff, context={"in_force_id": in_force.pk if in_force else None}).data)


class SlaTierSerializer(serializers.Serializer):
    below_percent = serializers.DecimalField(
        max_digits=6, decimal_places=3, help_text="Availability strictly below this percent…"
    )
    credit_percent = serializers.DecimalField(
        max_digits=6, decimal_places=3, help_text="…credits this percent of the lease's charge."
    )


class PriceCardOutput(serializers.ModelSerializer):
    cpi = serializers.CharField(source="cluster.cpi")
    sla_availability_percent = serializers.DecimalField(
        max_digits=6,
        decimal_places=3,
        allow_null=True,
        help_text="Promised availability over a lease's window, percent; null = no promise.",
    )
    sla_credit_schedule = SlaTierSerializer(
        many=True, help_text="Credit tiers, from the highest threshold down; empty = no credit."
    )
    rate_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4, help_text="CNY.")
    tariff_id = serializers.IntegerField(source="tariff_version.tariff_id")
    tariff_code = serializers.CharField(source="tariff_version.tariff.code")
    tariff_version = serializers.IntegerField(
        source="tariff_version.version", help_text="The tariff version this card is priced with, for good."
    )

    class Meta:
        model = PriceCard
        fields = [
            "cpi",
            "version",
            "rate_per_card_hour",
            "currency",
            "tariff_id",
            "tariff_code",
            "tariff_version",
            "effective_from",
            "sla_availability_percent",
            "sla_credit_schedule",
            "created_at",
            "created_by",
        ]


# --- Tariffs ----------------------------------------------------------------------------------------


class TariffListApi(generics.ListAPIView):
    """The tariffs the caller may use (the platform's presets, then its own); POST defines a new tariff
    (operators only) with its version 1."""

    serializer_class = TariffOutput
    queryset = Tariff.objects.none()  # for the schema; requests use get_queryset

    class Input(ScheduleInput):
        code = serializers.SlugField(max_length=64, help_text="Unique among your tariffs, e.g. gd-2026.")
        name = serializers.CharField(max_length=200)
        time_zone = serializers.CharField(max_length=64, default=DEFAULT_TIME_ZONE, help_text="IANA zone.")
        source = serializers.CharField(max_length=500, allow_blank=True, default="")  # type: ignore[assignment]  # the field is named `source`
        effective_from = AwareDateTimeField(
            required=False, allow_null=True, help_text="Default now; never in the past."
        )

    def get_permissions(self) -> list[BasePermission]:
        return [IsOperator()] if self.request.method == "POST" else [IsOrganisationMember()]

    def get_queryset(self) -> QuerySet[Tariff]:
        organisation = actor_from_request(self.request).organisation
        return selectors.tariff_list_for(organisation=organisation, with_current_version=True)

    @extend_schema(operation_id="tariffs_list", tags=[TAG_TARIFFS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="tariffs_create",
        request=Input,
        responses={201: TariffDetailOutput},
        description="A schedule where a minute has no band or two answers 400 `tariff_invalid`, with each "
        "gap and overlap named in `extra.gaps` / `extra.overlaps`.",
        tags=[TAG_TARIFFS],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        tariff = services.tariff_create(
            owner=actor.organisation,
            code=values["code"],
            name=values["name"],
            time_zone=values["time_zone"],
            source=values["source"],
            spec=_spec_from(values, time_zone=values["time_zone"]),
            effective_from=values.get("effective_from"),
            actor=actor,
        )
        tariff = selectors.tariff_get_for(organisation=actor.organisation, tariff_id=tariff.pk)
        return Response(_tariff_detail(tariff), status=status.HTTP_201_CREATED)


class TariffDetailApi(APIView):
    """A tariff with every version's bands and windows; `in_force` marks the version used now."""

    permission_classes = [IsOrganisationMember]

    @extend_schema(operation_id="tariffs_get", responses={200: TariffDetailOutput}, tags=[TAG_TARIFFS])
    def get(self, request: Request, tariff_id: int) -> Response:
        organisation = actor_from_request(request).organisation
        tariff = selectors.tariff_get_for(organisation=organisation, tariff_id=tariff_id)
        return Response(_tariff_detail(tariff))


class TariffVersionCreateApi(APIView):
    """Publish the next version of one of your tariffs. It takes effect at `effective_from` (default
    now, never in the past, after the newest version); price cards already set keep their version."""

    permission_classes = [IsOperator]

    class Input(ScheduleInput):
        effective_from = AwareDateTimeField(required=False, allow_null=True)

    @extend_schema(
        operation_id="tariff_versions_create",
        request=Input,
        responses={201: TariffDetailOutput},
        tags=[TAG_TARIFFS],
    )
    def post(self, request: Request, tariff_id: int) -> Response:
        actor = actor_from_request(request)
        tariff = selectors.tariff_get_for(organisation=actor.organisation, tariff_id=tariff_id)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        services.tariff_version_create(
            tariff=tariff,
            spec=_spec_from(values, time_zone=tariff.time_zone),
            effective_from=values.get("effective_from"),
            actor=actor,
        )
        tariff = selectors.tariff_get_for(organisation=actor.organisation, tariff_id=tariff.pk)
        return Response(_tariff_detail(tariff), status=status.HTTP_201_CREATED)


class TariffStripApi(APIView):
    """One local day of a tariff as wall-clock runs of bands (for 24-hour strips and previews), from the
    version in force at the start of that day (the first version for a day before it)."""

    permission_classes = [IsOrganisationMember]

    class Query(serializers.Serializer):
        date = serializers.DateField(help_text="The local date, YYYY-MM-DD.")

        def validate_date(self, value: LocalDate) -> LocalDate:
            if not STRIP_FIRST_DATE <= value <= STRIP_LAST_DATE:
                raise serializers.ValidationError(
                    _("Must be between %(first)s and %(last)s.")
                    % {"first": STRIP_FIRST_DATE, "last": STRIP_LAST_DATE}
                )
            return value

    class Output(serializers.Serializer):
        class Run(serializers.Serializer):
            start = serializers.CharField(help_text="HH:MM")
            end = serializers.CharField(help_text="HH:MM; 24:00 is midnight.")
            band = serializers.CharField()
            multiplier = serializers.DecimalField(max_digits=8, decimal_places=4)

        tariff_id = serializers.IntegerField()
        code = serializers.CharField()
        version = serializers.IntegerField()
        date = serializers.DateField()
        time_zone = serializers.CharField()
        runs = Run(many=True)

    @extend_schema(
        operation_id="tariffs_strip",
        parameters=[
            OpenApiParameter(
                "date",
                # The server's range (1971-01-01 to 2199-12-31) as a pattern on the year.
                {
                    "type": "string",
                    "format": "date",
                    "pattern": r"^(?:197[1-9]|19[89][0-9]|2[01][0-9]{2})-[0-9]{2}-[0-9]{2}$",
                },
                required=True,
                description="YYYY-MM-DD, from 1971-01-01 to 2199-12-31.",
            )
        ],
        responses={200: Output},
        tags=[TAG_TARIFFS],
    )
    def get(self, request: Request, tariff_id: int) -> Response:
        organisation = actor_from_request(request).organisation
        tariff = selectors.tariff_get_for(organisation=organisation, tariff_id=tariff_id)
        query = self.Query(data=request.query_params)
        query.is_valid(raise_exception=True)
        local_date = query.validated_data["date"]
        day_start = datetime.combine(local_date, time(0), tzinfo=ZoneInfo(tariff.time_zone))
        version = selectors.tariff_version_for_day(tariff=tariff, at=day_start)
        compiled = selectors.compiled_tariff(tariff_version_id=version.pk)
        multipliers = dict(zip(compiled.bands, compiled.multipliers_e4, strict=True))
        runs = [
            {
                "start": minute_label(start),
                "end": minute_label(end),
                "band": band,
                "multiplier": Decimal(multipliers[band]).scaleb(-4),
            }
            for start, end, band in compiled.day_strip(local_date)
        ]
        data = {
            "tariff_id": tariff.pk,
            "code": tariff.code,
            "version": version.version,
            "date": local_date,
            "time_zone": tariff.time_zone,
            "runs": runs,
        }
        return Response(self.Output(data).data)


# --- Price cards ------------------------------------------------------------------------------------


class PriceCardListApi(generics.ListAPIView):
    """Every price-card version of one of your clusters, newest first; POST sets a new price."""

    permission_classes = [IsOperator]
    serializer_class = PriceCardOutput
    queryset = PriceCard.objects.none()  # for the schema; requests use get_queryset

    class Input(serializers.Serializer):
        rate_per_card_hour = serializers.DecimalField(
            max_digits=12, decimal_places=4, min_value=0, help_text="CNY per card-hour, at most 4 places."
        )
        tariff_id = serializers.IntegerField(min_value=1, help_text="A preset or one of your tariffs.")
        effective_from = AwareDateTimeField(
            required=False,
            allow_null=True,
            help_text="Default now; never in the past, never before the cluster's newest price card.",
        )
        sla_availability_percent = serializers.DecimalField(
            max_digits=6,
            decimal_places=3,
            required=False,
            allow_null=True,
            help_text="Optional service level: availability over a lease's window you promise, in percent "
            "(above 0, at most 100). A new version without it promises nothing.",
        )
        sla_credit_schedule = SlaTierSerializer(
            many=True,
            required=False,
            help_text="Optional credit tiers (needs a service level): availability below X % credits Y % of "
            "the lease's charge; the lower the threshold, the larger the credit; no threshold above the level.",
        )

    def get_queryset(self) -> QuerySet[PriceCard]:
        operator = actor_from_request(self.request).organisation
        cluster = federation_selectors.cluster_get_for_operator(operator=operator, cpi=self.kwargs["cpi"])
        return selectors.price_card_list(cluster=cluster)

    @extend_schema(operation_id="price_cards_list", tags=[TAG_TARIFFS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="price_cards_create",
        request=Input,
        responses={201: PriceCardOutput},
        description="Write the cluster's next price-card version. It locks the tariff version in force "
        "at its effective_from; leases and usage priced earlier keep their own card.",
        tags=[TAG_TARIFFS],
    )
    def post(self, request: Request, cpi: str) -> Response:
        actor = actor_from_request(request)
        cluster = federation_selectors.cluster_get_for_operator(operator=actor.organisation, cpi=cpi)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        tariff = selectors.tariff_get_for(organisation=actor.organisation, tariff_id=values["tariff_id"])
        card = services.price_card_set(
            cluster=cluster,
            rate_per_card_hour=values["rate_per_card_hour"],
            tariff=tariff,
            effective_from=values.get("effective_from"),
            sla_availability_percent=values.get("sla_availability_percent"),
            sla_credit_schedule=[dict(tier) for tier in values.get("sla_credit_schedule") or []],
            actor=actor,
        )
        card = selectors.price_card_get(cluster=cluster, version=card.version)
        return Response(PriceCardOutput(card).data, status=status.HTTP_201_CREATED)


urlpatterns = [
    path("tariffs", TariffListApi.as_view(), name="tariff-list"),
    path("tariffs/<int:tariff_id>", TariffDetailApi.as_view(), name="tariff-detail"),
    path("tariffs/<int:tariff_id>/versions", TariffVersionCreateApi.as_view(), name="tariff-version-create"),
    path("tariffs/<int:tariff_id>/strip", TariffStripApi.as_view(), name="tariff-strip"),
    path("clusters/<str:cpi>/price-cards", PriceCardListApi.as_view(), name="price-card-list"),
]
