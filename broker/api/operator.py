"""The operator's side of leases over REST: what operators' agents call.

Agents pull their leases (``GET /operator/leases``, with a change cursor and long-polling), report that a
lease started and stopped, and report usage against leases; they may also have lease events POSTed to
their clusters' endpoints, signed with a secret they rotate here. Every lease is scoped to the calling
operator: another operator's lease answers 404 ``lease_not_found`` exactly like a missing one; an
organisation that is not an operator gets 403 ``not_an_operator``.
"""

from __future__ import annotations

import random
import time
from typing import Annotated, Any

from django.conf import settings
from django.db import connection, transaction
from django.urls import URLPattern, path
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from pydantic import ConfigDict, Field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from typing_extensions import TypedDict

from broker import selectors, tasks
from broker.models import Lease, LeaseState
from broker.services import dispatch
from broker.services.leases import LEASE_FEED_TOPIC, lease_feed_key
from core.api.context import actor_from_request
from core.api.fields import AwareDateTimeField
from core.api.longpoll import LongPoll, long_poll_view
from core.api.pagination import PAGE_SCHEMA, PAGE_SIZE_SCHEMA, StandardPagination
from core.api.permissions import IsOperator
from core.api.schema import ErrorSerializer
from core.api.typed import AwareDateTime, TypedBody
from federation.api.schema import cluster_cpi_grammar
from federation.identifiers import MAX_LENGTH
from metering.errors import UsageBatchTooLargeError, UsageConflictError

TAG_OPERATOR = "operator leases"

_ID_MAX = 2**63 - 1
_WAIT_JITTER = 0.5  # a long-poll with nothing new answers after 50–100 % of its wait
_LEASE_STATES = f"One of: {', '.join(LeaseState.values)}."


# --- Output -----------------------------------------------------------------------------------------


class OperatorLeaseIslandOutput(serializers.Serializer):
    cpi = serializers.CharField(help_text="The island's compute identifier.")
    cards = serializers.IntegerField(help_text="Cards of this island the lease holds.")


class OperatorLeasePriceCardOutput(serializers.Serializer):
    version = serializers.IntegerField(help_text="The cluster's price-card version locked on the lease.")
    rate_per_card_hour = serializers.DecimalField(max_digits=12, decimal_places=4)
    currency = serializers.CharField()


class OperatorLeaseOutput(serializers.Serializer):
    """A lease as its operator sees it. The same document is the ``lease`` of every POSTed lease event
    (one function renders both: ``broker.services.dispatch.lease_document``)."""

    id = serializers.IntegerField()
    job = serializers.IntegerField(help_text="The buyer's job id.")
    buyer = serializers.CharField(help_text="The buyer organisation's slug.")
    cluster = serializers.CharField(help_text="The cluster's compute identifier.")
    islands = OperatorLeaseIslandOutput(many=True)
    cards = serializers.IntegerField()
    start_at = serializers.DateTimeField()
    end_at = serializers.DateTimeField()
    # Plain strings rather than enums, as in the buyer API: the same choices under several field names would
    # make drf-spectacular name one enum after whichever field it meets first.
    state = serializers.CharField(help_text=_LEASE_STATES)
    state_changed_at = serializers.DateTimeField()
    price_card = OperatorLeasePriceCardOutput()
    started_at = serializers.DateTimeField(allow_null=True)
    stop_requested_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    last_usage_end_at = serializers.DateTimeField(
        allow_null=True, help_text="The end of the latest usage reported against the lease."
    )
    replaces = serializers.IntegerField(
        allow_null=True, help_text="The lease this one replaces after a failover, if any."
    )
    reason = serializers.CharField(help_text="Why the lease last changed state, when known.")

    def to_representation(self, instance: Lease) -> dict[str, Any]:
        return dispatch.lease_document(lease=instance)


class OperatorLeaseTransitionOutput(serializers.Serializer):
    id = serializers.IntegerField(help_text="The transition id: the cursor of the lease feed.")
    from_state = serializers.CharField(allow_null=True, help_text="Null for the lease's creation.")
    to_state = serializers.CharField(help_text=_LEASE_STATES)
    at = serializers.DateTimeField()
    reason = serializers.CharField()


