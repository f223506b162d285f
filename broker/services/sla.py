"""SLA attribution: how much of an ended lease's window its operator lost, from the platform's own records.

A lease is assessed once (one SlaAssessment per lease, unique), CARDHOUR_SLA_ASSESS_DELAY_MINUTES after it
ended and once its usage is rated, by a beat every 10 minutes — so a credit note follows within the hour.
Only leases whose locked price card states a service level are assessed.

The window is the lease's ``[start_at, end_at)``. From it:

- **lost** (the operator's): the time after the lease's billing cut-off — the end of the last usage reported
  (``ended_at`` of an interrupted lease, broker.services.failover) — until its replacing lease started (or
  the window's end when nothing replaced it, or the replacement never started); plus the time the cluster
  was offline or retired by its status history while the lease held it (a short outage failover did not
  catch). Usage is the record of delivery; heartbeats show in the status history (missed beats → offline).
- **excluded, the buyer's side**: everything from the first moment the buyer stopped the lease — a
  cancellation, a stop request (the buyer's, a cancelled job's, or the packs running dry) — and, for a lease
  that completed or failed on its own (the workload ended; the issue attributes only interruptions and
  offline time), everything after it ended;
- **excluded, maintenance**: windows the operator announced for the cluster at least
  CARDHOUR_SLA_MAINTENANCE_NOTICE_HOURS before they started *and* before the lease was accepted
  (federation.selectors.cluster_maintenance_announced_ahead).

``availability = (window − excluded − lost) ÷ (window − excluded)``, in percent, truncated to three decimals
(a threshold has at most three, so truncating never moves an availability across one); 100 % when nothing
of the window counts. The money is metering's: metering.services.sla.sla_credit_issue, given plain values.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from broker.models import FINAL_STATES, Lease, LeaseState, LeaseTransition, SlaAssessment
from federation.selectors import cluster_down_intervals, cluster_maintenance_announced_ahead
from metering.services import sla as metering_sla
from metering.sla import sla_credit_fraction

logger = logging.getLogger("cardhour.broker.sla")

Interval = tuple[datetime, datetime]
BUYER_STOP_STATES = (LeaseState.STOP_REQUESTED, LeaseState.CANCELLED)


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _subtract(intervals: Iterable[Interval], minus: Iterable[Interval]) -> list[Interval]:
    result = _union(intervals)
    for cut_start, cut_end in _union(minus):
        pieces: list[Interval] = []
        for start, end in result:
            if cut_end <= start or cut_start >= end:
                pieces.append((start, end))
                continue
            if start < cut_start:
                pieces.append((start, cut_start))
            if cut_end < end:
                pieces.append((cut_end, end))
        result = pieces
    return result


def _clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    start, end = window
    return _union((max(a, start), min(b, end)) for a, b in intervals)


def _seconds(intervals: Iterable[Interval]) -> int:
    return sum(int((end - start).total_seconds()) for start, end in _union(intervals))


@dataclass(frozen=True)
class Attribution:
    window: Interval
    lost: list[Interval]
    excluded_buyer: list[Interval]
    excluded_maintenance: list[Interval]

    @property
    def window_seconds(self) -> int:
        return int((self.window[1] - self.window[0]).total_seconds())

    @property
    def lost_seconds(self) -> int:
        return _seconds(self.lost)

    @property
    def excluded_buyer_seconds(self) -> int:
        return _seconds(self.excluded_buyer)

    @property
    def excluded_maintenance_seconds(self) -> int:
        return _seconds(self.excluded_maintenance)

    @property
    def availability_percent(self) -> Decimal:
        counted = self.window_seconds - self.excluded_buyer_seconds - self.excluded_maintenance_seconds
        if counted <= 0:
            return Decimal("100.000")
        delivered = counted - self.lost_seconds
        return (Decimal(delivered * 100_000 // counted) / 1000).quantize(Decimal("0.001"))

    def as_json(self) -> dict[str, list[list[str]]]:
        def iso(intervals: list[Interval]) -> list[list[str]]:
            return [[a.isoformat(), b.isoformat()] for a, b in intervals]

        return {
            "lost": iso(self.lost),
            "excluded_buyer": iso(self.excluded_buyer),
            "excluded_maintenance": iso(self.excluded_maintenance),
        }


def _replacement_started_at(lease: Lease) -> tuple[bool, datetime | None]:
    """(known, when the replacing lease started): known is False while a replacement waits to start."""
    replacement = Lease.objects.filter(replaces=lease).first()
    if replacement is None:
        return True, None
    if replacement.started_at is not None:
        return True, replacement.started_at
    if replacement.state in FINAL_STATES:
        return True, None  # it never ran: nothing replaced the lost time
    return False, None


def lease_sla_attribute(*, lease: Lease) -> Attribution | None:
    """Attribute an ended lease's window (see the module docstring). None while the answer is not known
    yet: the replacing lease has not started."""
    window = (lease.start_at, lease.end_at)
    ended_at = lease.ended_at or lease.state_changed_at
    buyer_stop = (
        LeaseTransition.objects.filter(lease=lease, to_state__in=BUYER_STOP_STATES)
        .order_by("at", "pk")
        .values_list("at", flat=True)
        .first()
    )
    excluded_buyer: list[Interval] = []
    if buyer_stop is not None:
        excluded_buyer.append((buyer_stop, window[1]))

    lost: list[Interval] = []
    if lease.state == LeaseState.INTERRUPTED:
        known, replaced_at = _replacement_started_at(lease)
        if not known:
            return None
        cut_off = max(ended_at, window[0])
        lost.append((cut_off, replaced_at or window[1]))
        held_until = cut_off
    else:
        # Completed, failed or cancelled: it ended on its own (or the buyer's) terms; the rest of the window
        # is not owed.
        excluded_buyer.append((ended_at, window[1]))
        held_until = ended_at
    if held_until > window[0]:
        lost.extend(
            cluster_down_intervals(
                cluster_id=lease.cluster_id, start_at=window[0], end_at=min(held_until, window[1])
            )
        )

    excluded_buyer = _clip(excluded_buyer, window)
    maintenance = _clip(
        cluster_maintenance_announced_ahead(
            cluster_id=lease.cluster_id, start_at=window[0], end_at=window[1], announced_by=lease.created_at
        ),
        window,
    )
    # Time is counted once: the buyer's side first, then maintenance, then what is left of the lost time.
    maintenance = _subtract(maintenance, excluded_buyer)
    lost = _subtract(_clip(lost, window), [*excluded_buyer, *maintenance])
    return Attribution(
        window=window, lost=lost, excluded_buyer=excluded_buyer, excluded_maintenance=maintenance
    )


def leases_sla_due(*, now: datetime, limit: int = 500) -> list[int]:
    """Ids of ended leases with a service level on their card, ended at least the assessment delay ago,
    not yet assessed, oldest first."""
    ended_before = now - timedelta(minutes=settings.CARDHOUR_SLA_ASSESS_DELAY_MINUTES)
    return list(
        Lease.objects.filter(
            state__in=FINAL_STATES,
            ended_at__lte=ended_before,
            price_card__sla_availability_percent__isnull=False,
        )
        .exclude(Exists(SlaAssessment.objects.filter(lease_id=OuterRef("pk"))))
        .order_by("ended_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )


@transaction.atomic
def lease_sla_assess(*, lease_id: int, now: datetime | None = None) -> SlaAssessment | None:
    """Assess one ended lease, once: attribute its window, ask metering for the credit note its
    availability earns, and record the assessment. Returns the (new or earlier) assessment, or None when
    it cannot be decided yet (usage still unrated, replacement not started) — a later run takes it.

    Locks the lease row, so two workers assess it one after the other; the second finds the row.
    """
    now = now or timezone.now()
    lease = Lease.objects.select_for_update(of=("self",)).select_related("price_card").get(pk=lease_id)
    existing = SlaAssessment.objects.filter(lease=lease).first()
    if existing is not None:
        return existing
    if lease.state not in FINAL_STATES or lease.price_card.sla_availability_percent is None:
        return None
    if metering_sla.sla_lease_usage_pending(reference=lease.reference):
        return None
    attribution = lease_sla_attribute(lease=lease)
    if attribution is None:
        return None
    availability = attribution.availability_percent
    credit = None
    if not lease.price_card.sla_credit_schedule:
        outcome = SlaAssessment.Outcome.NO_SCHEDULE
    else:
        credit = metering_sla.sla_credit_issue(
            lease_id=lease.pk,
            reference=lease.reference,
            buyer_id=lease.buyer_id,
            operator_id=lease.operator_id,
            cluster_id=lease.cluster_id,
            price_card_id=lease.price_card_id,
            window_start_at=attribution.window[0],
            window_end_at=attribution.window[1],
            window_seconds=attribution.window_seconds,
            lost_seconds=attribution.lost_seconds,
            excluded_buyer_seconds=attribution.excluded_buyer_seconds,
            excluded_maintenance_seconds=attribution.excluded_maintenance_seconds,
            availability_percent=availability,
            intervals=attribution.as_json(),
            now=now,
        )
        if credit is not None:
            outcome = SlaAssessment.Outcome.CREDITED
        elif (
            sla_credit_fraction(schedule=lease.price_card.sla_credit_schedule, availability=availability) > 0
        ):
            outcome = SlaAssessment.Outcome.NO_CHARGE
        else:
            outcome = SlaAssessment.Outcome.WITHIN_LEVEL
    try:
        with transaction.atomic():
            return SlaAssessment.objects.create(
                lease=lease,
                assessed_at=now,
                window_seconds=attribution.window_seconds,
                lost_seconds=attribution.lost_seconds,
                excluded_buyer_seconds=attribution.excluded_buyer_seconds,
                excluded_maintenance_seconds=attribution.excluded_maintenance_seconds,
                availability_percent=availability,
                outcome=outcome,
                credit=credit,
                intervals=attribution.as_json(),
            )
    except IntegrityError:
        return SlaAssessment.objects.get(lease=lease)


def leases_sla_assess_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Assess every due lease, each in its own transaction; returns how many were assessed."""
    now = now or timezone.now()
    done = 0
    for lease_id in leases_sla_due(now=now, limit=limit):
        try:
            if lease_sla_assess(lease_id=lease_id, now=now) is not None:
                done += 1
        except Exception:
            # One lease that cannot be assessed (say, a pack refunded meanwhile) must not hold up the rest;
            # it stays unassessed and is retried next run.
            logger.exception("SLA assessment of lease %s failed", lease_id)
    return done
