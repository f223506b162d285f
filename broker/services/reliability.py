"""Reliability scores: per cluster, how much of the card-time sold on it was delivered, over a rolling window.

Computed from the platform's own lease records by an hourly beat (``broker.reliability_refresh``), from
scratch each time, and stored one row per listed cluster (ClusterReliability) with its inputs. The matcher
reads the stored scores into its catalogue at each reload (broker.catalog), never per quote.

For each lease of the cluster overlapping the window ``W = [now − CARDHOUR_RELIABILITY_WINDOW_DAYS, now)``,
in card-seconds (the lease's cards × seconds, clipped to W):

- **Sold** is the lease's window ``[start_at, due_end)``, where ``due_end`` is its ``end_at``, cut short by a
  stop request (``stop_requested_at``: the buyer cancelled a running job, or its packs or caps ran out) and,
  for a lease that ended *completed* or *cancelled*, by its end (the work finished, or the buyer cancelled).
  An *interrupted* or *failed* lease stays sold to its ``end_at``: the time after the failure was sold on
  this cluster and not delivered by it (a replacement elsewhere counts for the other cluster).
- **Delivered** is the time the lease was running, inside its sold window: from the operator's start
  report (``started_at``; for a lease never reported started but with usage reported, its ``start_at``) to
  the operator's stop report (``ended_at`` of a completed or failed lease), or — for an interrupted lease —
  to the end of the last usage reported before the interruption (failover sets ``ended_at`` to exactly that
  billing cut-off, broker.services.failover), or to now while it runs. So a late start, a failure and the
  unreported time before an interruption are all undelivered; usage reported is used only through that
  cut-off (summing every usage record over 30 days would read billions of rows at design load).
- **Interruptions** are the leases that ended *interrupted* (failover: the cluster went offline or was
  retired) or *failed* (the operator reported a failure) inside W, counted at the moment they ended. The
  rate is per 1,000 card-hours sold in W (null when nothing was sold).

The score is ``(delivered + P·R) / (sold + P)`` in percent, rounded down to 0.001 % (so a minimum is
never met by rounding up, and no score is shown above what was measured), where ``P`` is
``CARDHOUR_RELIABILITY_PRIOR_CARD_HOURS`` × 3600 card-seconds and ``R`` is
``CARDHOUR_RELIABILITY_PRIOR_PERCENT`` / 100: a Bayesian prior (a Beta prior on the delivered fraction,
posterior mean), a platform choice and not an official figure. A cluster that sold nothing in W scores R.

Nothing here decides who was at fault for lost time (scheduled maintenance, a buyer's cancellation): the
SLA credit attribution does that per lease; this score is a plain statistic of delivery.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

import numpy as np
from django.conf import settings
from django.db import connections, router, transaction
from django.utils import timezone

from broker.models import ClusterReliability, Lease, LeaseState
from federation.models import Cluster, ClusterStatus

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PERCENT = Decimal("0.001")
_NONE = -1  # a missing time in the epoch arrays

# Codes of the lease states in the arrays.
_STATES = tuple(LeaseState.values)
_CODE = {state: i for i, state in enumerate(_STATES)}
_ENDS_DUE = (LeaseState.COMPLETED, LeaseState.CANCELLED)  # their end is where the sold time ends
_INTERRUPTIONS = (LeaseState.INTERRUPTED, LeaseState.FAILED)
_FINAL = (LeaseState.COMPLETED, LeaseState.CANCELLED, LeaseState.INTERRUPTED, LeaseState.FAILED)


def _epoch(value: datetime | None) -> int:
    return _NONE if value is None else int((value - _EPOCH).total_seconds())


@dataclass(frozen=True)
class LeaseTimes:
    """The leases overlapping a window, one array per column, times in epoch seconds (``-1``: none)."""

    cluster: np.ndarray
    cards: np.ndarray
    state: np.ndarray  # index into _STATES
    start: np.ndarray
    end: np.ndarray
    started: np.ndarray
    ended: np.ndarray
    stop_requested: np.ndarray
    state_changed: np.ndarray
    last_usage_end: np.ndarray


_COLUMNS = (
    "cluster_id",
    "cards",
    "state",
    "start_at",
    "end_at",
    "started_at",
    "ended_at",
    "stop_requested_at",
    "state_changed_at",
    "last_usage_end_at",
)


def _lease_times(*, since: datetime, now: datetime) -> LeaseTimes:
    """Every lease whose window ``[start_at, end_at)`` overlaps ``[since, now)``. On PostgreSQL the
    database converts the times to epoch seconds (no datetime per value: a month of leases at design load
    is millions of rows); elsewhere through the ORM."""
    alias = router.db_for_read(Lease)
    connection = connections[alias]
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(Lease._meta.db_table)
        times = ", ".join(
            f"coalesce(floor(extract(epoch FROM {column}))::bigint, {_NONE})" for column in _COLUMNS[3:]
        )
        # The table and column names come from the model and this module; the values are bound parameters.
        sql = f"SELECT cluster_id, cards, state, {times} FROM {table} WHERE start_at < %s AND end_at > %s"  # noqa: S608
        with connection.cursor() as cursor:
            cursor.execute(sql, [now, since])
            rows = [
                (cluster, cards, _CODE[state], *rest) for cluster, cards, state, *rest in cursor.fetchall()
            ]
    else:
        rows = [
            (cluster, cards, _CODE[state], *(_epoch(value) for value in rest))
            for cluster, cards, state, *rest in Lease.objects.filter(start_at__lt=now, end_at__gt=since)
            .order_by()
            .values_list(*_COLUMNS)
        ]
    table_ = np.array(rows, dtype=np.int64).reshape(-1, len(_COLUMNS))
    return LeaseTimes(*(table_[:, i] for i in range(len(_COLUMNS))))


@dataclass(frozen=True)
class ReliabilityInputs:
    """Per cluster id: card-seconds sold and delivered in the window, and interruptions."""

    sold: dict[int, int]
    delivered: dict[int, int]
    interruptions: dict[int, int]


def reliability_inputs(leases: LeaseTimes, *, since: int, now: int) -> ReliabilityInputs:
    """Sold and delivered card-seconds and interruptions per cluster (see the module docstring), with
    array arithmetic over every lease at once."""
    if not len(leases.cluster):
        return ReliabilityInputs({}, {}, {})
    state = leases.state
    ends_due = np.isin(state, [_CODE[s] for s in _ENDS_DUE])
    final = np.isin(state, [_CODE[s] for s in _FINAL])
    big = np.iinfo(np.int64).max

    def known(values: np.ndarray) -> np.ndarray:
        return np.where(values == _NONE, big, values)

    due_end = np.minimum(leases.end, known(leases.stop_requested))
    due_end = np.where(ends_due, np.minimum(due_end, known(leases.ended)), due_end)
    due_end = np.minimum(due_end, now)
    sold_from = np.maximum(leases.start, since)
    sold = leases.cards * np.maximum(due_end - sold_from, 0)

    run_from = np.where(
        leases.started != _NONE,
        leases.started,
        np.where(leases.last_usage_end != _NONE, leases.start, big),
    )
    run_to = np.where(final, np.where(leases.ended == _NONE, run_from, leases.ended), now)
    delivered_from = np.maximum(run_from, sold_from)
    delivered = leases.cards * np.maximum(np.minimum(run_to, due_end) - delivered_from, 0)

    interrupted = (
        np.isin(state, [_CODE[s] for s in _INTERRUPTIONS])
        & (leases.state_changed >= since)
        & (leases.state_changed < now)
    )
    clusters, of_lease = np.unique(leases.cluster, return_inverse=True)
    sold_sum = np.bincount(of_lease, weights=sold, minlength=len(clusters))
    delivered_sum = np.bincount(of_lease, weights=delivered, minlength=len(clusters))
    interruption_sum = np.bincount(of_lease, weights=interrupted, minlength=len(clusters))
    ids = clusters.tolist()
    # Sums of integers below 2⁵³ are exact in float64 (a month of 100,000 cards is 2.6·10¹¹ card-seconds).
    return ReliabilityInputs(
        sold={c: int(v) for c, v in zip(ids, sold_sum.round().tolist(), strict=True)},
        delivered={c: int(v) for c, v in zip(ids, delivered_sum.round().tolist(), strict=True)},
        interruptions={c: int(v) for c, v in zip(ids, interruption_sum.round().tolist(), strict=True)},
    )


@dataclass(frozen=True)
class Prior:
    """The platform's prior: as if every cluster had also sold ``card_hours`` and delivered ``percent``."""

    card_hours: Decimal
    percent: Decimal

    @classmethod
    def from_settings(cls) -> Prior:
        return cls(
            card_hours=Decimal(settings.CARDHOUR_RELIABILITY_PRIOR_CARD_HOURS),
            percent=Decimal(settings.CARDHOUR_RELIABILITY_PRIOR_PERCENT),
        )


