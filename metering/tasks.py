"""Celery entry points for metering's billing jobs: thin, idempotent, scheduled by django-celery-beat.

Schedules live in the database (migration 0004_billing_schedules) so staff can edit them in the admin.
Only transient database errors (OperationalError: a dropped connection, a deadlock victim, a serialisation
failure) are retried; a domain error or a bug fails the task loudly instead of retrying it.

The month-end close is one task, not a fan-out of one task per organisation: the platform runs Celery
without a result backend, so no chord could tell when every statement is issued and mark the close
finished. billing_close_period issues each statement in its own transaction and is resumable, so a
retried or redelivered task (acks_late) picks up where a crash left it, and each statement exists once
by its unique (organisation, period) constraint.
"""

from __future__ import annotations

from datetime import date

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from metering.services import billing, maintenance, partitions, rating


@shared_task(
    name="metering.usage_rate_pending",
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
)
def usage_rate_pending(
    batch_size: int | None = None,
    max_batches: int | None = None,
    shard: int | None = None,
    shards: int | None = None,
) -> int:
    """Rate unrated usage records (every minute). A record already rated is never claimed again, and two
    workers never claim the same record (SKIP LOCKED), so overlapping runs are safe.

    The beat's run (no ``shard``) fans out over ``CARDHOUR_RATING_SHARDS`` parts of the buyers: it queues
    one task for each other part and rates part 0 itself, so a worker with that many processes rates in
    parallel (rating.Shard says why by buyer). Each part's task is the same idempotent run; one that is
    lost or late leaves its records to the next minute's.

    With more than one part, this task returns as soon as part 0 is rated, before the other parts' tasks
    have finished (they are only queued: nothing waits for them, the platform keeps no result backend), and
    what it returns is part 0's count, not the minute's. With one part it rates everything itself."""
    parts = shards if shards is not None else settings.CARDHOUR_RATING_SHARDS
    if parts <= 1:
        return rating.usage_rate_pending(batch_size=batch_size, max_batches=max_batches)
    if shard is None:
        for index in range(1, parts):
            usage_rate_pending.delay(
                batch_size=batch_size, max_batches=max_batches, shard=index, shards=parts
            )
        shard = 0
    return rating.usage_rate_pending(
        batch_size=batch_size, max_batches=max_batches, shard=rating.Shard(index=shard, of=parts)
    )


@shared_task(
    name="metering.packs_expire_due",
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def packs_expire_due() -> int:
    """Expire the packs past their expiry (daily). Each pack once: keyed transfer, status check."""
    return maintenance.packs_expire_due()


@shared_task(
    name="metering.ledger_reconcile",
    # Long at scale: its own limits, inside the broker's visibility timeout (config/settings/base.py).
    soft_time_limit=6600,
    time_limit=7200,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
)
def ledger_reconcile() -> bool:
    """Check the ledger's invariants (daily). Breaches are logged at ERROR on ``cardhour.ledger`` by the
    service (the alert); the task returns whether the ledger is clean and never retries a breach."""
    return maintenance.ledger_reconcile().ok


@shared_task(
    name="metering.billing_close_previous_month",
    # Long at scale: its own limits, inside the broker's visibility timeout (config/settings/base.py).
    soft_time_limit=6600,
    time_limit=7200,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=8,
)
def billing_close_previous_month() -> str:
    """Issue last month's invoices and settlements (00:30 on the 1st, billing zone). Safe to run twice."""
    run = billing.billing_close_previous_month()
    return run.period_start.isoformat()


@shared_task(
    name="metering.billing_close_period",
    # Long at scale: its own limits, inside the broker's visibility timeout (config/settings/base.py).
    soft_time_limit=6600,
    time_limit=7200,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=8,
)
def billing_close_period(period_start: str) -> str:
    """Close one month given as ``YYYY-MM-01`` (for staff re-running or catching up a close)."""
    run = billing.billing_close_period(period_start=date.fromisoformat(period_start))
    return run.period_start.isoformat()


@shared_task(
    name="metering.usage_partitions_ensure",
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def usage_partitions_ensure() -> int:
    """Create the coming months' usage and segment partitions (daily; PostgreSQL only, a no-op elsewhere).
    Idempotent: a month that exists is left alone. Returns how many partitions were created."""
    return len(partitions.usage_partitions_ensure())
