"""Operators' side of a lease: the lease feed agents pull, start and stop reports, usage reported against a
lease, stopping the leases of buyers whose packs ran dry, and signed lease events POSTed to clusters.

Usage is the hot path (100,000 running leases reporting every minute). A batch costs a fixed number of
statements whatever its size: one locks every lease it names (``FOR NO KEY UPDATE``, in id order, so two
batches naming the same leases queue instead of deadlocking, and a stop report cannot slip between the
check and the insert), each record is checked in Python against its lease, metering's batch service stores
the records in the same transaction, and one statement moves the leases' ``last_usage_end_at`` forward.

Lease events are an outbox: ``lease_event_delivery_create`` writes the delivery row in the transaction that
records the transition, so an event exists exactly when its transition does. ``lease_events_deliver_due``
claims due rows (``skip_locked``), commits, POSTs with no transaction open (a slow endpoint never holds a
row lock or a connection in a transaction), and records each result in its own short statement.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import secrets
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Exists, F, Max, OuterRef, Prefetch, QuerySet, Subquery, Value, When
from django.db.models import DateTimeField as DateTimeModelField
from django.utils import timezone
from django.utils.translation import gettext as _

from broker import selectors
from broker.errors import (
    LeaseNotFoundError,
    LeaseTimeInvalidError,
    LeaseTransitionError,
    LeaseUsageInvalidError,
    LeaseUsageOverLeaseError,
)
from broker.models import (
    CapacityHold,
    Lease,
    LeaseEventDelivery,
    LeaseState,
    LeaseTransition,
    OperatorEndpoint,
)
from broker.services import leases, usage_overlap
from core.errors import ConflictError
from core.instants import EPOCH, MICROSECOND, at_epoch_micros
from core.instants import epoch_micros as _micros
from core.models import Organisation
from core.net import UnsafeEndpointError, post_pinned
from core.types import Actor
from federation.models import Cluster
from metering.errors import UsageBatchTooLargeError
from metering.models import BuyerExhaustion
from metering.selectors.usage_keys import usage_references_by_key
from metering.services.usage import USAGE_MAX_CLOCK_SKEW, usage_record_create_batch_of_leases
from metering.types import UsageBatchResult, UsageRecordOfLease

logger = logging.getLogger(__name__)

# An agent may report a start this long before the lease's start_at (clocks differ; a job may need a
# moment to be scheduled on the cards). Usage is still only accepted inside [start_at, end_at).
LEASE_START_GRACE = timedelta(minutes=5)
# A reported start or stop may lie this far in the future (an agent's clock running ahead), as for usage.
REPORT_MAX_CLOCK_SKEW = USAGE_MAX_CLOCK_SKEW

STOP_OUTCOMES = (LeaseState.COMPLETED, LeaseState.FAILED)
EXHAUSTION_REASON = "packs exhausted"
EXHAUSTION_NOTICE = "packs_exhausted"

EVENT_TIMEOUT_SECONDS = 5
EVENT_MAX_ATTEMPTS = 12
EVENT_BACKOFF_BASE_SECONDS = 5
EVENT_BACKOFF_MAX_SECONDS = 3600
# A claimed delivery is invisible to other workers this long; a worker that dies mid-batch leaves its
# claims to be retried after it. Longer than the time budget of one run plus one timeout.
EVENT_CLAIM_SECONDS = 120
# A delivery run stops POSTing after this long (each POST may wait 5 s for an endpoint): it shares the control
# queue's slots with the heartbeat monitor and failover.
EVENT_RUN_BUDGET_SECONDS = 20
# A stop run (exhaustion or a budget cap, each lease its own transaction) asks no further lease to stop after
# this long; the rest are the next run's, 10 s later (the safety net) or after the next rating. It runs on the
# control queue beside the heartbeat monitor and failover, so one run over thousands of leases on an
# overloaded database must not hold a worker slot for minutes (a design-load soak saw one reach its 5-minute
# soft limit, and later two runs of 35-50 s each starving the monitor of both of the worker's slots).
STOP_RUN_BUDGET_SECONDS = 5.0
# Leases asked to stop per transaction: fewer commits than one each, while the chunk's row locks are held briefly
# (a usage report for one of them waits for them: a soak with chunks of 100 on an overloaded database held them
# for 30 s and a report hit its lock timeout). Leases another transaction holds (a usage report, failover) are
# skipped, not waited for: the next run takes them, and concurrent runs share the work instead of queueing on it.
STOP_CHUNK = 25

_ID_MAX = 2**63


# --- Reads the operator API and the event payload share ---------------------------------------------


def iso_datetime(value: datetime | None) -> str | None:
    """A datetime as the API renders it (DRF's ISO 8601 in the current time zone, ``Z`` for UTC)."""
    if value is None:
        return None
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _leases_with_details() -> QuerySet[Lease]:
    return Lease.objects.select_related("cluster", "buyer", "price_card").prefetch_related(
        Prefetch("holds", queryset=CapacityHold.objects.select_related("island").order_by("island_id"))
    )


def lease_document(*, lease: Lease) -> dict[str, Any]:
    """A lease as its operator sees it: the pull API's item and the ``lease`` of a POSTed event.

    ``lease`` needs cluster, buyer, price card and holds (with islands) loaded, as the operator
    selectors and ``lease_feed_for_operator`` do, or it costs a query per relation.
    """
    return {
        "id": lease.pk,
        "job": lease.job_id,
        "buyer": lease.buyer.slug,
        "cluster": lease.cluster.cpi,
        "islands": [{"cpi": hold.island.cpi, "cards": hold.cards} for hold in lease.holds.all()],
        "cards": lease.cards,
        "start_at": iso_datetime(lease.start_at),
        "end_at": iso_datetime(lease.end_at),
        "state": lease.state,
        "state_changed_at": iso_datetime(lease.state_changed_at),
        "price_card": {
            "version": lease.price_card.version,
            "rate_per_card_hour": str(lease.price_card.rate_per_card_hour),
            "currency": lease.price_card.currency,
        },
        "started_at": iso_datetime(lease.started_at),
        "stop_requested_at": iso_datetime(lease.stop_requested_at),
        "ended_at": iso_datetime(lease.ended_at),
        "last_usage_end_at": iso_datetime(lease.last_usage_end_at),
        "replaces": lease.replaces_id,
        "reason": lease.reason,
    }


def lease_feed_for_operator(
    *,
    operator: Organisation,
    states: Sequence[str] = (),
    cluster: str | None = None,
    after: int | None = None,
) -> tuple[QuerySet[Lease], int]:
    """The operator's leases for its agents to pull, and the cursor to pull changes from next.

    Without ``after``: the matching leases in id order; the cursor is the operator's newest transition id,
    read *before* the leases, so following the cursor afterwards misses nothing listed later.
    With ``after`` (a transition id): only leases with a transition newer than it, ordered by their newest
    transition id (annotated as ``cursor_id``); the caller's cursor is the last ``cursor_id`` it returns.
    """
    qs = selectors.lease_list_for_operator(operator=operator)
    if states:
        qs = qs.filter(state__in=states)
    if cluster:
        qs = qs.filter(cluster__cpi=cluster)
    if after is None:
        newest = LeaseTransition.objects.filter(operator=operator).aggregate(newest=Max("id"))["newest"]
        return qs.order_by("pk"), newest or 0
    changed = LeaseTransition.objects.filter(operator=operator, id__gt=after).values("lease_id")
    latest = LeaseTransition.objects.filter(lease=OuterRef("pk")).order_by("-id").values("id")[:1]
    qs = qs.filter(pk__in=changed).annotate(cursor_id=Subquery(latest)).order_by("cursor_id", "pk")
    return qs, after


def lease_feed_changed_since(*, operator: Organisation, after: int, cluster: str | None = None) -> bool:
    """Whether any of the operator's leases (on ``cluster``, when given) changed after the cursor: one
    indexed probe, so a long-poll with nothing new costs neither the page query nor its count. A superset
    of what the feed returns (states are not looked at): a yes is followed by the feed itself."""
    # SQL rather than the ORM: every waiting agent's poll and re-check makes this probe, and compiling the
    # queryset cost about five times the query itself (0.7 against 0.14 ms of CPU).
    transition, lease, cluster_table = (
        LeaseTransition._meta.db_table,
        Lease._meta.db_table,
        Cluster._meta.db_table,
    )
    if cluster:
        sql = (
            f'SELECT 1 FROM "{transition}" t JOIN "{lease}" l ON l."id" = t."lease_id" '  # noqa: S608 - names from the models
            f'JOIN "{cluster_table}" c ON c."id" = l."cluster_id" '
            'WHERE t."operator_id" = %s AND t."id" > %s AND c."cpi" = %s LIMIT 1'
        )
        params: list[Any] = [operator.pk, after, cluster]
    else:
        sql = f'SELECT 1 FROM "{transition}" t WHERE t."operator_id" = %s AND t."id" > %s LIMIT 1'  # noqa: S608
        params = [operator.pk, after]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


# --- Start and stop ---------------------------------------------------------------------------------


def _lease_lock_for(*, operator: Organisation, lease_id: int) -> Lease:
    """The operator's lease, locked; another operator's lease is LeaseNotFoundError, like a missing one."""
    lease = None
    if 0 < lease_id < _ID_MAX:
        try:
            lease = leases.lease_lock(lease_id=lease_id)
        except Lease.DoesNotExist:
            lease = None
    if lease is None or lease.operator_id != operator.pk:
        raise LeaseNotFoundError(_("No lease %(id)s.") % {"id": lease_id}, extra={"lease_id": lease_id})
    return lease


def _check_transition(*, lease: Lease, to_state: str) -> None:
    if to_state not in leases.TRANSITIONS[lease.state]:
        raise LeaseTransitionError(
            _("Lease %(lease)s is %(state)s; it cannot become %(to_state)s.")
            % {"lease": lease.pk, "state": lease.state, "to_state": to_state},
            extra={"lease_id": lease.pk, "state": lease.state, "to_state": to_state},
        )


def _time_invalid(lease: Lease, reason: str, message: str, **extra: Any) -> LeaseTimeInvalidError:
    return LeaseTimeInvalidError(
        message, extra={"lease_id": lease.pk, "field": "at", "reason": reason, **extra}
    )


@transaction.atomic
def lease_start(*, operator: Organisation, lease_id: int, actor: Actor, at: datetime | None = None) -> Lease:
    """The operator reports that a reserved lease started at ``at`` (default now): reserved → running.

    Idempotent: a lease already running (or asked to stop since) is returned unchanged. ``at`` may be up to
    LEASE_START_GRACE (5 minutes) before the lease's start_at, must be before its end_at and at most 5
    minutes in the future. Raises LeaseNotFoundError (also for another operator's lease),
    LeaseTransitionError (the lease is cancelled, ended, ...), LeaseTimeInvalidError. Writes nothing on error.
    """
    lease = _lease_lock_for(operator=operator, lease_id=lease_id)
    if lease.state in (LeaseState.RUNNING, LeaseState.STOP_REQUESTED):
        return lease
    _check_transition(lease=lease, to_state=LeaseState.RUNNING)
    now = timezone.now()
    at = at or now
    earliest = lease.start_at - LEASE_START_GRACE
    if at > now + REPORT_MAX_CLOCK_SKEW:
        raise _time_invalid(lease, "in_future", f"at {at.isoformat()} is in the future.")
    if at < earliest:
        raise _time_invalid(
            lease,
            "before_start",
            f"Lease {lease.pk} starts at {lease.start_at.isoformat()}; a start is accepted from "
            f"{earliest.isoformat()} ({int(LEASE_START_GRACE.total_seconds())} s earlier) on.",
            earliest_at=earliest.isoformat(),
        )
    if at >= lease.end_at:
        raise _time_invalid(
            lease,
            "after_end",
            f"Lease {lease.pk} ended at {lease.end_at.isoformat()}; it cannot start after its window.",
            end_at=lease.end_at.isoformat(),
        )
    leases.lease_transition(lease=lease, to_state=LeaseState.RUNNING, actor=actor, at=at)
    return lease


@transaction.atomic
def lease_stop(
    *,
    operator: Organisation,
    lease_id: int,
    actor: Actor,
    at: datetime | None = None,
    outcome: str = LeaseState.COMPLETED,
    reason: str = "",
) -> Lease:
    """The operator reports that a lease stopped at ``at`` (default now), ``completed`` or ``failed``:
    running | stop_requested → the outcome (a reserved lease may also be reported ``failed``: it could not
    be started). The cards are released at once.

    Idempotent: a lease already in ``outcome`` is returned unchanged. ``at`` may not precede the lease's
    due start (less the start grace) when it never ran, its start or the end of usage already reported
    against it, and may be at most 5 minutes in the future.
    Raises LeaseNotFoundError, LeaseTransitionError, LeaseTimeInvalidError. Writes nothing on error.
    """
    if outcome not in STOP_OUTCOMES:
        raise LeaseTransitionError(
            _("A stop is reported as completed or failed, not %(outcome)r.") % {"outcome": outcome},
            extra={"lease_id": lease_id, "to_state": outcome},
        )
    lease = _lease_lock_for(operator=operator, lease_id=lease_id)
    if lease.state == outcome:
        return lease
    _check_transition(lease=lease, to_state=outcome)
    now = timezone.now()
    at = at or now
    if at > now + REPORT_MAX_CLOCK_SKEW:
        raise _time_invalid(lease, "in_future", f"at {at.isoformat()} is in the future.")
    if lease.started_at is None and at < lease.start_at - LEASE_START_GRACE:
        # A reserved lease reported failed: it cannot have failed long before it was due to start (nor, say,
        # in year 825, whose local time has no RFC 3339 offset to answer with).
        raise _time_invalid(
            lease,
            "before_start",
            f"Lease {lease.pk} was due to start at {lease.start_at.isoformat()}; it cannot have failed before.",
            start_at=lease.start_at.isoformat(),
        )
    if lease.started_at is not None and at < lease.started_at:
        raise _time_invalid(
            lease,
            "before_started",
            f"Lease {lease.pk} started at {lease.started_at.isoformat()}; it cannot stop before that.",
            started_at=lease.started_at.isoformat(),
        )
    if lease.last_usage_end_at is not None and at < lease.last_usage_end_at:
        raise _time_invalid(
            lease,
            "before_last_usage",
            f"Usage up to {lease.last_usage_end_at.isoformat()} was reported against lease {lease.pk}; "
            "it cannot have stopped earlier.",
            last_usage_end_at=lease.last_usage_end_at.isoformat(),
        )
    default_reason = (
        "stopped by the operator" if outcome == LeaseState.COMPLETED else "failed at the operator"
    )
    leases.lease_transition(
        lease=lease, to_state=outcome, actor=actor, at=at, reason=reason or default_reason
    )
    return lease


# --- Usage ------------------------------------------------------------------------------------------


class LeaseUsageInput(NamedTuple):
    """One usage record as an operator's agent reports it against a lease: ``cards`` used over the
    half-open ``[start_at, end_at)`` (aware, whole seconds), under the operator's idempotency key.

    A named tuple, not a frozen dataclass: a batch builds a thousand, and a frozen dataclass's ``__init__``
    (``object.__setattr__`` per field) cost ~2.5× as much per record."""

    lease_id: int
    idempotency_key: str
    start_at: datetime
    end_at: datetime
    cards: int


class _LeaseRow(NamedTuple):
    """What the usage checks need of a locked lease. Instants are integer microseconds since the epoch: a
    thousand leases' six timestamps cost ~20 ms to load as datetimes, as much as the rest of the checks."""

    id: int
    state: str
    cards: int
    cluster_id: int
    buyer_id: int
    price_card_id: int
    has_run: bool
    start_us: int
    end_us: int
    stop_requested_us: int | None
    ended_us: int | None
    last_usage_end_us: int | None
    replaces_id: int | None


def _micros_or_none(value: datetime | None) -> int | None:
    return None if value is None else _micros(value)


def _at_micros(value: int) -> str:
    return iso_datetime(at_epoch_micros(value)) or ""


@dataclass(frozen=True)
class _UsageError:
    index: int
    idempotency_key: str
    code: str
    field: str
    message: str
    detail: dict[str, Any] | None = None


def _usage_error_document(error: _UsageError) -> dict[str, Any]:
    document: dict[str, Any] = {
        "index": error.index,
        "idempotency_key": error.idempotency_key,
        "code": error.code,
        "field": error.field,
        "message": error.message,
    }
    if error.detail:
        document.update(error.detail)
    return document


def _usage_spans(records: Sequence[LeaseUsageInput]) -> list[tuple[int, int] | None]:
    """Each record's ``[start, end)`` in microseconds since the epoch, or None where a timestamp is not an
    aware datetime (metering reports those): computed once for the checks that follow."""
    spans: list[tuple[int, int] | None] = []
    for record in records:
        start, end = record.start_at, record.end_at
        if type(start) is datetime and type(end) is datetime and start.tzinfo is UTC and end.tzinfo is UTC:
            # What the API passes (core.api.typed answers datetime.UTC): no offset to ask for.
            spans.append(((start - EPOCH) // MICROSECOND, (end - EPOCH) // MICROSECOND))
        elif (
            isinstance(start, datetime)
            and isinstance(end, datetime)
            and start.utcoffset() is not None
            and end.utcoffset() is not None
        ):
            spans.append((_micros(start), _micros(end)))
        else:
            spans.append(None)
    return spans


def _usage_overruns(
    *,
    operator: Organisation,
    records: Sequence[LeaseUsageInput],
    rows: dict[int, _LeaseRow],
    spans: Sequence[tuple[int, int] | None],
) -> list[_UsageError]:
    """``usage_over_lease`` faults: records that would take their lease (or its failover chain) over its
    cards at some instant, counting what is already stored (see broker.services.usage_overlap)."""
    fresh = [
        usage_overlap.NewRecord(
            index, record.idempotency_key, record.lease_id, record.cards, span[0], span[1]
        )
        for index, (record, span) in enumerate(zip(records, spans, strict=True))
        if isinstance(record.cards, int) and span is not None and span[1] > span[0]
    ]
    overruns = usage_overlap.usage_overruns(operator_id=operator.pk, leases=rows, records=fresh)
    return [
        _UsageError(
            o.index,
            o.key,
            usage_overlap.CODE,
            "cards",
            _(
                "Lease %(lease)s holds %(cards)d cards; with this record %(peak)d cards would be reported at once "
                "from %(start)s to %(end)s."
            )
            % {
                "lease": o.lease_id,
                "cards": o.lease_cards,
                "peak": o.peak_cards,
                "start": _at_micros(o.overlap_start_us),
                "end": _at_micros(o.overlap_end_us),
            },
            {
                "lease": o.lease_id,
                "lease_cards": o.lease_cards,
                "reported_cards": o.peak_cards,
                "overlap_start_at": _at_micros(o.overlap_start_us),
                "overlap_end_at": _at_micros(o.overlap_end_us),
            },
        )
        for o in overruns
    ]


def _usage_leases(*, operator: Organisation, lease_ids: set[int]) -> dict[int, _LeaseRow]:
    """Lock the operator's leases named by a batch (``FOR NO KEY UPDATE``, id order) and return them by id.

    On PostgreSQL the lock order is id order by construction, whatever the planner thinks of the table's or
    the batch's size: the sorted ids are unnested and each is locked by its own primary-key probe (a LATERAL
    subquery the lock keeps apart, so a nested loop over the ids is the only plan). Two batches naming the
    same leases therefore take their locks in the same order and queue instead of deadlocking. Written as
    ``id = ANY(ids) ORDER BY id`` the planner read the whole table (Seq Scan or bitmap, then a sort) once a
    batch named a large share of it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                SELECT lease.*
                  FROM unnest(%s::bigint[]) WITH ORDINALITY AS batch(id, n)
                 CROSS JOIN LATERAL (
                       SELECT id, state, cards, cluster_id, buyer_id, price_card_id, started_at IS NOT NULL,
                              (EXTRACT(EPOCH FROM start_at) * 1000000)::bigint,
                              (EXTRACT(EPOCH FROM end_at) * 1000000)::bigint,
                              (EXTRACT(EPOCH FROM stop_requested_at) * 1000000)::bigint,
                              (EXTRACT(EPOCH FROM ended_at) * 1000000)::bigint,
                              (EXTRACT(EPOCH FROM last_usage_end_at) * 1000000)::bigint,
                              replaces_id
                         FROM {Lease._meta.db_table}
                        WHERE id = batch.id AND operator_id = %s
                          FOR NO KEY UPDATE
                       ) AS lease
                 ORDER BY batch.n
                """,  # noqa: S608  # the table name is the model's, the values are parameters
                [_bigint_array(sorted(lease_ids)), operator.pk],
            )
            return {row[0]: _LeaseRow(*row) for row in cursor.fetchall()}
    rows = (
        Lease.objects.filter(pk__in=lease_ids, operator=operator)
        .select_for_update(no_key=True)
        .order_by("pk")
        .values_list(
            "pk",
            "state",
            "cards",
            "cluster_id",
            "buyer_id",
            "price_card_id",
            "started_at",
            "start_at",
            "end_at",
            "stop_requested_at",
            "ended_at",
            "last_usage_end_at",
            "replaces_id",
        )
    )
    return {
        row[0]: _LeaseRow(
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            row[6] is not None,
            _micros(row[7]),
            _micros(row[8]),
            _micros_or_none(row[9]),
            _micros_or_none(row[10]),
            _micros_or_none(row[11]),
            row[12],
        )
        for row in rows
    }


def _usage_errors(
    *,
    records: Sequence[LeaseUsageInput],
    rows: dict[int, _LeaseRow],
    spans: Sequence[tuple[int, int] | None],
) -> list[_UsageError]:
    interval_us = settings.CARDHOUR_USAGE_REPORT_INTERVAL_SECONDS * 1_000_000
    errors: list[_UsageError] = []
    for index, record in enumerate(records):
        key = record.idempotency_key
        lease = rows.get(record.lease_id)
        if lease is None:
            errors.append(
                _UsageError(
                    index, key, "lease_not_found", "lease", _("No lease %(id)s.") % {"id": record.lease_id}
                )
            )
            continue
        if not lease.has_run:
            errors.append(
                _UsageError(
                    index,
                    key,
                    "lease_not_started",
                    "lease",
                    _("Lease %(lease)s is %(state)s and never ran.")
                    % {"lease": lease.id, "state": lease.state},
                )
            )
            continue
        cards = record.cards
        if isinstance(cards, int) and not isinstance(cards, bool) and cards > lease.cards:
            errors.append(
                _UsageError(
                    index,
                    key,
                    "cards_over_lease",
                    "cards",
                    _("Lease %(lease)s holds %(cards)d cards, not %(reported)s.")
                    % {"lease": lease.id, "cards": lease.cards, "reported": cards},
                )
            )
        span = spans[index]
        if span is None:
            continue  # metering reports the timestamps themselves
        start_us, end_us = span
        if start_us < lease.start_us:
            errors.append(
                _UsageError(
                    index,
                    key,
                    "before_lease_start",
                    "start_at",
                    _("Lease %(lease)s starts at %(at)s.")
                    % {"lease": lease.id, "at": _at_micros(lease.start_us)},
                )
            )
        if end_us > lease.end_us:
            errors.append(
                _UsageError(
                    index,
                    key,
                    "after_lease_end",
                    "end_at",
                    _("Lease %(lease)s ends at %(at)s.")
                    % {"lease": lease.id, "at": _at_micros(lease.end_us)},
                )
            )
        elif lease.ended_us is not None and end_us > lease.ended_us:
            errors.append(
                _UsageError(
                    index,
                    key,
                    "after_lease_ended",
                    "end_at",
                    _("Lease %(lease)s stopped at %(at)s.")
                    % {"lease": lease.id, "at": _at_micros(lease.ended_us)},
                )
            )
        elif lease.stop_requested_us is not None and end_us > lease.stop_requested_us + interval_us:
            errors.append(
                _UsageError(
                    index,
                    key,
                    "after_stop_request",
                    "end_at",
                    _(
                        "Lease %(lease)s was asked to stop at %(at)s; usage is accepted up to %(until)s (one "
                        "reporting interval later)."
                    )
                    % {
                        "lease": lease.id,
                        "at": _at_micros(lease.stop_requested_us),
                        "until": _at_micros(lease.stop_requested_us + interval_us),
                    },
                )
            )
    return errors


def _replays(
    *, operator: Organisation, records: Sequence[LeaseUsageInput], errors: list[_UsageError]
) -> set[int]:
    """Indexes of faulty records whose key is already stored against the same lease: a replay of a batch
    that was valid when first sent (its lease has since been asked to stop, or stopped). Metering answers
    them ``duplicate`` (or ``conflict``); only looked up when a batch has faults, so it costs the hot path
    nothing."""
    candidates = {e.index for e in errors if e.code != "lease_not_found"}
    if not candidates:
        return set()
    keys = {records[i].idempotency_key for i in candidates}
    stored = usage_references_by_key(operator_id=operator.pk, keys=keys)
    return {i for i in candidates if stored.get(records[i].idempotency_key) == f"lease:{records[i].lease_id}"}


def _bigint_array(values: Iterable[int]) -> str:
    """A ``bigint[]`` literal: psycopg dumps a list parameter element by element (a regular expression
    per element), which for the hundreds of leases a batch names cost as much as the statement."""
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def _advance_last_usage(*, ends: dict[int, datetime]) -> None:
    """Set each lease's last_usage_end_at to the later of its value and ``ends[lease]``: one statement.

    The lock and this update cost ~25 µs of PostgreSQL CPU per lease a batch names, flat in the leases on the
    platform (the update is HOT, broker 0011). A narrow frontier table of its own was measured
    (benchmarks.lease_frontier) and costs more at 300,000 leases, not less: the facts must still be read from
    the lease row, so it adds a second random access per lease; only folding the lock into the update saves
    (~20 %), at the price of a lock order the planner no longer guarantees."""
    if not ends:
        return
    if connection.vendor == "postgresql":
        ids = sorted(ends)
        with connection.cursor() as cursor:
            # Ends travel as epoch microseconds (exact): two array literals. ``id = ANY(ARRAY[batch.id])``, not
            # ``id = batch.id``: a condition the planner can neither hash nor merge, so the only plan is a
            # nested loop probing the primary key once per lease, in the (id) order of the array. As an
            # equality it hashed the batch and read the whole lease table (at 10,000 leases for a batch of
            # ~130, at 100,000 for ~3,000). The rows are this transaction's already (_usage_leases).
            cursor.execute(
                f"""
                UPDATE {Lease._meta.db_table} AS lease
                   SET last_usage_end_at = GREATEST(
                           lease.last_usage_end_at,
                           TIMESTAMPTZ 'epoch' + batch.end_us * INTERVAL '1 microsecond'
                       )
                  FROM unnest(%s::bigint[], %s::bigint[]) AS batch(id, end_us)
                 WHERE lease.id = ANY(ARRAY[batch.id])
                """,  # noqa: S608  # the table name is the model's, the values are parameters
                [_bigint_array(ids), _bigint_array(_micros(ends[i]) for i in ids)],
            )
        return
    # Elsewhere (SQLite) the rows were read in this transaction and only later values are passed in. Leases
    # reporting together mostly share an end, so one branch per distinct end keeps the statement short.
    by_end: dict[datetime, list[int]] = {}
    for pk, end in ends.items():
        by_end.setdefault(end, []).append(pk)
    Lease.objects.filter(pk__in=list(ends)).update(
        last_usage_end_at=Case(
            *[
                When(pk__in=pks, then=Value(end, output_field=DateTimeModelField()))
                for end, pks in by_end.items()
            ],
            default=F("last_usage_end_at"),
        )
    )


@transaction.atomic
def lease_usage_report(
    *,
    operator: Organisation,
    records: Sequence[LeaseUsageInput],
    actor: Actor,
    now: datetime | None = None,
) -> UsageBatchResult:
    """Store usage reported against the operator's leases; answer per record, in order.

    Every record is checked against its lease first: the lease is this operator's (``lease_not_found``),
    it has run (``lease_not_started``: running, asked to stop, or ended after running — late usage of an
    ended lease is fine), ``[start_at, end_at)`` lies inside the lease's window (``before_lease_start``,
    ``after_lease_end``) and not after its stop (``after_lease_ended``) nor more than one reporting interval
    after a stop request (``after_stop_request``), and cards ≤ the lease's cards (``cards_over_lease``).
    Any fault raises LeaseUsageInvalidError listing each by index; nothing is written. A faulty record
    whose key is already stored against the same lease is a replay and passes through to metering. Then the
    cards: at no instant may what the lease (and the leases replacing it after failover) has reported under
    any key, plus the batch's new records, exceed its cards — else LeaseUsageOverLeaseError
    (``usage_over_lease``) names each offending record with the overlapping interval; nothing is written.

    The records then go to metering's batch service (usage_record_create_batch_of_leases) with the lease's
    cluster, buyer and *locked* price card as ids and ``lease:<id>`` as reference, so metering's rules apply
    unchanged: UsageBatchTooLargeError
    and UsageBatchInvalidError (nothing written), a known key with the same body is a ``duplicate`` (the
    original record), with a different body a ``conflict`` (nothing written for that record; the others
    are stored). Each lease's last_usage_end_at moves to the latest end of its created or duplicate
    records. ``actor`` is who reported (the batch itself is the audit trail: records carry the operator).
    """
    limit = settings.CARDHOUR_USAGE_BATCH_MAX
    if len(records) > limit:
        raise UsageBatchTooLargeError(
            _("A batch holds at most %(limit)d records, not %(n)d.") % {"limit": limit, "n": len(records)},
            extra={"max": limit},
        )
    if not records:
        return UsageBatchResult(outcomes=())
    lease_ids = {r.lease_id for r in records if isinstance(r.lease_id, int) and 0 < r.lease_id < _ID_MAX}
    rows = _usage_leases(operator=operator, lease_ids=lease_ids)
    spans = _usage_spans(records)
    errors = _usage_errors(records=records, rows=rows, spans=spans)
    if errors:
        replays = _replays(operator=operator, records=records, errors=errors)
        errors = [e for e in errors if e.index not in replays]
    if not errors:
        errors = _usage_overruns(operator=operator, records=records, rows=rows, spans=spans)
        if errors:
            shown = errors[:100]
            raise LeaseUsageOverLeaseError(
                _(
                    "%(n)d record(s) would report more cards at once than their lease holds; nothing was "
                    "written. First: record %(index)d: %(message)s"
                )
                % {"n": len(errors), "index": shown[0].index, "message": shown[0].message},
                extra={"error_count": len(errors), "errors": [_usage_error_document(e) for e in shown]},
            )
    if errors:
        shown = errors[:100]
        raise LeaseUsageInvalidError(
            _("%(n)d fault(s) in the batch; nothing was written. First: record %(index)d: %(message)s")
            % {"n": len(errors), "index": shown[0].index, "message": shown[0].message},
            extra={
                "error_count": len(errors),
                "errors": [_usage_error_document(e) for e in shown],
            },
        )
    # The lease names the cluster, the buyer and the locked price card: metering takes them as they are.
    inputs = []
    for record in records:
        row = rows[record.lease_id]
        inputs.append(
            UsageRecordOfLease(
                record.idempotency_key,
                row.cluster_id,
                row.buyer_id,
                row.price_card_id,
                record.cards,
                record.start_at,
                record.end_at,
                f"lease:{record.lease_id}",
            )
        )
    result = usage_record_create_batch_of_leases(operator=operator, records=inputs, now=now)

    ends: dict[int, datetime] = {}
    for outcome in result.outcomes:
        if outcome.status == "conflict":
            continue
        record = records[outcome.index]
        newest = ends.get(record.lease_id)
        if newest is None or record.end_at > newest:
            ends[record.lease_id] = record.end_at
    later = {}
    for lease_id, end in ends.items():
        known = rows[lease_id].last_usage_end_us
        if known is None or _micros(end) > known:
            later[lease_id] = end
    _advance_last_usage(ends=later)
    return result


# --- Exhausted packs --------------------------------------------------------------------------------


def leases_stop_exhausted(*, buyer_ids: Collection[int] | None = None, now: datetime | None = None) -> int:
    """Ask operators to stop the running leases of buyers whose packs ran dry; return how many.

    For every open metering exhaustion flag (a buyer, a chip class), the buyer's running leases on clusters
    of that chip move to stop_requested (the operator pulls the change or receives the event) and the buyer
    gets a ``packs_exhausted`` notice. Usage ending more than one reporting interval after the request is
    refused (see lease_usage_report), so no card-hour runs unpaid beyond it. Leases are stopped
    ``STOP_CHUNK`` to a transaction, skipping those another transaction holds (the next run takes them), for
    at most ``STOP_RUN_BUDGET_SECONDS``; a lease already asked to stop is not touched again, so the task is
    safe to run twice and beside itself.
    Metering clears a flag when a pack of the class (or of standard cards) is credited. ``buyer_ids``
    limits it to those buyers' leases.
    """
    now = now or timezone.now()
    started = time.monotonic()
    # From the open flags (few, by a partial index) to those buyers' running leases (by buyer and state), never
    # a scan of every running lease: this runs after every rating on arrival, several times a second.
    flags = BuyerExhaustion.objects.filter(cleared_at__isnull=True)
    if buyer_ids is not None:
        flags = flags.filter(buyer_id__in=buyer_ids)
    flagged = set(flags.values_list("buyer_id", flat=True))
    if not flagged:
        return 0
    open_flag = BuyerExhaustion.objects.filter(
        cleared_at__isnull=True,
        buyer_id=OuterRef("buyer_id"),
        pack_class=OuterRef("cluster__accelerator__slug"),
    )
    lease_ids = list(
        Lease.objects.filter(Exists(open_flag), buyer_id__in=flagged, state=LeaseState.RUNNING)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    stopped = 0
    for position in range(0, len(lease_ids), STOP_CHUNK):
        # The first chunk always goes, so a run whose selection alone took the budget still stops some.
        if position and time.monotonic() - started > STOP_RUN_BUDGET_SECONDS:
            logger.warning(
                "stop run over its %.0f s budget: %d exhausted buyers' leases left to the next run",
                STOP_RUN_BUDGET_SECONDS,
                len(lease_ids) - position,
            )
            break
        stopped += _leases_stop_for_exhaustion(lease_ids=lease_ids[position : position + STOP_CHUNK], now=now)
    return stopped


def _running_locked(*, lease_ids: Sequence[int]) -> list[Lease]:
    """Those of the leases that are still running, locked for the rest of the transaction, in id order;
    a lease another transaction holds is skipped (the next run takes it)."""
    return list(
        Lease.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("cluster__accelerator")
        .filter(pk__in=lease_ids, state=LeaseState.RUNNING)
        .order_by("pk")
    )


def _lease_stop_with_notice(
    *, lease: Lease, actor: str, reason: str, kind: str, message: str, now: datetime
) -> None:
    """Move a locked running lease to stop_requested and tell its buyer why (the one stop step of enforcement)."""
    leases.lease_transition(
        lease=lease, to_state=LeaseState.STOP_REQUESTED, actor=Actor.system(actor), reason=reason, at=now
    )
    leases.notice_create(
        buyer_id=lease.buyer_id, kind=kind, message=message, job_id=lease.job_id, lease_id=lease.pk
    )


@transaction.atomic
def _leases_stop_for_exhaustion(*, lease_ids: Sequence[int], now: datetime) -> int:
    locked = _running_locked(lease_ids=lease_ids)
    if not locked:
        return 0
    # Re-read under the locks: a pack credited since the leases were selected clears its flag.
    still_open = set(
        BuyerExhaustion.objects.filter(
            cleared_at__isnull=True, buyer_id__in={lease.buyer_id for lease in locked}
        ).values_list("buyer_id", "pack_class")
    )
    stopped = 0
    for lease in locked:
        chip = lease.cluster.accelerator.slug
        if (lease.buyer_id, chip) not in still_open:
            continue
        _lease_stop_with_notice(
            lease=lease,
            actor="broker: packs exhausted",
            reason=f"{EXHAUSTION_REASON}: no {chip} or standard card-hours left",
            kind=EXHAUSTION_NOTICE,
            message=(
                f"Your {chip} card-hour packs ran out, so lease {lease.pk} on {lease.cluster.cpi} was asked to "
                "stop. Buy a pack to run it again."
            ),
            now=now,
        )
        stopped += 1
    return stopped


# --- Enforcement: stop what rating flagged ----------------------------------------------------------


def leases_stop_flagged(*, buyer_ids: Collection[int] | None = None, now: datetime | None = None) -> int:
    """Ask operators to stop every running lease that rating's figures call for, whatever the reason; return
    how many. Two reasons: the buyer's packs ran dry (leases_stop_exhausted), and posted spend reached a
    budget's hard cap (leases_stop_over_cap, which evaluates the buyers' budgets first). The one stop step of
    enforcement, run right after each rating on arrival (broker.services.enforcement) and every 10 s as the
    safety net (broker.tasks.leases_stop_exhausted). Idempotent; ``buyer_ids`` limits it to those buyers.
    """
    exhausted = leases_stop_exhausted(buyer_ids=buyer_ids, now=now)
    over_cap = leases_stop_over_cap(buyer_ids=set(buyer_ids) if buyer_ids is not None else None, now=now)
    return exhausted + over_cap


# --- Operator endpoint and lease events -------------------------------------------------------------


@transaction.atomic
def operator_endpoint_secret_rotate(*, operator: Organisation, actor: Actor) -> OperatorEndpoint:
    """Give the operator a new signing secret for lease events and enable delivery to its clusters'
    endpoints. The old secret stops working at once. Returns the endpoint; its ``secret`` is shown once."""
    secret = f"chw_{secrets.token_urlsafe(32)}"
    endpoint, _ = OperatorEndpoint.objects.update_or_create(
        operator=operator, defaults={"secret": secret, "enabled": True}
    )
    logger.info("lease event secret rotated for %s by %s", operator.slug, actor.label)
    return endpoint


@transaction.atomic
def operator_endpoint_disable(*, operator: Organisation, actor: Actor) -> None:
    """Stop POSTing lease events to the operator (pulling still works) and forget the secret. Events not
    yet delivered are given up when their turn comes."""
    OperatorEndpoint.objects.filter(operator=operator).update(enabled=False, secret="")
    logger.info("lease events disabled for %s by %s", operator.slug, actor.label)


def lease_event_delivery_create(*, transition: LeaseTransition, lease: Lease) -> None:
    """Queue ``transition`` for POSTing when the operator has enabled lease events and the lease's cluster
    has an endpoint. Runs inside the transaction that records the transition."""
    if not OperatorEndpoint.objects.filter(operator_id=lease.operator_id, enabled=True).exists():
        return
    url = Cluster.objects.filter(pk=lease.cluster_id).values_list("endpoint_url", flat=True).first()
    if not url:
        return
    LeaseEventDelivery.objects.create(transition=transition, url=url, next_attempt_at=timezone.now())


def lease_event_signature(*, secret: str, timestamp: str, body: bytes) -> str:
    """``X-Cardhour-Signature``: ``sha256=`` + hex HMAC-SHA256 of ``<timestamp>.<body>`` under the
    operator's secret. Receivers recompute it and reject a timestamp far from their clock (replays)."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def lease_event_backoff(*, attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed attempt: 5 s, 10 s, 20 s, … capped at an hour."""
    return timedelta(
        seconds=min(EVENT_BACKOFF_BASE_SECONDS * 2 ** max(attempts - 1, 0), EVENT_BACKOFF_MAX_SECONDS)
    )


@dataclass(frozen=True)
class _Claimed:
    delivery_id: int
    url: str
    body: bytes
    event: str
    event_id: int
    secret: str
    attempts: int


@transaction.atomic
def _deliveries_claim(*, now: datetime, limit: int) -> list[_Claimed]:
    """Lock due pending deliveries (skipping rows another worker holds), build their payloads, and push
    their next_attempt_at past this run, so that once this transaction commits no other worker takes them."""
    deliveries = list(
        LeaseEventDelivery.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("transition")
        .filter(status=LeaseEventDelivery.Status.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "pk")[:limit]
    )
    if not deliveries:
        return []
    lease_ids = {d.transition.lease_id for d in deliveries}
    documents = {lease.pk: lease for lease in _leases_with_details().filter(pk__in=lease_ids)}
    endpoints = {
        e.operator_id: e
        for e in OperatorEndpoint.objects.filter(
            operator_id__in={d.transition.operator_id for d in deliveries}
        )
    }
    claimed: list[_Claimed] = []
    dropped: list[int] = []
    for delivery in deliveries:
        transition = delivery.transition
        endpoint = endpoints.get(transition.operator_id)
        if endpoint is None or not endpoint.enabled or not endpoint.secret:
            dropped.append(delivery.pk)
            continue
        payload = {
            "id": transition.pk,
            "type": f"lease.{transition.to_state}",
            "lease": lease_document(lease=documents[transition.lease_id]),
            "from_state": transition.from_state or None,
            "to_state": transition.to_state,
            "at": iso_datetime(transition.at),
            "reason": transition.reason,
        }
        claimed.append(
            _Claimed(
                delivery_id=delivery.pk,
                url=delivery.url,
                body=json.dumps(payload, separators=(",", ":"), sort_keys=True).encode(),
                event=f"lease.{transition.to_state}",
                event_id=transition.pk,
                secret=endpoint.secret,
                attempts=delivery.attempts,
            )
        )
    if dropped:
        LeaseEventDelivery.objects.filter(pk__in=dropped).update(
            status=LeaseEventDelivery.Status.GAVE_UP, last_error="lease events are disabled for this operator"
        )
    LeaseEventDelivery.objects.filter(pk__in=[c.delivery_id for c in claimed]).update(
        next_attempt_at=now + timedelta(seconds=EVENT_CLAIM_SECONDS)
    )
    return claimed


def _post(claimed: _Claimed) -> str:
    """POST one event; return "" on a 2xx, else what went wrong."""
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Cardhour-LeaseEvents/1",
        "X-Cardhour-Event": claimed.event,
        "X-Cardhour-Delivery": str(claimed.event_id),
        "X-Cardhour-Timestamp": timestamp,
        "X-Cardhour-Signature": lease_event_signature(
            secret=claimed.secret, timestamp=timestamp, body=claimed.body
        ),
    }
    try:
        # Resolved and checked now, connected to the checked address, no redirects (core.net).
        status = post_pinned(claimed.url, body=claimed.body, headers=headers, timeout=EVENT_TIMEOUT_SECONDS)
    except UnsafeEndpointError as exc:
        return f"refused: {exc.message}"[:500]
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"[:500]
    return "" if 200 <= status < 300 else f"HTTP {status}"


def _delivery_record(*, claimed: _Claimed, error: str, now: datetime) -> bool:
    """Record one attempt's result (a single UPDATE: no transaction spans the POST)."""
    pending = LeaseEventDelivery.objects.filter(
        pk=claimed.delivery_id, status=LeaseEventDelivery.Status.PENDING
    )
    attempts = claimed.attempts + 1
    if not error:
        pending.update(
            status=LeaseEventDelivery.Status.DELIVERED,
            attempts=attempts,
            delivered_at=timezone.now(),
            last_error="",
        )
        return True
    if attempts >= EVENT_MAX_ATTEMPTS:
        pending.update(status=LeaseEventDelivery.Status.GAVE_UP, attempts=attempts, last_error=error[:500])
    else:
        pending.update(
            attempts=attempts,
            next_attempt_at=now + lease_event_backoff(attempts=attempts),
            last_error=error[:500],
        )
    return False


def lease_events_deliver_due(*, now: datetime | None = None, limit: int = 100) -> int:
    """POST due lease events to their clusters' endpoints, signed with the operator's secret; return how
    many were delivered.

    A 2xx answer delivers an event. Anything else (an error status, a redirect, a timeout after 5 s, a
    refused connection) is retried after 5 s, 10 s, 20 s, … (at most an hour apart); after 12 failed
    attempts the event is given up (``gave_up``, with ``last_error``). Events of an operator that disabled
    its endpoint are given up. Safe to run concurrently: each run claims its own rows. Events of one lease
    may arrive out of order after a retry: the payload's ``id`` (the transition id) orders them.
    """
    now = now or timezone.now()
    claimed = _deliveries_claim(now=now, limit=limit)
    started = time.monotonic()
    delivered = 0
    for position, item in enumerate(claimed):
        if time.monotonic() - started > EVENT_RUN_BUDGET_SECONDS:
            # Hand the rest back at once rather than after the claim runs out.
            rest = [c.delivery_id for c in claimed[position:]]
            LeaseEventDelivery.objects.filter(pk__in=rest, status=LeaseEventDelivery.Status.PENDING).update(
                next_attempt_at=now
            )
            break
        if _delivery_record(claimed=item, error=_post(item), now=now):
            delivered += 1
    return delivered


# --- Staff controls (the admin) -------------------------------------------------------------------


@transaction.atomic
def operator_endpoint_enabled_set(
    *, endpoint: OperatorEndpoint, enabled: bool, actor: Actor
) -> OperatorEndpoint:
    """Staff pause (``enabled=False``) or resume POSTing lease events to an operator; pulling the lease feed
    always works. Unlike the operator's own disable, pausing keeps the signing secret, so resuming needs
    nothing from the operator. Events that fall due while paused are given up (see dispatch).

    Raises ConflictError ``endpoint_secret_missing`` when resuming an endpoint that has no secret (the
    operator disabled lease events itself and turns them back on by rotating its secret).
    """
    locked = OperatorEndpoint.objects.select_for_update().select_related("operator").get(pk=endpoint.pk)
    if enabled and not locked.secret:
        raise ConflictError(
            _(
                "%(operator)s has no signing secret: it turns lease events back on by rotating its secret "
                "through the API."
            )
            % {"operator": locked.operator.slug},
            code="endpoint_secret_missing",
            extra={"operator": locked.operator.slug},
        )
    if locked.enabled != enabled:
        locked.enabled = enabled
        locked.save(update_fields=["enabled"])
        logger.info(
            "lease events %s for %s by %s",
            "resumed" if enabled else "paused",
            locked.operator.slug,
            actor.label,
        )
    return locked


@transaction.atomic
def lease_event_deliveries_retry(
    *, delivery_ids: Iterable[int], actor: Actor, now: datetime | None = None
) -> int:
    """Make undelivered lease events due now; returns how many. A pending event keeps its attempts; a given
    up one goes back to pending with its attempts reset, so it gets the whole backoff series again (its last
    error stays until the next attempt replaces it). Delivered events are left alone.

    Delivery stays at least once: an event a worker is POSTing at this moment may be POSTed again by the
    next run; receivers deduplicate on ``X-Cardhour-Delivery`` (the transition id).
    """
    now = now or timezone.now()
    rows = LeaseEventDelivery.objects.filter(pk__in=list(delivery_ids))
    pending = rows.filter(status=LeaseEventDelivery.Status.PENDING).update(next_attempt_at=now)
    revived = rows.filter(status=LeaseEventDelivery.Status.GAVE_UP).update(
        status=LeaseEventDelivery.Status.PENDING, attempts=0, next_attempt_at=now
    )
    logger.info("lease events retried by %s: %s pending, %s given up", actor.label, pending, revived)
    return pending + revived


# --- Budget caps (broker.budgets) -------------------------------------------------------------------
# Kept in one block: the budget evaluation raises the breach flags, this stops the leases they cover.

BUDGET_CAP_REASON = "budget cap reached"


def leases_stop_over_cap(*, buyer_ids: set[int] | None = None, now: datetime | None = None) -> int:
    """Evaluate the buyers' budgets on their posted spend (alerts once per threshold, a breach flag when a
    hard cap is reached; ``buyer_ids`` None = every buyer with an enabled budget) and ask operators to stop
    the running leases in the scope of each open breach of the current period; return how many.

    Like leases_stop_exhausted: leases are stopped a chunk to a transaction (skipping those another holds)
    within the run's time budget; each moves to stop_requested (the operator
    pulls the change or receives the event) and the buyer gets a ``budget_cap_reached`` notice naming the
    lease; a lease already asked to stop is not touched again, so running it twice is safe. A breach is
    cleared when the cap is raised above the spend, the budget disabled or deleted, or the month ends.
    """
    from broker.budgets.models import JOB_PERIOD, BudgetBreach
    from broker.budgets.selectors import month_key
    from broker.budgets.services import budgets_evaluate

    now = now or timezone.now()
    started = time.monotonic()
    budgets_evaluate(buyer_ids=buyer_ids, now=now)
    breaches = BudgetBreach.objects.filter(
        cleared_at__isnull=True, period_key__in=(month_key(at=now), JOB_PERIOD), budget__enabled=True
    ).select_related("budget")
    if buyer_ids is not None:
        breaches = breaches.filter(budget__buyer_id__in=buyer_ids)
    stopped = chunks = 0
    for breach in breaches.order_by("pk"):
        lease_ids = _running_in_budget_scope(budget=breach.budget)
        for position in range(0, len(lease_ids), STOP_CHUNK):
            # The first chunk always goes, so a run whose evaluation alone took the budget still stops some.
            if chunks and time.monotonic() - started > STOP_RUN_BUDGET_SECONDS:
                logger.warning(
                    "stop run over its %.0f s budget: capped buyers' leases left to the next run",
                    STOP_RUN_BUDGET_SECONDS,
                )
                return stopped
            stopped += _leases_stop_for_cap(
                lease_ids=lease_ids[position : position + STOP_CHUNK], breach_id=breach.pk, now=now
            )
            chunks += 1
    return stopped


def _running_in_budget_scope(*, budget: Any) -> list[int]:
    from broker.budgets.models import BudgetScope

    running = Lease.objects.filter(buyer_id=budget.buyer_id, state=LeaseState.RUNNING)
    if budget.scope == BudgetScope.MEMBER:
        running = running.filter(origin__user_id=budget.user_id)
    elif budget.scope == BudgetScope.TOKEN:
        running = running.filter(origin__token_id=budget.token_id)
    elif budget.scope == BudgetScope.JOB:
        running = running.filter(job_id=budget.job_id)
    return list(running.order_by("pk").values_list("pk", flat=True))


@transaction.atomic
def _leases_stop_for_cap(*, lease_ids: Sequence[int], breach_id: int, now: datetime) -> int:
    from broker.budgets.models import BudgetBreach
    from broker.budgets.services import NOTICE_CAP

    locked = _running_locked(lease_ids=lease_ids)
    if not locked:
        return 0
    breach = (
        BudgetBreach.objects.filter(pk=breach_id, cleared_at__isnull=True).select_related("budget").first()
    )
    if breach is None:  # the cap was raised since the leases were selected
        return 0
    budget = breach.budget
    for lease in locked:
        _lease_stop_with_notice(
            lease=lease,
            actor="broker: budget cap reached",
            reason=f"{BUDGET_CAP_REASON}: budget {budget.pk} ({budget.scope}) at {breach.spent} of {breach.cap} CNY",
            kind=NOTICE_CAP,
            message=(
                f"Budget “{budget.name}” reached its hard cap of {breach.cap} CNY ({breach.spent} CNY spent), so "
                f"lease {lease.pk} on {lease.cluster.cpi} was asked to stop. Raise the cap to run it again."
            ),
            now=now,
        )
    return len(locked)
