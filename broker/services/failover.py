"""Failover: the leases of a cluster that went offline (missed heartbeats, or set offline by its operator or
staff) or was retired are interrupted, and re-placed elsewhere when the job allows it.

What happens to a live lease of a down cluster:

- **running** (or reserved but already reporting usage), **checkpointable job**: interrupted; the time not yet
  reported is re-quoted with the job's own constraints (chips, fabrics, gang, latency budget from its origin
  hub, price cap, preference) on any *other* cluster, from now, and the best placement that can still be
  held and paid for becomes a new lease that ``replaces`` the old one. The buyer is told (``lease_replaced``).
- **reserved, never started** (no start report, no usage): interrupted and re-placed for its full duration,
  whatever the job, because nothing ran and nothing is lost by running it elsewhere.
- **running, job not checkpointable**: interrupted; the job fails and the buyer is told (``lease_failed``).
- **stop_requested**: interrupted, never re-placed (the buyer cancelled it, or its packs ran dry); the job
  fails with a reason saying so.
- When nothing can take the remaining time (no feasible placement, every one taken meanwhile, or the buyer's
  packs cannot pay), the job fails and the buyer is told (``lease_failed``). When the usage reported
  already covers the whole duration, the job is complete (``lease_interrupted``).

Billing cut-off: **an interrupted lease's ``ended_at`` is where billing stops.** It is the end of the last
usage reported against the lease (``last_usage_end_at``, left unchanged, so the two are equal), or — when
nothing was reported — the lease's start (or the interruption, if the start is later), so that no usage
fits at all. The broker's usage API refuses usage ending after ``ended_at`` (``after_lease_ended``) and
answers replays of what was already stored as duplicates. The moment of the interruption itself is on the
``interrupted`` LeaseTransition and in ``state_changed_at``.

Concurrency: every lease is handled in its own transaction, so one lease that cannot be handled does not hold
up the others, and a crash loses at most the lease in hand (it is still live, and the next run takes it).
Locks: the buyer's organisation row, then the lease row (then, through lease_transition and lease_create,
the job row and the islands in id order). A usage batch locks the lease row too, so the cut-off read here is
never overtaken by a report committed later. Two workers running at once spread over different leases (the
first pass skips locked rows) and re-check each lease's state after locking it, so a lease is interrupted
and re-placed exactly once; ``Lease.replaces`` is also one-to-one in the database.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import OperationalError, transaction
from django.utils import timezone

from broker.errors import CapacityTakenError, ClusterUnavailableError
from broker.models import Job, Lease, LeaseState
from broker.services import jobs, leases, quotes
from core.errors import DomainError
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster, ClusterStatus
from metering.errors import InsufficientBalanceError

logger = logging.getLogger("cardhour.broker.failover")

FAILOVER = Actor.system("failover")

# Leases failover takes over, and the cluster statuses that make it do so. A draining cluster keeps running
# what it has; only new placements avoid it.
LIVE_STATES = (LeaseState.RESERVED, LeaseState.RUNNING, LeaseState.STOP_REQUESTED)
DOWN_STATUSES = (ClusterStatus.OFFLINE, ClusterStatus.RETIRED)

# How many ranked placements to ask the matcher for: the best is usually free, the rest cover leases
# that other buyers or other failovers took between the matcher's read and our hold.
PLACEMENT_CANDIDATES = 10

NOTICE_REPLACED = "lease_replaced"
NOTICE_FAILED = "lease_failed"
NOTICE_INTERRUPTED = "lease_interrupted"


@dataclass(frozen=True)
class FailoverOutcome:
    """What failover did with one lease: ``replacement`` is the new lease, or None when the job ended
    (``job_state`` failed, or completed when its whole duration had already been reported)."""

    lease_id: int
    job_id: int
    replacement_id: int | None
    job_state: str
    remaining_seconds: int
    billed_until: datetime
    reason: str


def leases_fail_over(*, now: datetime | None = None, budget_seconds: float | None = None) -> int:
    """Interrupt every live lease of an offline or retired cluster and re-place what can be re-placed;
    returns how many leases were handled (0 when there is nothing to do, so running it twice is harmless).

    A run takes no new lease once ``budget_seconds`` (``CARDHOUR_FAILOVER_RUN_SECONDS``) have passed: the
    rest are left live for the next run, seconds later. When a whole hub goes down, thousands of leases
    need a re-placement each; one run working through all of them held a Celery worker slot for minutes,
    and with the copies beat kept sending it held every slot, so rating, lease events and the heartbeat
    monitor stopped meanwhile (seen in benchmarks.soak). Each lease is still handled whole, in its own
    transaction, however late.

    Deliberately not atomic as a whole: each lease is handled by ``lease_fail_over`` in its own
    transaction. A first pass skips leases whose buyer or lease row another transaction holds (so workers
    running at once spread over different leases instead of queueing behind each other); a second pass
    waits for those locks, so a lease is not left for the next run just because a lock was held for a
    moment. A transient database error on one lease (a deadlock, a lost connection) does not stop the
    others; it is raised at the end so the Celery task retries soon. Any other error on one lease is logged
    and that lease is left live for the next run.
    """
    candidates = list(
        Lease.objects.filter(state__in=LIVE_STATES, cluster__status__in=DOWN_STATUSES)
        .order_by("id")
        .values_list("pk", flat=True)
    )
    handled = 0
    busy: list[int] = []
    transient: OperationalError | None = None
    budget = settings.CARDHOUR_FAILOVER_RUN_SECONDS if budget_seconds is None else budget_seconds
    deadline = time.monotonic() + budget
    for wait, lease_ids in ((False, candidates), (True, busy)):
        for lease_id in lease_ids:
            if handled and time.monotonic() > deadline:
                logger.info("failover: %s s spent; the leases left are for the next run", budget)
                return _raise_or(handled, transient)
            try:
                outcome = lease_fail_over(lease_id=lease_id, now=now, wait=wait)
            except LeaseBusy:
                if not wait:
                    busy.append(lease_id)
                continue
            except OperationalError as exc:  # e.g. a deadlock with a concurrent cancel: the others go on
                logger.warning("failover of lease %s hit a transient database error: %s", lease_id, exc)
                transient = transient or exc
                continue
            except Exception:  # one bad lease must not stop failover of the others; it is retried next run
                logger.exception(
                    "failover of lease %s failed; it stays live and is retried next run", lease_id
                )
                continue
            if outcome is not None:
                handled += 1
    return _raise_or(handled, transient)


def _raise_or(handled: int, transient: OperationalError | None) -> int:
    if transient is not None:
        raise transient  # the task retries it soon; what was handled is committed and is not done twice
    return handled


class LeaseBusy(Exception):
    """Another transaction holds the lease's buyer or lease row (raised only when not waiting)."""


