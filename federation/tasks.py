"""Celery entry points for federation: thin, idempotent."""

from celery import shared_task
from django.db import OperationalError

from federation import services


@shared_task(
    name="federation.clusters_mark_missed_heartbeats",
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=3,
)
def clusters_mark_missed_heartbeats() -> int:
    """Take offline the clusters that missed their heartbeats. Safe to run concurrently and repeatedly:
    a cluster already offline is not selected again."""
    return len(services.clusters_mark_missed_heartbeats())