def reliability_percent(*, sold_card_seconds: int, delivered_card_seconds: int, prior: Prior) -> Decimal:
    """The posterior mean of the delivered fraction, in percent, rounded down to 0.001 %."""
    prior_seconds = prior.card_hours * 3600
    denominator = sold_card_seconds + prior_seconds
    if denominator <= 0:
        return prior.percent.quantize(_PERCENT, ROUND_FLOOR)
    value = (delivered_card_seconds * 100 + prior_seconds * prior.percent) / denominator
    return value.quantize(_PERCENT, ROUND_FLOOR)


def interruptions_per_1000_card_hours(*, interruptions: int, sold_card_seconds: int) -> Decimal | None:
    if sold_card_seconds <= 0:
        return None
    return (Decimal(interruptions) * 1000 * 3600 / sold_card_seconds).quantize(_PERCENT, ROUND_HALF_EVEN)


@transaction.atomic
def cluster_reliability_refresh(*, now: datetime | None = None) -> int:
    """Recompute every listed (not retired) cluster's reliability score over the window ending ``now``
    and store it (one row per cluster, replaced in place); returns how many rows were written.

    Idempotent: a second run at the same ``now`` writes the same rows. A retired cluster keeps its last
    row (it is never quoted). Reads the leases overlapping the window once (see the module docstring)."""
    now = (now or timezone.now()).replace(microsecond=0)
    since = now - timedelta(days=settings.CARDHOUR_RELIABILITY_WINDOW_DAYS)
    prior = Prior.from_settings()
    inputs = reliability_inputs(_lease_times(since=since, now=now), since=_epoch(since), now=_epoch(now))
    cluster_ids = list(
        Cluster.objects.exclude(status=ClusterStatus.RETIRED).order_by("pk").values_list("pk", flat=True)
    )
    rows = []
    for cluster_id in cluster_ids:
        sold = inputs.sold.get(cluster_id, 0)
        delivered = inputs.delivered.get(cluster_id, 0)
        interruptions = inputs.interruptions.get(cluster_id, 0)
        rows.append(
            ClusterReliability(
                cluster_id=cluster_id,
                window_start_at=since,
                computed_at=now,
                sold_card_seconds=sold,
                delivered_card_seconds=delivered,
                interruptions=interruptions,
                card_hours=(Decimal(sold) / 3600).quantize(Decimal("0.000001"), ROUND_HALF_EVEN),
                prior_card_hours=prior.card_hours,
                prior_percent=prior.percent,
                reliability_percent=reliability_percent(
                    sold_card_seconds=sold, delivered_card_seconds=delivered, prior=prior
                ),
                interruptions_per_1000_card_hours=interruptions_per_1000_card_hours(
                    interruptions=interruptions, sold_card_seconds=sold
                ),
            )
        )
    ClusterReliability.objects.bulk_create(
        rows,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["cluster"],
        update_fields=[
            "window_start_at",
            "computed_at",
            "sold_card_seconds",
            "delivered_card_seconds",
            "interruptions",
            "card_hours",
            "prior_card_hours",
            "prior_percent",
            "reliability_percent",
            "interruptions_per_1000_card_hours",
        ],
    )
    return len(rows)
