"""Celery entry points for the broker: thin, idempotent, scheduled by django-celery-beat (migration
0002_broker_schedules, editable in the admin). Only transient database errors are retried."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from broker.services import dispatch, failover, quotes, reliability, sla


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
    """Ask operators to stop the running leases of buyers whose packs ran dry (every 10 s)."""
    return dispatch.leases_stop_exhausted()


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