class OperatorLeaseDetailOutput(OperatorLeaseOutput):
    transitions = OperatorLeaseTransitionOutput(many=True)

    def to_representation(self, instance: Lease) -> dict[str, Any]:
        document = super().to_representation(instance)
        document["transitions"] = [
            {
                "id": t.pk,
                "from_state": t.from_state or None,
                "to_state": t.to_state,
                "at": dispatch.iso_datetime(t.at),
                "reason": t.reason,
            }
            for t in selectors.lease_transitions(lease=instance)
        ]
        return document


def _lease_response(*, operator: Any, lease_id: int) -> Response:
    lease = selectors.lease_get_for_operator(operator=operator, lease_id=lease_id)
    return Response(OperatorLeaseOutput(lease).data)


# --- The lease feed ---------------------------------------------------------------------------------


class OperatorLeaseListApi(APIView):
    """The calling operator's leases, for its agents to pull.

    Filters: `state` (repeat it or give a comma list), `cluster` (a CPI). Without `after`, leases come in
    id order and `cursor` is the operator's newest lease transition id; with `after=<cursor>`, only leases
    with a transition newer than it come, ordered by their newest transition, and `cursor` is the newest
    transition id in the page (or `after` itself when nothing changed). An agent lists once, then loops on
    `after=<cursor>`. `wait` (seconds, up to the platform's maximum, 30 by default) long-polls: when nothing
    matches, the request waits until a lease of the operator (of the cluster, with `cluster`) changes or the
    wait is over, then answers (an empty page when nothing came). A waiting request holds no server thread
    and no database connection (core.api.longpoll): the server is woken by PostgreSQL NOTIFY.

    Transition ids are taken when a transition is written and become visible when it commits a few
    milliseconds later, so very rarely a change can commit behind a cursor already handed out: agents should
    re-list without `after` now and then (every few minutes) as a safety net.
    """

    permission_classes = [IsOperator]

    class Filters(serializers.Serializer):
        state = serializers.ListField(
            child=serializers.ChoiceField(choices=LeaseState.choices), required=False
        )
        cluster = serializers.CharField(
            max_length=MAX_LENGTH, required=False, validators=[cluster_cpi_grammar]
        )
        after = serializers.IntegerField(min_value=0, max_value=_ID_MAX, required=False)
        wait = serializers.IntegerField(min_value=0, required=False, default=0)

        def validate_wait(self, value: int) -> int:
            limit = settings.CARDHOUR_LEASE_POLL_MAX_WAIT_SECONDS
            if value > limit:
                raise serializers.ValidationError(
                    _("Ensure this value is less than or equal to %(limit)d.") % {"limit": limit}
                )
            return value

    class Output(serializers.Serializer):
        count = serializers.IntegerField()
        next = serializers.URLField(allow_null=True)
        previous = serializers.URLField(allow_null=True)
        cursor = serializers.IntegerField(help_text="Pass it as `after` to get what changed since.")
        results = OperatorLeaseOutput(many=True)

    @extend_schema(
        operation_id="operator_leases_list",
        parameters=[
            OpenApiParameter(
                "state",
                str,
                many=True,
                explode=True,
                enum=LeaseState.values,
                description="Only leases in these states (repeat the parameter or give a comma list).",
            ),
            OpenApiParameter("cluster", str, description="Only leases on this cluster (its CPI)."),
            OpenApiParameter(
                "after",
                {"type": "integer", "minimum": 0, "maximum": _ID_MAX},
                description="A cursor (lease transition id): only leases changed since.",
            ),
            OpenApiParameter(
                "wait",
                {"type": "integer", "minimum": 0, "maximum": settings.CARDHOUR_LEASE_POLL_MAX_WAIT_SECONDS},
                description=(
                    "Seconds to wait for a matching lease when none matches yet (0–30). With nothing new, "
                    "the answer comes after 50–100 % of the wait, so agents started together drift apart."
                ),
            ),
            OpenApiParameter("page", PAGE_SCHEMA, description="A page number within the result set."),
            OpenApiParameter("page_size", PAGE_SIZE_SCHEMA, description="Leases per page (max 500)."),
        ],
        responses={200: Output},
        tags=[TAG_OPERATOR],
    )
    def get(self, request: Request) -> Response:
        operator = actor_from_request(request).organisation
        params: dict[str, Any] = {
            key: request.query_params[key]
            for key in ("cluster", "after", "wait")
            if key in request.query_params
        }
        states = [
            part.strip() for value in request.query_params.getlist("state") for part in value.split(",")
        ]
        if any(states):
            params["state"] = [s for s in states if s]
        filters = self.Filters(data=params)
        filters.is_valid(raise_exception=True)
        wanted = filters.validated_data
        after: int | None = wanted.get("after")
        wait: int = wanted["wait"]
        states_wanted = wanted.get("state", ())
        cluster_cpi: str | None = wanted.get("cluster")

        def page_data(*, empty_ok: bool) -> dict[str, Any] | None:
            leases, cursor = dispatch.lease_feed_for_operator(
                operator=operator, states=states_wanted, cluster=cluster_cpi, after=after
            )
            paginator = StandardPagination()
            page = paginator.paginate_queryset(leases, request, view=self) or []
            if not page and not empty_ok:
                return None
            if after is not None:
                cursor = max((lease.cursor_id for lease in page), default=after)  # type: ignore[attr-defined]
            assert paginator.page is not None
            return {
                "count": paginator.page.paginator.count,
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "cursor": cursor,
                "results": [dispatch.lease_document(lease=lease) for lease in page],
            }

        # Nothing to wait for, or inside a transaction (a caller's atomic block, or a test's) where nothing
        # can commit meanwhile: answer at once.
        def nothing_new() -> bool:
            # On the first page of a cursor, an indexed probe answers "nothing changed" without the page
            # query and its count: what most polls of a waiting agent, and every re-check, find.
            return (
                after is not None
                and "page" not in request.query_params
                and not dispatch.lease_feed_changed_since(operator=operator, after=after, cluster=cluster_cpi)
            )

        def recheck() -> dict[str, Any] | None:
            return None if nothing_new() else page_data(empty_ok=False)

        waits = bool(wait) and not connection.in_atomic_block
        if nothing_new():
            data: dict[str, Any] | None = {
                "count": 0,
                "next": None,
                "previous": None,
                "cursor": after,
                "results": [],
            }
        else:
            data = page_data(empty_ok=True)
        assert data is not None
        if data["results"] or not waits:
            return Response(data)
        response = Response(data)
        response.long_poll = LongPoll(  # type: ignore[attr-defined]
            topic=LEASE_FEED_TOPIC,
            keys=[lease_feed_key(operator=operator, cluster=cluster_cpi)],
            # A wait ends at a random point of its second half: agents that started together (after a
            # server restart, say) drift apart instead of re-polling in one herd every ``wait`` seconds.
            deadline=time.monotonic() + wait * (1 - _WAIT_JITTER * random.random()),  # noqa: S311
            recheck=recheck,
        )
        return response


