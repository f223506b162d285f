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

import logging
from collections.abc import Callable
from datetime import date

from celery import shared_task
from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError

from metering.services import billing, maintenance, partitions, rating

logger = logging.getLogger(__name__)


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
    workers never claim the same record (SKIP LOCKED), so overlapping runs are safe. A run claims no new batch
    after ``CARDHOUR_RATING_RUN_SECONDS`` and then queues the next run of its part (_rate_and_continue).

    The beat's run (no ``shard``) fans out over ``CARDHOUR_RATING_SHARDS`` parts of the buyers: it queues
    one task for each other part and rates part 0 itself, so a worker with that many processes rates in
    parallel (rating.Shard says why by buyer). Each part's task is the same idempotent run; one that is
    lost or late leaves its records to the next minute's.

    With more than one part, this task returns as soon as part 0 is rated, before the other parts' tasks
    have finished (they are only queued: nothing waits for them, the platform keeps no result backend), and
    what it returns is part 0's count, not the minute's. With one part it rates everything itself."""
    parts = shards if shards is not None else settings.CARDHOUR_RATING_SHARDS
    if parts <= 1:
        return _rate_and_continue(batch_size=batch_size, max_batches=max_batches, shard=None)
    if shard is None:
        for index in range(1, parts):
            usage_rate_pending.delay(
                batch_size=batch_size, max_batches=max_batches, shard=index, shards=parts
            )
        shard = 0
    return _rate_and_continue(
        batch_size=batch_size, max_batches=max_batches, shard=rating.Shard(index=shard, of=parts)
    )


# A run that stopped for its time budget (CARDHOUR_RATING_RUN_SECONDS) queues the next run of its part at once
# rather than leave the backlog to the next minute; a marker per part (cache.add, atomic) keeps at most one
# such run waiting, however many runs stop for their budget meanwhile. Each run deletes its part's marker when
# it starts. The marker expires on its own if the queued run is lost: the minute's beat carries on.
RATING_CONTINUE_KEY = "cardhour:usage-rating-continue:{part}"


def _rate_and_continue(*, batch_size: int | None, max_batches: int | None, shard: rating.Shard | None) -> int:
    key = RATING_CONTINUE_KEY.format(part=f"{shard.index}/{shard.of}" if shard else "all")
    _cache_quietly(lambda: cache.delete(key))
    run = rating.usage_rate_run(
        seconds=settings.CARDHOUR_RATING_RUN_SECONDS,
        batch_size=batch_size,
        max_batches=max_batches,
        shard=shard,
    )
    if run.more:
        _queue_next_run(
            key,
            {
                "batch_size": batch_size,
                "max_batches": max_batches,
                "shard": shard.index if shard else None,
                "shards": shard.of if shard else 1,
            },
        )
    return run.rated


def _queue_next_run(key: str, kwargs: dict[str, int | None]) -> bool:
    """Queue the next run of a part unless one is already waiting; True when this call queued it."""
    if not _cache_quietly(
        lambda: cache.add(key, 1, timeout=max(60, int(settings.CARDHOUR_RATING_RUN_SECONDS * 4)))
    ):
        return False
    try:
        usage_rate_pending.delay(**kwargs)
    except Exception:
        # What this run rated is committed; the minute's beat rates the rest.
        _cache_quietly(lambda: cache.delete(key))
        logger.warning("could not queue the next rating run; the minute's rating carries on", exc_info=True)
        return False
    return True


def _cache_quietly(call: Callable[[], object]) -> object:
    """The shared cache's answer, or None when it is unreachable (rating goes on; the beat is the net)."""
    try:
        return call()
    except Exception:
        logger.warning(
            "rating continuation marker unavailable; the minute's rating carries on", exc_info=True
        )
        return None


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
