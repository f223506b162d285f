"""Enforcement on arrival: usage is rated within seconds of being accepted, and the running leases of the
buyers that rating flags (packs exhausted, a budget's hard cap reached) are asked to stop at once, instead of on the minute's rating beat.

The path: the usage API, once a report that stored records has committed, calls
``broker.tasks.usage_rate_on_arrival_request``, which queues the ``broker.usage_rate_on_arrival`` task (to start
``RATING_COALESCE_SECONDS`` later) unless one is already waiting; the task runs :func:`usage_rate_and_enforce` — metering's set-based rating of every
pending record (the same service as the minute's beat, so the records of a burst are rated in one batch, not
one by one), then :func:`broker.services.dispatch.leases_stop_flagged`, which moves the flagged buyers'
running leases to stop_requested, writes their lease events and wakes the operators' long-polls on commit.

Bursts coalesce through a marker in the shared cache (Redis in production): the first report after the
marker is gone sets it (``cache.add``, atomic) and queues the task; later reports find it set and queue
nothing. The task deletes the marker *before* it claims any record, so a report committed while a run is
under way queues exactly one more run, and every committed record is followed by a run that starts after its
commit: either a run still waiting in the queue (the marker was set) or the one it queues itself. The marker
expires after ``RATING_REQUESTED_SECONDS`` so a lost message (a worker killed before it took it, a broker
restart) delays arrival rating by that much at most; the minute's rating and the 10 s stop run stay as the
safety net either way.

Running beside the minute's rating is safe: both claim pending records ``FOR UPDATE SKIP LOCKED`` and lock the
buyers' pack accounts before drawing them (metering.services.rating), so no record is rated twice and no pack
is drawn past what it holds. One window is left to the safety net: records the beat's batch has claimed and
not yet committed are skipped here, so a buyer they empty is stopped by the 10 s stop run instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.cache import cache

from broker.services import dispatch
from metering.services import rating

RATING_REQUESTED_KEY = "cardhour:usage-rating-requested"
# A queued run starts this long after the report that queued it, so a steady stream of reports (≈1,700 records
# a second at design load) makes at most a few runs a second, each rating what came meanwhile in one batch,
# instead of one run after another each paying rating's fixed cost (the packs locked, one transfer) for a
# handful of records. Well inside the 2 s the issue allows from acceptance to stop request.
RATING_COALESCE_SECONDS = 0.25
# A queued run normally starts within milliseconds; the marker only outlives it if the message was lost.
RATING_REQUESTED_SECONDS = 30


@dataclass(frozen=True)
class EnforcementRun:
    rated: int
    stopped: int
    more: bool = False  # the rating stopped for its time budget with records possibly left: run again


def usage_rating_request_mark() -> bool:
    """Mark a rating run as requested; True when this call set the marker (the caller queues the run),
    False when a requested run has not started yet (it will see the caller's records)."""
    return bool(cache.add(RATING_REQUESTED_KEY, 1, timeout=RATING_REQUESTED_SECONDS))


def usage_rating_request_clear() -> None:
    """Forget the request (a run starting, or a run that could not be queued)."""
    cache.delete(RATING_REQUESTED_KEY)


def usage_rate_and_enforce(*, now: datetime | None = None) -> EnforcementRun:
    """Rate the pending usage records (for at most ``CARDHOUR_RATING_RUN_SECONDS``: ``more`` then says to
    run again), then ask operators to stop the running leases of the buyers that are
    flagged (packs exhausted today); return how many records were rated and leases stopped.

    Clears the request marker first, so reports committed from here on queue one more run. Idempotent: a
    rated record is never claimed again and a lease already asked to stop is not touched; safe beside the
    minute's rating (see the module docstring). Each rating batch and each stop is its own transaction.
    """
    usage_rating_request_clear()
    rated_buyers: set[int] = set()
    run = rating.usage_rate_run(
        seconds=settings.CARDHOUR_RATING_RUN_SECONDS, now=now, rated_buyers=rated_buyers
    )
    # Only the buyers just rated can have become flagged or crossed a cap through this run's records;
    # the 10 s safety net looks at everyone.
    stopped = dispatch.leases_stop_flagged(buyer_ids=rated_buyers, now=now) if rated_buyers else 0
    return EnforcementRun(rated=run.rated, stopped=stopped, more=run.more)