@transaction.atomic
def lease_fail_over(
    *, lease_id: int, now: datetime | None = None, wait: bool = True
) -> FailoverOutcome | None:
    """Fail over one lease if it is still live on a down cluster; None when there is nothing to do (it
    ended meanwhile — e.g. another worker failed it over — or its cluster came back).

    Locks the buyer's organisation row and then the lease row (the broker's lock order: lease_create takes
    the buyer row, then the islands). With ``wait`` False, a row another transaction holds raises
    LeaseBusy at once (PostgreSQL SKIP LOCKED) and nothing is written.

    Side effects (see the module docstring): the lease becomes ``interrupted`` with ``ended_at`` set to the
    billing cut-off; a replacement lease is created (``replaces`` the old one) or the job fails; a
    BuyerNotice tells the buyer which.
    """
    buyer_id = Lease.objects.filter(pk=lease_id).values_list("buyer_id", flat=True).first()
    if buyer_id is None:
        return None
    locked_buyer = (
        Organisation.objects.select_for_update(skip_locked=not wait)
        .filter(pk=buyer_id)
        .values_list("pk")
        .first()
    )
    lease = (
        Lease.objects.select_for_update(skip_locked=not wait, of=("self",))
        .select_related("job", "cluster")
        .filter(pk=lease_id)
        .first()
    )
    if locked_buyer is None or lease is None:
        if wait:  # only a deleted row reads as None when waiting
            return None
        raise LeaseBusy(lease_id)
    if lease.state not in LIVE_STATES or lease.cluster.status not in DOWN_STATUSES:
        return None
    at = now or timezone.now()
    cluster = lease.cluster
    job = lease.job
    cause = _cause(cluster)
    never_started = lease.started_at is None and lease.last_usage_end_at is None
    was_stopping = lease.state == LeaseState.STOP_REQUESTED
    remaining = _remaining_seconds(lease)
    billed_until = _billing_cut_off(lease, at=at)

    leases.lease_transition(
        lease=lease,
        to_state=LeaseState.INTERRUPTED,
        actor=FAILOVER,
        reason=f"cluster {cluster.cpi} {cause}",
        at=at,
    )
    Lease.objects.filter(pk=lease.pk).update(ended_at=billed_until)
    lease.ended_at = billed_until

    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state != Job.State.PLACED:
        # Closed some other way while the lease ran (it cannot normally happen): nothing to re-place.
        return _outcome(lease, job, None, remaining, billed_until, f"job already {job.state}")
    if remaining <= 0 and not never_started:
        reason = (
            f"Lease {lease.pk} on {cluster.cpi} was interrupted ({cause}) after its whole duration had been "
            "reported; the job is complete."
        )
        _job_end(job=job, state=Job.State.COMPLETED, reason="", at=at)
        leases.notice_create(
            buyer_id=job.buyer_id, kind=NOTICE_INTERRUPTED, message=reason, job_id=job.pk, lease_id=lease.pk
        )
        return _outcome(lease, job, None, 0, billed_until, reason)
    if was_stopping:
        return _fail(
            lease=lease,
            job=job,
            at=at,
            remaining=remaining,
            reason=f"Lease {lease.pk} was stopping when {cluster.cpi} {cause}; it is not re-placed.",
        )
    if not (job.checkpointable or never_started):
        return _fail(
            lease=lease,
            job=job,
            at=at,
            remaining=remaining,
            reason=(
                f"Lease {lease.pk} was interrupted: {cluster.cpi} {cause}. The job is not checkpointable, "
                "so it cannot resume elsewhere."
            ),
        )
    return _replace(lease=lease, job=job, at=at, remaining=remaining, cause=cause)


