"""Buyers' broker API: jobs, quotes, accepting a quote (a lease), leases and notices.

Everything is the calling buyer's own: another buyer's job, quote or lease answers 404, an organisation
that is not a buyer 403 ``not_a_buyer``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import django_filters
from django.db.models import QuerySet
from django.urls import path
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker import selectors
from broker.api.quote_render import quote_set_response
from broker.draws import lease_draw_plan
from broker.models import HOLDING_STATES, BuyerNotice, Gang, Job, Lease, LeaseState, Preference, Quote
from broker.services import jobs as job_services
from broker.services import leases as lease_services
from broker.services import quotes as quote_services
from broker.services.quotes import relaxation_json
from broker.types import RELAXATION_KINDS
from core.api.context import actor_from_request
from core.api.fields import AwareDateTimeField
from core.api.permissions import IsOrganisationMember
from core.api.schema import ErrorSerializer
from core.observability import QUOTE_SECONDS
from federation.api.schema import HubCodeField
from federation.models import Fabric
from metering.errors import NotABuyerError

TAG_JOBS = "jobs"
TAG_LEASES = "leases"


class IsBuyer(IsOrganisationMember):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        organisation = actor_from_request(request).organisation
        if not organisation.is_buyer:
            raise NotABuyerError(
                _("%(organisation)s is not a buyer organisation.") % {"organisation": organisation.slug}
            )
        return True


# --- Jobs -------------------------------------------------------------------------------------------


class JobOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField(help_text=f"One of: {', '.join(Job.State.values)}.")
    failure_reason = serializers.CharField()
    cards = serializers.IntegerField(allow_null=True)
    standard_cards = serializers.DecimalField(max_digits=12, decimal_places=4, allow_null=True)
    accelerators = serializers.ListField(child=serializers.CharField())
    min_fp16_tflops = serializers.DecimalField(max_digits=10, decimal_places=3, allow_null=True)
    min_memory_gb = serializers.DecimalField(max_digits=8, decimal_places=1, allow_null=True)
    fabrics = serializers.ListField(child=serializers.CharField())
    gang = serializers.CharField()
    origin_hub = serializers.CharField(source="origin_hub.code")
    latency_budget_ms = serializers.IntegerField()
    earliest_start_at = serializers.DateTimeField()
    deadline_at = serializers.DateTimeField()
    duration_seconds = serializers.IntegerField()
    max_price_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4, allow_null=True)
    checkpointable = serializers.BooleanField()
    preference = serializers.CharField()
    price_weight = serializers.DecimalField(max_digits=4, decimal_places=3)
    cluster = serializers.CharField(
        source="cluster.cpi",
        allow_null=True,
        help_text="The cluster the job is pinned to (its CPI): only its islands are quoted; null = any.",
    )
    min_reliability = serializers.DecimalField(
        max_digits=6,
        decimal_places=3,
        allow_null=True,
        help_text="The lowest reliability score accepted, in percent; null = any.",
    )
    idempotency_key = serializers.CharField()
    created_at = serializers.DateTimeField()


class RelaxationOutput(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=list(RELAXATION_KINDS),
        help_text="Which constraint the change loosens.",
    )
    changes = serializers.DictField(
        child=serializers.JSONField(),
        help_text="The job's fields with their loosened values, as this API spells them (e.g. "
        '`{"latency_budget_ms": 23}`, `{"accelerators": ["nvidia-h800-sxm5-80gb"], "min_fp16_tflops": null}`, '
        '`{"deadline_at": "…"}`, `{"cluster": ""}` for no pin).',
    )
    cluster = serializers.CharField(help_text="The cluster (CPI) the changed job was quoted on.")
    accelerator = serializers.CharField()
    start_at = serializers.DateTimeField()
    cost = serializers.DecimalField(max_digits=16, decimal_places=2, help_text="At the list price, CNY.")


class QuoteSummaryOutput(serializers.Serializer):
    quoted_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(help_text="When the quotes of that request expire.")
    considered = serializers.IntegerField(help_text="Islands examined.")
    feasible = serializers.IntegerField(help_text="Islands that could take the job.")
    offers = serializers.IntegerField(help_text="Quotes returned (one per distinct offer).")
    rejections = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Islands rejected, each under the first reason it fails (see the quotes endpoint).",
    )
    window_start_at = serializers.DateTimeField()
    window_end_at = serializers.DateTimeField()
    relaxations = RelaxationOutput(
        many=True, help_text="When nothing fitted: the nearest changes that would produce a quote."
    )


class JobDetailOutput(JobOutput):
    quote_summary = serializers.SerializerMethodField(
        help_text="What the job's latest quote request found, whoever made it: the islands rejected per "
        "reason and, when nothing fitted, the nearest changes that would produce a quote. Null before the "
        "first quote."
    )

    @extend_schema_field(QuoteSummaryOutput(allow_null=True))
    def get_quote_summary(self, job: Job) -> Any:
        if not job.quote_summary:
            return None
        return QuoteSummaryOutput(_with_datetimes(job.quote_summary)).data


_SUMMARY_TIMES = ("quoted_at", "expires_at", "window_start_at", "window_end_at")


def _with_datetimes(summary: dict[str, Any]) -> dict[str, Any]:
    """A stored summary (JSON: times as ISO strings in UTC) with its times parsed, so they are rendered in
    the API's time zone like every other time it answers with."""
    out = {key: parse_datetime(value) if key in _SUMMARY_TIMES else value for key, value in summary.items()}
    out["relaxations"] = [
        {**item, "start_at": parse_datetime(str(item.get("start_at", "")))}
        for item in summary.get("relaxations", [])
    ]
    return out


class JobFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=Job.State.choices)

    class Meta:
        model = Job
        fields = ["state"]


class JobListApi(generics.ListAPIView):
    """The buyer's jobs (GET), or submit one (POST)."""

    permission_classes = [IsBuyer]
    serializer_class = JobOutput
    filterset_class = JobFilter
    queryset = Job.objects.none()

    class Input(serializers.Serializer):
        name = serializers.CharField(max_length=200)
        cards = serializers.IntegerField(
            required=False,
            allow_null=True,
            min_value=-(2**31),
            max_value=2**31 - 1,
            help_text="Cards of one chip. Give this or standard_cards.",
        )
        standard_cards = serializers.DecimalField(
            max_digits=12,
            decimal_places=4,
            required=False,
            allow_null=True,
            help_text="Standard cards (400 dense FP16 TFLOPS each): any chip may serve, counted by its factor.",
        )
        accelerators = serializers.ListField(
            child=serializers.CharField(max_length=64),
            required=False,
            default=list,
            max_length=50,
            help_text="Allowed accelerator slugs (see /accelerators); empty = any.",
        )
        min_fp16_tflops = serializers.DecimalField(
            max_digits=10, decimal_places=3, required=False, allow_null=True
        )
        min_memory_gb = serializers.DecimalField(
            max_digits=8, decimal_places=1, required=False, allow_null=True
        )
        fabrics = serializers.ListField(
            child=serializers.ChoiceField(choices=Fabric.choices), required=False, default=list, max_length=5
        )
        gang = serializers.ChoiceField(choices=Gang.choices, default=Gang.ISLAND)
        origin_hub = HubCodeField(max_length=8, help_text="Where the job's users are (a hub code).")
        latency_budget_ms = serializers.IntegerField(min_value=-(2**31), max_value=2**31 - 1)
        earliest_start_at = AwareDateTimeField(
            required=False,
            allow_null=True,
            help_text="Default: now. With a UTC offset; a naive time is refused.",
        )
        deadline_at = AwareDateTimeField(help_text="The run must end by then. With a UTC offset.")
        duration_seconds = serializers.IntegerField(min_value=-(2**31), max_value=2**31 - 1)
        max_price_per_card_hour = serializers.DecimalField(
            max_digits=12,
            decimal_places=4,
            required=False,
            allow_null=True,
            help_text="Cap on the average price per card-hour (per standard card-hour for standard cards).",
        )
        checkpointable = serializers.BooleanField(default=False)
        preference = serializers.ChoiceField(choices=Preference.choices, default=Preference.PRICE)
        price_weight = serializers.DecimalField(
            max_digits=4,
            decimal_places=3,
            required=False,
            allow_null=True,
            help_text="For `weighted`: 1 = price only, 0 = latency only.",
        )
        cluster = serializers.RegexField(
            r"^cpi:[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?(?::[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?){2}$",
            max_length=120,
            required=False,
            default="",
            allow_blank=True,
            help_text="Pin the job to one cluster (its CPI, e.g. `cpi:cucc:nx:zw-ai01`): only its islands "
            "are quoted, and failover cannot move the job elsewhere. Empty = any cluster.",
        )
        min_reliability = serializers.DecimalField(
            max_digits=6,
            decimal_places=3,
            min_value=Decimal(0),
            max_value=Decimal(100),
            required=False,
            allow_null=True,
            help_text="The lowest reliability score accepted, in percent (e.g. `99.5`): a cluster scoring "
            "less is not quoted (rejection reason `reliability`). A cluster's score is its delivered ÷ "
            "sold card-seconds over 30 days with the platform's prior; a new cluster scores the prior "
            "(99.0 % by default). Null = any.",
        )
        idempotency_key = serializers.CharField(max_length=200, required=False, default="")

    def get_queryset(self) -> QuerySet[Job]:
        return selectors.job_list_for(buyer=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="jobs_list", tags=[TAG_JOBS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        operation_id="jobs_create",
        request=Input,
        responses={201: JobOutput, 200: JobOutput},
        description="Submit a job. Every fault is listed at once: 400 `job_invalid` with `extra.errors` "
        "[{field, code, message}] (codes: cards_or_standard_cards, cards_not_positive, "
        "duration_not_positive, deadline_before_end, window_beyond_horizon, unknown_hub, "
        "unknown_accelerator, unknown_fabric, unknown_cluster, start_in_past, latency_budget_not_positive, …). "
        "With an "
        "`idempotency_key`, a repeat of the same body returns the job with 200; another body is 409 "
        "`job_conflict`.",
        tags=[TAG_JOBS],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        job, created = job_services.job_create(
            buyer=actor.organisation,
            data=job_services.JobInput(
                name=values["name"],
                origin_hub=values["origin_hub"],
                latency_budget_ms=values["latency_budget_ms"],
                deadline_at=values["deadline_at"],
                duration_seconds=values["duration_seconds"],
                cards=values.get("cards"),
                standard_cards=values.get("standard_cards"),
                accelerators=tuple(values["accelerators"]),
                min_fp16_tflops=values.get("min_fp16_tflops"),
                min_memory_gb=values.get("min_memory_gb"),
                fabrics=tuple(values["fabrics"]),
                gang=values["gang"],
                earliest_start_at=values.get("earliest_start_at"),
                max_price_per_card_hour=values.get("max_price_per_card_hour"),
                checkpointable=values["checkpointable"],
                preference=values["preference"],
                price_weight=values.get("price_weight"),
                cluster=values["cluster"],
                min_reliability=values.get("min_reliability"),
                idempotency_key=values["idempotency_key"],
            ),
            actor=actor,
        )
        job = selectors.job_get_for(buyer=actor.organisation, job_id=job.pk)
        return Response(
            JobOutput(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class JobDetailApi(APIView):
    permission_classes = [IsBuyer]

    @extend_schema(operation_id="jobs_get", responses={200: JobDetailOutput}, tags=[TAG_JOBS])
    def get(self, request: Request, job_id: int) -> Response:
        buyer = actor_from_request(request).organisation
        return Response(JobDetailOutput(selectors.job_get_for(buyer=buyer, job_id=job_id)).data)


class JobCancelApi(APIView):
    permission_classes = [IsBuyer]

    @extend_schema(
        operation_id="jobs_cancel",
        request=None,
        responses={200: JobOutput},
        description="Cancel the job: a reserved lease is cancelled (its cards released at once), a running "
        "one is asked to stop. 409 `job_closed` when the job already ended.",
        tags=[TAG_JOBS],
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = actor_from_request(request)
        job = selectors.job_get_for(buyer=actor.organisation, job_id=job_id)
        job_services.job_cancel(job=job, actor=actor, reason="cancelled by the buyer")
        return Response(JobOutput(selectors.job_get_for(buyer=actor.organisation, job_id=job_id)).data)


# --- Quotes -----------------------------------------------------------------------------------------


class BandOutput(serializers.Serializer):
    band = serializers.CharField()
    multiplier = serializers.DecimalField(max_digits=8, decimal_places=4)
    card_seconds = serializers.IntegerField()
    card_hours = serializers.DecimalField(max_digits=20, decimal_places=6)
    cost = serializers.DecimalField(
        max_digits=16, decimal_places=2, help_text="card-hours × rate × multiplier"
    )


class AllocationOutput(serializers.Serializer):
    cpi = serializers.CharField()
    cards = serializers.IntegerField()


class QuotePriceCardOutput(serializers.Serializer):
    version = serializers.IntegerField()
    rate_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
    tariff = serializers.CharField()


class DrawPartOutput(serializers.Serializer):
    pack_class = serializers.CharField(help_text="`std` for standard cards, else the chip's slug.")
    unit = serializers.ChoiceField(choices=["standard_card_hours", "chip_card_hours"])
    card_hours = serializers.DecimalField(
        max_digits=20, decimal_places=6, help_text="Drawn from this class's packs, in its unit."
    )
    chip_card_hours = serializers.DecimalField(
        max_digits=20, decimal_places=6, help_text="The chip's card-hours × band multiplier it covers."
    )
    standard_card_factor = serializers.DecimalField(max_digits=8, decimal_places=4, allow_null=True)
    price_per_card_hour = serializers.DecimalField(
        max_digits=16, decimal_places=6, help_text="The paying packs' price per card-hour of their unit, CNY."
    )
    value = serializers.DecimalField(max_digits=16, decimal_places=2, help_text="Prepaid value drawn, CNY.")


class DrawPlanOutput(serializers.Serializer):
    chip = serializers.CharField()
    expected_draw_chip_card_hours = serializers.DecimalField(max_digits=20, decimal_places=6)
    standard_card_factor = serializers.DecimalField(max_digits=8, decimal_places=4, allow_null=True)
    paid_by = DrawPartOutput(
        many=True, help_text="The buyer's pack classes that would pay, earliest expiry first (as rating)."
    )
    uncovered_chip_card_hours = serializers.DecimalField(
        max_digits=20, decimal_places=6, help_text="What no pack covers: billed at the operator's rate."
    )
    arrears_value = serializers.DecimalField(max_digits=16, decimal_places=2)
    value = serializers.DecimalField(
        max_digits=16, decimal_places=2, help_text="What the buyer would pay: prepaid value + arrears, CNY."
    )
    effective_price_per_card_hour = serializers.DecimalField(
        max_digits=16, decimal_places=2, help_text="`value` ÷ the chip card-hours × multiplier, CNY."
    )
    operator_rate_per_card_hour = serializers.DecimalField(
        max_digits=16, decimal_places=6, help_text="The operator's list price per card-hour, CNY."
    )


class QuoteReliabilityOutput(serializers.Serializer):
    percent = serializers.DecimalField(
        max_digits=6,
        decimal_places=3,
        allow_null=True,
        help_text="The cluster's reliability score when quoted: delivered ÷ sold card-seconds over the last "
        "30 days with the platform's prior (as if it had also sold 1,000 card-hours and delivered 99.0 % "
        "of them, by default: a platform choice, not an official figure).",
    )
    prior = serializers.BooleanField(
        help_text="True when the score is the prior alone: a new cluster, nothing sold on it in the window."
    )
    interruptions_per_1000_card_hours = serializers.DecimalField(
        max_digits=14,
        decimal_places=3,
        allow_null=True,
        help_text="Leases interrupted or failed per 1,000 card-hours sold in the window; null for a new cluster.",
    )


class QuoteOutput(serializers.Serializer):
    id = serializers.IntegerField()
    rank = serializers.IntegerField()
    cluster = serializers.CharField(help_text="Cluster CPI.")
    hub = serializers.CharField()
    accelerator = serializers.CharField()
    islands = AllocationOutput(many=True)
    islands_available = serializers.IntegerField(
        help_text="How many islands of the cluster can take this offer (the same start, cards, price and "
        "latency): `islands` plus `alternatives`. 1 for a job spanning islands."
    )
    alternatives = AllocationOutput(
        many=True,
        help_text="The other islands that can take the same offer, in id order. Accepting the quote "
        "holds the first of `islands` and these that is still free over the window.",
    )
    cards = serializers.IntegerField()
    start_at = serializers.DateTimeField()
    end_at = serializers.DateTimeField()
    cost = serializers.DecimalField(max_digits=16, decimal_places=2, help_text="Σ of the band costs, CNY.")
    currency = serializers.CharField()
    bands = BandOutput(many=True)
    latency_ms = serializers.DecimalField(max_digits=8, decimal_places=3)
    price_card = QuotePriceCardOutput()
    earliest_feasible_start_at = serializers.DateTimeField(
        allow_null=True,
        help_text="The earliest start any island of this offer could take (null for a quote made before "
        "it was kept). Equal to `start_at` when the quote starts as early as it can.",
    )
    earliest_feasible_cost = serializers.DecimalField(
        max_digits=16,
        decimal_places=2,
        help_text="What the same offer would cost starting at `earliest_feasible_start_at`, CNY at list.",
    )
    saving = serializers.DecimalField(
        max_digits=16,
        decimal_places=2,
        help_text="`earliest_feasible_cost` − `cost`: what waiting until `start_at` saves against starting "
        "this offer at the earliest possible time (a valley shift), CNY at list. Not a comparison with "
        "other quotes.",
    )
    expected_draw = serializers.DecimalField(
        max_digits=20, decimal_places=6, help_text="Card-hours × band multiplier the packs will be drawn."
    )
    draw_class = serializers.CharField()
    standard_card_factor = serializers.DecimalField(max_digits=8, decimal_places=4, allow_null=True)
    expected_standard_draw = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True)
    draw_plan = DrawPlanOutput(
        allow_null=True,
        help_text="Which of your packs would pay the expected draw, each in its unit (standard card-hours "
        "for a standard pack), and your effective price; null for a quote made before plans were kept.",
    )
    balance_sufficient = serializers.BooleanField(
        help_text="Whether your packs, less your live leases' pending draws (expected less posted so far), cover the expected draw; "
        "accepting when false is 402 insufficient_balance."
    )
    reliability = QuoteReliabilityOutput(
        allow_null=True, help_text="Null for a quote made before reliability was kept."
    )
    expected_credit = serializers.DecimalField(
        max_digits=16,
        decimal_places=2,
        allow_null=True,
        help_text="The SLA credit the price card's credit schedule would give at the cluster's reliability "
        "score taken as its expected availability, CNY; 0 when the card has no service level.",
    )
    adjusted_cost = serializers.DecimalField(
        max_digits=16,
        decimal_places=2,
        allow_null=True,
        help_text="`cost` − `expected_credit`: what the `adjusted` preference ranks by, CNY.",
    )
    expires_at = serializers.DateTimeField()


def quote_body(quote: Quote) -> dict[str, Any]:
    extra = quote.breakdown
    return {
        "id": quote.pk,
        "rank": quote.rank,
        "cluster": extra["cluster"],
        "hub": extra["hub"],
        "accelerator": extra["accelerator"],
        "islands": extra["islands"],
        "islands_available": 1 + len(quote.alternatives or ()),
        "alternatives": extra.get("alternatives", []),
        "cards": quote.cards,
        "start_at": quote.start_at,
        "end_at": quote.end_at,
        "cost": quote.cost,
        "currency": "CNY",
        "bands": extra["bands"],
        "latency_ms": quote.latency_ms,
        "price_card": {
            "version": extra["price_card_version"],
            "rate_per_card_hour": extra["rate_per_card_hour"],
            "tariff": extra["tariff"],
        },
        # Stored as ISO text in the breakdown: read back as an instant, so that it is shown in the zone of
        # the answer's other times, not in the zone it was written in.
        "earliest_feasible_start_at": parse_datetime(extra["earliest_feasible_start_at"])
        if extra.get("earliest_feasible_start_at")
        else None,
        "earliest_feasible_cost": extra.get("earliest_feasible_cost", quote.cost + quote.saving),
        "saving": quote.saving,
        "expected_draw": quote.expected_draw,
        "draw_class": quote.draw_class,
        "standard_card_factor": extra["standard_card_factor"],
        "expected_standard_draw": extra["expected_standard_draw"],
        "draw_plan": extra.get("draw_plan"),
        "balance_sufficient": quote.balance_sufficient,
        "reliability": extra.get("reliability"),
        "expected_credit": extra.get("expected_credit"),
        "adjusted_cost": extra.get("adjusted_cost"),
        "expires_at": quote.expires_at,
    }


class RejectionsOutput(serializers.Serializer):
    offline = serializers.IntegerField(help_text="Cluster offline, draining or retired.")
    chip = serializers.IntegerField(help_text="Chip model not allowed, too few TFLOPS, or no public TFLOPS.")
    memory = serializers.IntegerField()
    fabric = serializers.IntegerField()
    latency = serializers.IntegerField(help_text="Origin hub to cluster hub over the latency budget.")
    unpriced = serializers.IntegerField(help_text="The cluster has no price card in force.")
    reliability = serializers.IntegerField(
        help_text="The cluster's reliability score is below the job's `min_reliability`."
    )
    price = serializers.IntegerField(help_text="Even the cheapest start is over the price cap.")
    capacity = serializers.IntegerField(
        help_text="Not enough free cards for the whole duration at any start."
    )
    window = serializers.IntegerField(help_text="No start fits the window any more.")


class QuoteSetOutput(serializers.Serializer):
    class WindowOutput(serializers.Serializer):
        start_at = serializers.DateTimeField()
        end_at = serializers.DateTimeField()

    job = serializers.IntegerField()
    quotes = QuoteOutput(many=True)
    rejections = RejectionsOutput(help_text="Islands rejected, each under the first reason it fails.")
    considered = serializers.IntegerField(help_text="Islands examined.")
    feasible = serializers.IntegerField(help_text="Feasible placements found (one per island, or cluster).")
    window = WindowOutput()
    expires_at = serializers.DateTimeField()
    relaxations = RelaxationOutput(
        many=True,
        help_text="Empty when there are quotes. When nothing fitted: the nearest changes to the job that "
        "would produce a quote, nearest first, one per kind, each found by quoting the changed job (a "
        "bounded number of tries). The job keeps them in `quote_summary`.",
    )


class JobQuoteApi(APIView):
    permission_classes = [IsBuyer]

    class Input(serializers.Serializer):
        limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=10)

    @extend_schema(
        operation_id="jobs_quotes_create",
        request=Input,
        responses={201: QuoteSetOutput},
        description="Quote the job: the best feasible offers in its window, ranked by its preference. An "
        "offer is one cluster at one start (the island's cheapest, in 15-minute steps): the islands of a "
        "cluster that can take the job at the same start, cards, price and latency are one quote, with "
        "`islands_available` and `alternatives` (accepting takes the first still free); `limit` counts "
        "offers. Each quote has its cost by tariff band, latency, price card, the cost of starting the "
        "same offer at the earliest possible time and the saving against it, its cluster's reliability "
        "score (the platform's prior for a new cluster) and the SLA credit expected at it; the response counts the "
        "islands rejected per reason and, when nothing fits, lists the nearest changes that would produce "
        "a quote (`relaxations`). The job keeps the counts and relaxations (`quote_summary`). Quotes "
        "expire after a short time (60 s by default) and hold nothing until accepted. 409 `job_closed` "
        "for an ended job.",
        tags=[TAG_JOBS],
    )
    def post(self, request: Request, job_id: int) -> Response:
        actor = actor_from_request(request)
        job = selectors.job_get_for(buyer=actor.organisation, job_id=job_id)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        with QUOTE_SECONDS.time():
            quote_set = quote_services.quote_create(job=job, limit=data.validated_data["limit"])
        # What QuoteSetOutput (the declared answer) renders, written by hand at a fraction of its cost
        # (broker.api.quote_render; tests/broker/test_quote_render.py holds the two equal), encoded into
        # JSONRenderer's bytes by pydantic-core when plain JSON was negotiated (an HttpResponse, not a
        # Response: hence the ignore).
        return quote_set_response(quote_set, request)  # type: ignore[return-value]


def quote_set_body(quote_set: quote_services.QuoteSet) -> dict[str, Any]:
    """The input QuoteSetOutput renders a quote set from (the reference broker.api.quote_render is held to)."""
    result = quote_set.result
    return {
        "job": quote_set.job.pk,
        "quotes": [quote_body(quote) for quote in quote_set.quotes],
        "rejections": result.rejections,
        "considered": result.considered,
        "feasible": result.feasible,
        "window": {"start_at": result.window_start_at, "end_at": result.window_end_at},
        "expires_at": quote_set.expires_at,
        "relaxations": [
            {**relaxation_json(relaxation), "start_at": relaxation.start_at}
            for relaxation in quote_set.relaxations
        ],
    }


# --- Leases -----------------------------------------------------------------------------------------


class TransitionOutput(serializers.Serializer):
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    at = serializers.DateTimeField()
    actor = serializers.CharField(source="actor_label")
    reason = serializers.CharField()


class LeaseOutput(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.IntegerField(source="job_id")
    quote = serializers.IntegerField(source="quote_id", allow_null=True)
    state = serializers.CharField(help_text=f"One of: {', '.join(LeaseState.values)}.")
    cluster = serializers.CharField(source="cluster.cpi")
    hub = serializers.CharField(source="cluster.hub.code")
    accelerator = serializers.CharField(source="cluster.accelerator.slug")
    islands = serializers.SerializerMethodField()
    cards = serializers.IntegerField()
    start_at = serializers.DateTimeField()
    end_at = serializers.DateTimeField()
    price_card = serializers.SerializerMethodField()
    expected_cost = serializers.DecimalField(max_digits=16, decimal_places=2)
    expected_draw = serializers.DecimalField(max_digits=20, decimal_places=6)
    draw_class = serializers.CharField()
    replaces = serializers.IntegerField(source="replaces_id", allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    stop_requested_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    last_usage_end_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()

    @extend_schema_field(AllocationOutput(many=True))
    def get_islands(self, lease: Lease) -> Any:
        return AllocationOutput(
            [{"cpi": hold.island.cpi, "cards": hold.cards} for hold in lease.holds.all()], many=True
        ).data

    @extend_schema_field(QuotePriceCardOutput)
    def get_price_card(self, lease: Lease) -> Any:
        card = lease.price_card
        return QuotePriceCardOutput(
            {
                "version": card.version,
                "rate_per_card_hour": card.rate_per_card_hour,
                "tariff": card.tariff_version.tariff.code,
            }
        ).data


class LeaseDrawnOutput(serializers.Serializer):
    pack_class = serializers.CharField()
    arrears = serializers.BooleanField(help_text="True: the chip's card-hours no pack covered (amount due).")
    card_hours = serializers.DecimalField(max_digits=20, decimal_places=6, help_text="In the class's unit.")


class LeaseDetailOutput(LeaseOutput):
    transitions = TransitionOutput(many=True, source="transitions.all")
    draw_plan = serializers.SerializerMethodField(
        help_text="While the lease can draw: how its expected draw would be paid by your packs now."
    )
    drawn = serializers.SerializerMethodField(help_text="Rated so far, per pack class, each in its unit.")
    spend = serializers.SerializerMethodField(
        help_text="What you pay so far (prepaid value drawn + arrears), CNY, by core.money's rounding rule."
    )

    @extend_schema_field(DrawPlanOutput(allow_null=True))
    def get_draw_plan(self, lease: Lease) -> Any:
        if lease.state not in HOLDING_STATES:
            return None
        return DrawPlanOutput(lease_draw_plan(lease=lease).as_json()).data

    def _usage(self, lease: Lease) -> selectors.LeaseUsage:
        cached = self.context.setdefault("usage", {})
        if lease.pk not in cached:
            cached[lease.pk] = selectors.lease_usage(lease=lease, recent=0)
        return cached[lease.pk]

    @extend_schema_field(LeaseDrawnOutput(many=True))
    def get_drawn(self, lease: Lease) -> Any:
        return LeaseDrawnOutput(
            [
                {"pack_class": d.class_key, "arrears": d.arrears, "card_hours": d.card_hours}
                for d in self._usage(lease).draws
            ],
            many=True,
        ).data

    @extend_schema_field(serializers.DecimalField(max_digits=16, decimal_places=2))
    def get_spend(self, lease: Lease) -> str:
        return str(self._usage(lease).spend)


class LeaseFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=LeaseState.choices)
    job = django_filters.NumberFilter(field_name="job_id", min_value=1, max_value=2**63 - 1)

    class Meta:
        model = Lease
        fields = ["state", "job"]


class QuoteAcceptApi(APIView):
    permission_classes = [IsBuyer]

    @extend_schema(
        operation_id="quotes_accept",
        request=None,
        responses={201: LeaseOutput, 200: LeaseOutput, 402: ErrorSerializer, 409: ErrorSerializer},
        description="Accept a live quote: its cards are held on the island for the quoted window at the "
        "quoted price card. Accepting the same quote again returns its lease with 200. 409 "
        "`capacity_taken` when other leases took the cards since the quote, `quote_expired`, "
        "`quote_superseded` (the job already holds a live lease), `cluster_unavailable`; 402 "
        "`insufficient_balance` when your packs, less your live leases, cannot pay the expected draw.",
        tags=[TAG_JOBS],
    )
    def post(self, request: Request, quote_id: int) -> Response:
        actor = actor_from_request(request)
        quote = selectors.quote_get_for(buyer=actor.organisation, quote_id=quote_id)
        lease, created = lease_services.lease_accept(quote=quote, actor=actor)
        lease = selectors.lease_get_for_buyer(buyer=actor.organisation, lease_id=lease.pk)
        return Response(
            LeaseOutput(lease).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class LeaseListApi(generics.ListAPIView):
    """The buyer's leases, newest first."""

    permission_classes = [IsBuyer]
    serializer_class = LeaseOutput
    filterset_class = LeaseFilter
    queryset = Lease.objects.none()

    def get_queryset(self) -> QuerySet[Lease]:
        return selectors.lease_list_for_buyer(
            buyer=actor_from_request(self.request).organisation
        ).select_related("price_card__tariff_version__tariff")

    @extend_schema(operation_id="leases_list", tags=[TAG_LEASES])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class LeaseDetailApi(APIView):
    permission_classes = [IsBuyer]

    @extend_schema(operation_id="leases_get", responses={200: LeaseDetailOutput}, tags=[TAG_LEASES])
    def get(self, request: Request, lease_id: int) -> Response:
        buyer = actor_from_request(request).organisation
        return Response(LeaseDetailOutput(selectors.lease_get_for_buyer(buyer=buyer, lease_id=lease_id)).data)


class LeaseCancelApi(APIView):
    permission_classes = [IsBuyer]

    @extend_schema(
        operation_id="leases_cancel",
        request=None,
        responses={200: LeaseOutput, 409: ErrorSerializer},
        description="Cancel a lease: a reserved one is cancelled and its cards released at once; a "
        "running one is asked to stop (`stop_requested`). 409 `lease_invalid_transition` otherwise.",
        tags=[TAG_LEASES],
    )
    def post(self, request: Request, lease_id: int) -> Response:
        actor = actor_from_request(request)
        lease = selectors.lease_get_for_buyer(buyer=actor.organisation, lease_id=lease_id)
        lease_services.lease_cancel(lease_id=lease.pk, actor=actor)
        return Response(
            LeaseOutput(selectors.lease_get_for_buyer(buyer=actor.organisation, lease_id=lease_id)).data
        )


class NoticeOutput(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    message = serializers.CharField()
    job = serializers.IntegerField(source="job_id", allow_null=True)
    lease = serializers.IntegerField(source="lease_id", allow_null=True)
    created_at = serializers.DateTimeField()


class NoticeListApi(generics.ListAPIView):
    """What the broker told the buyer: re-placements, failures, stops for exhausted packs."""

    permission_classes = [IsBuyer]
    serializer_class = NoticeOutput
    queryset = BuyerNotice.objects.none()

    def get_queryset(self) -> QuerySet[BuyerNotice]:
        return selectors.notice_list_for(buyer=actor_from_request(self.request).organisation)

    @extend_schema(operation_id="notices_list", tags=[TAG_JOBS])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


urlpatterns = [
    path("jobs", JobListApi.as_view(), name="job-list"),
    path("jobs/<int:job_id>", JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel", JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/quotes", JobQuoteApi.as_view(), name="job-quotes"),
    path("quotes/<int:quote_id>/accept", QuoteAcceptApi.as_view(), name="quote-accept"),
    path("leases", LeaseListApi.as_view(), name="lease-list"),
    path("leases/<int:lease_id>", LeaseDetailApi.as_view(), name="lease-detail"),
    path("leases/<int:lease_id>/cancel", LeaseCancelApi.as_view(), name="lease-cancel"),
    path("notices", NoticeListApi.as_view(), name="notice-list"),
]