class OperatorLeaseDetailApi(APIView):
    """One of the operator's leases with its state history."""

    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="operator_leases_get", responses={200: OperatorLeaseDetailOutput}, tags=[TAG_OPERATOR]
    )
    def get(self, request: Request, lease_id: int) -> Response:
        operator = actor_from_request(request).organisation
        lease = selectors.lease_get_for_operator(operator=operator, lease_id=lease_id)
        return Response(OperatorLeaseDetailOutput(lease).data)


# --- Start and stop ---------------------------------------------------------------------------------


class OperatorLeaseStartApi(APIView):
    """Report that a reserved lease started: reserved → running.

    `at` (default now) may be up to 5 minutes before the lease's `start_at`, must be before its `end_at`
    and at most 5 minutes in the future (`lease_time_invalid`, with `extra.reason`). Starting a lease that
    is already running (or asked to stop) answers 200 with it unchanged; a cancelled or ended lease is 409
    `lease_invalid_transition`.
    """

    permission_classes = [IsOperator]

    class Input(serializers.Serializer):
        at = AwareDateTimeField(required=False, help_text="When the lease started; default now.")

    @extend_schema(
        operation_id="operator_leases_start",
        request=Input,
        responses={200: OperatorLeaseOutput},
        tags=[TAG_OPERATOR],
    )
    def post(self, request: Request, lease_id: int) -> Response:
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        actor = actor_from_request(request)
        dispatch.lease_start(
            operator=actor.organisation, lease_id=lease_id, actor=actor, at=data.validated_data.get("at")
        )
        return _lease_response(operator=actor.organisation, lease_id=lease_id)


