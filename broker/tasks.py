"""Celery entry points for the broker: thin, idempotent, scheduled by django-celery-beat (migration
0002_broker_schedules, editable in the admin). Only transient database errors are retried."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from broker.services import dispatch, enforcement, failover, quotes, reliability, sla

logger = logging.getLogger(__name__)


@shared_task(
    name="broker.leases_fail_over", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def leases_fail_over() -> int:
    """Interrupt the leases of offline clusters and re-place the checkpointable ones (every 5 s, so a
    lease is re-placed within 10 s of its cluster going offline). Safe to run twice: a handled lease is
    no longer live."""
    return failover.leases_fail_over()


@shared_task(
    name="broker.leases_stop_exhausted", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def leases_stop_exhausted() -> int:
    """Ask operators to stop the running leases of buyers whose packs ran dry (every 10 s): the safety net
    of enforcement on arrival for exhaustion; leases_stop_over_cap below is the one for budget caps."""
    return dispatch.leases_stop_exhausted()


@shared_task(
    name="broker.usage_rate_on_arrival", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def usage_rate_on_arrival() -> int:
    """Rate the pending usage and stop the leases of the buyers it flags (queued when usage is accepted, at
    most one waiting at a time: broker.services.enforcement). Safe to run twice and beside the minute's
    rating: a rated record is never claimed again, a lease asked to stop is not asked again."""
    run = enforcement.usage_rate_and_enforce()
    if run.more:
        # Stopped for its time budget behind a backlog: the next run follows at once (unless reports
        # already queued one), not only when the next report or the minute's beat comes.
        usage_rate_on_arrival_request()
    return run.stopped


def usage_rate_on_arrival_request() -> None:
    """Queue usage_rate_on_arrival unless a run is already waiting; called once usage has been committed.

    Never raises: the usage is stored whatever happens here, and if the cache or the Celery broker is
    unreachable the minute's rating and the 10 s stop run enforce it instead."""
    if not settings.CARDHOUR_RATING_ON_ARRIVAL:
        return
    try:
        if enforcement.usage_rating_request_mark():
            try:
                usage_rate_on_arrival.apply_async(countdown=enforcement.RATING_COALESCE_SECONDS)
            except Exception:
                enforcement.usage_rating_request_clear()  # so the next report tries again
                raise
    except Exception:
        logger.warning("could not queue rating on arrival; the minute's rating will rate it", exc_info=True)


@shared_task(
    name="broker.lease_events_deliver", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def lease_events_deliver() -> int:
    """POST due lease events to operators' endpoints, with backoff (every 5 s)."""
    return dispatch.lease_events_deliver_due()


@shared_task(name="broker.quotes_purge", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3)
def quotes_purge() -> int:
    """Delete quotes that expired more than a day ago and were never accepted (hourly)."""
    return quotes.quotes_purge()


# --- Budgets and caps (broker.budgets) --------------------------------------------------------------


@shared_task(
    name="broker.leases_stop_over_cap", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def leases_stop_over_cap() -> int:
    """Evaluate budgets on posted spend (threshold alerts, cap breaches) and ask operators to stop the
    running leases of breached scopes (every 10 s, beside leases_stop_exhausted)."""
    return dispatch.leases_stop_over_cap()


@shared_task(
    name="broker.budget_alerts_deliver", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def budget_alerts_deliver(alert_ids: list[int] | None = None) -> int:
    """E-mail and POST due budget alerts (queued after the commit that raised them, and every 5 s for
    retries with backoff). Safe to run twice: each run claims its own rows."""
    from broker.budgets.services import budget_alerts_deliver_due

    return budget_alerts_deliver_due(alert_ids=alert_ids)


@shared_task(
    name="broker.reliability_refresh", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def reliability_refresh() -> int:
    """Recompute every cluster's reliability score over the last 30 days (hourly). Safe to run twice: each
    run replaces the rows from scratch."""
    return reliability.cluster_reliability_refresh()


@shared_task(
    name="broker.leases_sla_assess", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=3
)
def leases_sla_assess() -> int:
    """Assess ended leases for SLA credits and issue the credit notes they earn (every 10 minutes). Safe to
    run twice: a lease has one assessment, and a credit one transfer."""
    return sla.leases_sla_assess_due()