def _replace(*, lease: Lease, job: Job, at: datetime, remaining: int, cause: str) -> FailoverOutcome:
    cluster = lease.cluster
    # Whole seconds: the matcher starts runs on whole seconds, so a window of exactly ``remaining`` seconds
    # from a fractional ``at`` would have no start at all.
    earliest = max(_next_whole_second(at), job.earliest_start_at)
    failures: list[str] = []
    try:
        spec = jobs.job_spec(
            job=job,
            earliest_start_at=earliest,
            deadline_at=max(job.deadline_at, earliest + timedelta(seconds=remaining)),
            duration_seconds=remaining,
            exclude_clusters=frozenset({cluster.pk}),
        )
        result = quotes.placements_find(spec=spec, buyer=job.buyer, now=at, limit=PLACEMENT_CANDIDATES)
    except DomainError as exc:
        return _fail(
            lease=lease,
            job=job,
            at=at,
            remaining=remaining,
            reason=f"Lease {lease.pk} was interrupted ({cluster.cpi} {cause}) and could not be re-quoted: "
            f"{exc.message}",
        )
    for placement in result.placements:
        try:
            with transaction.atomic():  # a savepoint: a refused placement leaves nothing behind
                replacement = leases.lease_create_from_placement(
                    job=job,
                    placement=placement,
                    actor=FAILOVER,
                    replaces=lease,
                    reason=f"replaces lease {lease.pk}: {cluster.cpi} {cause}",
                )
        except (CapacityTakenError, ClusterUnavailableError, InsufficientBalanceError) as exc:
            failures.append(exc.code)
            continue
        message = (
            f"Lease {lease.pk} on {cluster.cpi} was interrupted ({cause}). Its remaining {remaining} s were "
            f"re-placed as lease {replacement.pk} on {placement.cluster_cpi}, starting "
            f"{placement.start_at.isoformat()}."
        )
        leases.notice_create(
            buyer_id=job.buyer_id,
            kind=NOTICE_REPLACED,
            message=message,
            job_id=job.pk,
            lease_id=replacement.pk,
        )
        return _outcome(lease, job, replacement.pk, remaining, lease.ended_at, message)

    if failures and all(code == InsufficientBalanceError.code for code in failures):
        why = "your packs cannot pay for the remaining time; buy a pack and submit the job again"
    elif failures:
        why = "every placement found was taken before it could be held"
    else:
        rejected = ", ".join(
            f"{reason} {count}" for reason, count in sorted(result.rejections.items()) if count
        )
        why = "no other cluster can take it within the job's constraints" + (
            f" ({rejected})" if rejected else ""
        )
    return _fail(
        lease=lease,
        job=job,
        at=at,
        remaining=remaining,
        reason=f"Lease {lease.pk} was interrupted ({cluster.cpi} {cause}) and its remaining {remaining} s "
        f"could not be re-placed: {why}.",
    )