class OperatorLeaseStopApi(APIView):
    """Report that a lease stopped: running or stop_requested → `completed` (default) or `failed`; a
    reserved lease that could not be started may be reported `failed`. Its cards are released at once.

    `at` (default now) may not precede the lease's start nor the end of usage already reported, and may be
    at most 5 minutes in the future (`lease_time_invalid`). Usage of a stopped lease is still accepted up
    to `at`. Repeating a stop with the outcome the lease already has answers 200 with it unchanged; any
    other move is 409 `lease_invalid_transition`.
    """

    permission_classes = [IsOperator]

    class Input(serializers.Serializer):
        at = AwareDateTimeField(required=False, help_text="When the lease stopped; default now.")
        outcome = serializers.ChoiceField(
            choices=[(s.value, s.label) for s in dispatch.STOP_OUTCOMES], default=LeaseState.COMPLETED
        )
        reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    @extend_schema(
        operation_id="operator_leases_stop",
        request=Input,
        responses={200: OperatorLeaseOutput},
        tags=[TAG_OPERATOR],
    )
    def post(self, request: Request, lease_id: int) -> Response:
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        actor = actor_from_request(request)
        dispatch.lease_stop(
            operator=actor.organisation,
            lease_id=lease_id,
            actor=actor,
            at=data.validated_data.get("at"),
            outcome=data.validated_data["outcome"],
            reason=data.validated_data["reason"],
        )
        return _lease_response(operator=actor.organisation, lease_id=lease_id)


# --- Usage ------------------------------------------------------------------------------------------


class OperatorUsageCreateInputRecord(TypedDict):
    # A key's surrounding spaces are trimmed, as DRF's CharField did: "  k  " and "k" are one key.
    __pydantic_config__ = ConfigDict(str_strip_whitespace=True)  # type: ignore[misc]

    lease: Annotated[int, Field(ge=1, le=_ID_MAX, strict=True)]
    idempotency_key: Annotated[str, Field(min_length=1, max_length=200, strict=True)]
    start_at: Annotated[AwareDateTime, Field(description="Whole seconds; the interval is half-open.")]
    end_at: AwareDateTime
    cards: Annotated[int, Field(ge=1, strict=True)]


class OperatorUsageCreateInput(TypedDict):
    records: Annotated[
        list[OperatorUsageCreateInputRecord],
        Field(min_length=1, max_length=settings.CARDHOUR_USAGE_BATCH_MAX),
    ]


# The one declaration of a usage batch: it validates the body (pydantic-core, ~1 ms per 1,000 records where a
# DRF serializer took ~25 ms) and generates the request schema (core.api.typed).
USAGE_BODY = TypedBody(OperatorUsageCreateInput, name="OperatorUsageCreateInput")


class OperatorUsageCreateApi(APIView):
    """Report usage against leases: up to 10,000 records per request, each with the operator's own
    idempotency key, answered per record in order.

    Each record is checked against its lease — the lease is yours (`lease_not_found`), it has run
    (`lease_not_started`; late usage of an ended lease is fine), `[start_at, end_at)` lies inside the
    lease's window (`before_lease_start`, `after_lease_end`), not after the reported stop
    (`after_lease_ended`) and not more than one reporting interval (60 s) after the platform asked the lease
    to stop (`after_stop_request`), and `cards` ≤ the lease's cards (`cards_over_lease`). One bad record
    rejects the batch: 400 `lease_usage_invalid` with `extra.errors` `[{index, idempotency_key, code, field,
    message}]`, nothing written. Metering's own checks follow (400 `usage_batch_invalid`, 400
    `usage_batch_too_large`). Records are priced with the price card locked on their lease.

    Idempotency follows metering's rules: a key already stored with the same body is a `duplicate` (its
    original `usage_record`); with a different body a `conflict`. A conflict does not abort the batch:
    nothing is written for the conflicting record and the other records are stored. The answer is 201 when
    a record was created, 200 when every record was a duplicate, and 409 `usage_conflict` when any record
    conflicts, with the per-record outcomes and counts in `extra` (so a 409 may still have stored records:
    read `extra.records`).
    """

    throttle_purpose = "usage"  # its own budget per token (core.api.throttling)

    permission_classes = [IsOperator]

    class Output(serializers.Serializer):
        class Outcome(serializers.Serializer):
            index = serializers.IntegerField()
            idempotency_key = serializers.CharField()
            status = serializers.ChoiceField(choices=["created", "duplicate", "conflict"])
            usage_record = serializers.IntegerField(
                help_text="The stored record (the original for a replay)."
            )

        created = serializers.IntegerField()
        duplicates = serializers.IntegerField()
        conflicts = serializers.IntegerField()
        records = Outcome(many=True)

    @extend_schema(
        operation_id="operator_usage_create",
        request=USAGE_BODY,
        responses={
            201: Output,
            200: Output,
            409: OpenApiResponse(
                ErrorSerializer, description="`usage_conflict`: `extra` holds the counts and `records`."
            ),
        },
        tags=[TAG_OPERATOR],
    )
    def post(self, request: Request) -> Response:
        raw = request.data.get("records") if isinstance(request.data, dict) else None
        limit = settings.CARDHOUR_USAGE_BATCH_MAX
        if isinstance(raw, list) and len(raw) > limit:
            raise UsageBatchTooLargeError(
                _("A batch holds at most %(limit)d records, not %(n)d.") % {"limit": limit, "n": len(raw)},
                extra={"max": limit},
            )
        records = [
            dispatch.LeaseUsageInput(r["lease"], r["idempotency_key"], r["start_at"], r["end_at"], r["cards"])
            for r in USAGE_BODY.validate(request.data)["records"]
        ]
        actor = actor_from_request(request)
        result = dispatch.lease_usage_report(operator=actor.organisation, records=records, actor=actor)
        if result.created:
            # Enforcement on arrival: rate what was stored and stop its buyer if it emptied the packs.
            transaction.on_commit(tasks.usage_rate_on_arrival_request)
        body = {
            "created": result.created,
            "duplicates": result.duplicates,
            "conflicts": result.conflicts,
            "records": [
                {
                    "index": o.index,
                    "idempotency_key": o.idempotency_key,
                    "status": o.status,
                    "usage_record": o.record_id,
                }
                for o in result.outcomes
            ],
        }
        if result.conflicts:
            # The batch is committed (metering stores the records that do not conflict); the 409 says some
            # keys were reused with a different body.
            raise UsageConflictError(
                _(
                    "%(conflicts)d record(s) reuse an idempotency key with a different body; nothing was stored "
                    "for them. %(created)d other record(s) were stored."
                )
                % {"conflicts": result.conflicts, "created": result.created},
                extra=body,
            )
        return Response(body, status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)


