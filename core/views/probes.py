"""Probes for load balancers and orchestrators, and the Prometheus scrape endpoint.

- ``/livez``: the process answers (no database): restart the process when this fails.
- ``/readyz``: the database answers and beat is alive — the fastest enabled interval task started within
  ``CARDHOUR_READYZ_BEAT_INTERVALS`` of its intervals. 503 with the failing check otherwise: take the
  instance out of rotation and page someone (if beat is dead, rating, failover and lease events have
  stopped even though every web process is healthy).
- ``/metrics``: Prometheus text, for addresses in ``CARDHOUR_METRICS_ALLOWED_NETWORKS`` (loopback by default)
  or a caller presenting ``Authorization: Bearer <METRICS_TOKEN>``; 404 to anyone else, so its existence
  is not advertised.
"""

from __future__ import annotations

import hmac
import ipaddress
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET


@require_GET
def livez(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def beat_check() -> tuple[bool, dict[str, object]]:
    """Whether beat's fastest enabled interval task started recently enough, with the figures."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from core.models import TaskRun

    intervals = settings.CARDHOUR_READYZ_BEAT_INTERVALS
    if intervals <= 0:
        return True, {"beat": "not checked"}
    seconds_per = {
        IntervalSchedule.DAYS: 86400,
        IntervalSchedule.HOURS: 3600,
        IntervalSchedule.MINUTES: 60,
        IntervalSchedule.SECONDS: 1,
        IntervalSchedule.MICROSECONDS: 1e-6,
    }
    fastest: tuple[float, str] | None = None
    for task in PeriodicTask.objects.filter(enabled=True, interval__isnull=False).select_related("interval"):
        assert task.interval is not None
        period = task.interval.every * seconds_per[task.interval.period]
        if fastest is None or period < fastest[0]:
            fastest = (period, task.task)
    if fastest is None:
        return True, {"beat": "no interval task"}
    period, name = fastest
    allowed = timedelta(seconds=period * intervals)
    run = TaskRun.objects.filter(name=name).first()
    last = run.last_started_at if run else None
    detail: dict[str, object] = {
        "beat_task": name,
        "beat_interval_seconds": period,
        "beat_last_started_at": last.isoformat() if last else None,
        "beat_allowed_seconds": allowed.total_seconds(),
    }
    if last is None:
        return False, {"beat": "never ran", **detail}
    if timezone.now() - last > allowed:
        return False, {"beat": "stale", **detail}
    return True, {"beat": "ok", **detail}


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return JsonResponse(
            {"status": "unavailable", "checks": {"database": "unreachable"}, "detail": type(exc).__name__},
            status=503,
        )
    ok, beat = beat_check()
    checks = {"database": "ok", **beat}
    return JsonResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503
    )


def _metrics_allowed(request: HttpRequest) -> bool:
    token = settings.CARDHOUR_METRICS_TOKEN
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net) for net in settings.CARDHOUR_METRICS_ALLOWED_NETWORKS)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    from core.observability import metrics_exposition

    if not _metrics_allowed(request):
        raise Http404
    body, content_type = metrics_exposition()
    return HttpResponse(body, content_type=content_type)