def _fail(*, lease: Lease, job: Job, at: datetime, remaining: int, reason: str) -> FailoverOutcome:
    _job_end(job=job, state=Job.State.FAILED, reason=reason, at=at)
    leases.notice_create(
        buyer_id=job.buyer_id, kind=NOTICE_FAILED, message=reason, job_id=job.pk, lease_id=lease.pk
    )
    return _outcome(lease, job, None, remaining, lease.ended_at, reason)


def _job_end(*, job: Job, state: str, reason: str, at: datetime) -> None:
    job.state = state
    job.failure_reason = reason[:500]
    Job.objects.filter(pk=job.pk).update(state=state, failure_reason=job.failure_reason, updated_at=at)


def _outcome(
    lease: Lease,
    job: Job,
    replacement_id: int | None,
    remaining: int,
    billed_until: datetime | None,
    reason: str,
) -> FailoverOutcome:
    assert billed_until is not None
    return FailoverOutcome(
        lease_id=lease.pk,
        job_id=job.pk,
        replacement_id=replacement_id,
        job_state=job.state,
        remaining_seconds=remaining,
        billed_until=billed_until,
        reason=reason,
    )


def _cause(cluster: Cluster) -> str:
    if cluster.status == ClusterStatus.RETIRED:
        return "was retired"
    if cluster.offline_cause == Cluster.OfflineCause.HEARTBEAT:
        return "went offline (missed heartbeats)"
    if cluster.offline_cause == Cluster.OfflineCause.OPERATOR:
        return "was set offline by its operator"
    if cluster.offline_cause == Cluster.OfflineCause.STAFF:
        return "was set offline by platform staff"
    return "went offline"


def _remaining_seconds(lease: Lease) -> int:
    """The lease's planned duration less the run time already reported (whole seconds, never negative).

    The planned duration is the lease's own window, so a replacement that is itself interrupted re-places
    only what it still had to run.
    """
    planned = int((lease.end_at - lease.start_at).total_seconds())
    if lease.last_usage_end_at is None:
        return planned
    began = lease.started_at or lease.start_at
    ran = int((lease.last_usage_end_at - began).total_seconds())
    return max(planned - max(ran, 0), 0)


def _next_whole_second(value: datetime) -> datetime:
    whole = value.replace(microsecond=0)
    return whole if whole == value else whole + timedelta(seconds=1)


def _billing_cut_off(lease: Lease, *, at: datetime) -> datetime:
    """Where billing of an interrupted lease stops (see the module docstring)."""
    if lease.last_usage_end_at is not None:
        return lease.last_usage_end_at
    return min(lease.started_at or lease.start_at, at)