# --- Lease events -----------------------------------------------------------------------------------


class OperatorEndpointSecretApi(APIView):
    """The secret that signs lease events POSTed to your clusters' endpoints.

    POST rotates it and enables delivery; the new secret is shown once, the old one stops signing at once.
    Each event is a JSON POST to the cluster's `endpoint_url` with `X-Cardhour-Event` (e.g.
    `lease.running`), `X-Cardhour-Delivery` (the event id), `X-Cardhour-Timestamp` (Unix seconds) and
    `X-Cardhour-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" under the secret>`; its body is
    `{id, type, lease, from_state, to_state, at, reason}` with `lease` as in the lease feed. A non-2xx
    answer is retried with exponential backoff (5 s doubling, at most an hour apart, 12 attempts). DELETE
    stops the POSTs and forgets the secret; pulling leases is unaffected.
    """

    permission_classes = [IsOperator]

    class Output(serializers.Serializer):
        secret = serializers.CharField(help_text="Shown once: store it now.")
        enabled = serializers.BooleanField()

    @extend_schema(
        operation_id="operator_endpoint_secret_rotate",
        request=None,
        responses={200: Output},
        tags=[TAG_OPERATOR],
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        endpoint = dispatch.operator_endpoint_secret_rotate(operator=actor.organisation, actor=actor)
        return Response(self.Output(endpoint).data)

    @extend_schema(
        operation_id="operator_endpoint_secret_delete",
        request=None,
        responses={204: None},
        tags=[TAG_OPERATOR],
    )
    def delete(self, request: Request) -> Response:
        actor = actor_from_request(request)
        dispatch.operator_endpoint_disable(operator=actor.organisation, actor=actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


urlpatterns: list[URLPattern] = [
    path("operator/leases", long_poll_view(OperatorLeaseListApi), name="operator-lease-list"),
    path("operator/leases/<int:lease_id>", OperatorLeaseDetailApi.as_view(), name="operator-lease-detail"),
    path(
        "operator/leases/<int:lease_id>/start", OperatorLeaseStartApi.as_view(), name="operator-lease-start"
    ),
    path("operator/leases/<int:lease_id>/stop", OperatorLeaseStopApi.as_view(), name="operator-lease-stop"),
    path("operator/usage", OperatorUsageCreateApi.as_view(), name="operator-usage-create"),
    path("operator/endpoint-secret", OperatorEndpointSecretApi.as_view(), name="operator-endpoint-secret"),
]
