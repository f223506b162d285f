"""Observability: request ids carried into logs and Celery tasks, JSON logs, Prometheus metrics, and the
record of each task's last run that readiness and the metrics read.

- **Request ids.** :class:`RequestContextMiddleware` takes a well-formed incoming ``X-Request-ID`` (or makes
  one), returns it on the response, and puts it in a context variable that every log record carries
  (:class:`ContextFilter`). A task enqueued while a request is served carries the id in its headers; the
  worker restores it beside the task's own id for the task's log lines (``celery_signals_connect``).
- **Metrics.** Request latency by route pattern (never the raw path: bounded cardinality), method and status
  class; quote latency (observed by the broker's quote view); and domain gauges computed at scrape time
  from the database by the sources each app registers (:func:`gauge_source`). With several server
  processes set ``PROMETHEUS_MULTIPROC_DIR`` (config/gunicorn.conf.py does) and every process's samples are
  aggregated on scrape.
- **Task runs.** :class:`core.models.TaskRun` keeps, per task name, when it last started, succeeded and
  failed: "the last run of each periodic task" as a gauge, and beat's liveness for ``/readyz``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from core.middleware import DualModeMiddleware

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("cardhour_request_id", default="")
task_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("cardhour_task_id", default="")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

REQUEST_SECONDS = Histogram(
    "cardhour_http_request_duration_seconds",
    "Time to answer an HTTP request, by route pattern, method and status class.",
    ["route", "method", "status"],
    buckets=_LATENCY_BUCKETS,
)
QUOTE_SECONDS = Histogram(
    "cardhour_quote_duration_seconds",
    "Time to compute and store a job's quotes (the matcher, affordability and the quote rows).",
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


# --- Request ids --------------------------------------------------------------------------------------


def request_id_from(value: str | None) -> str:
    """The caller's id when it is well formed (letters, digits, ``._:-``, at most 128), else a new one."""
    if value and _REQUEST_ID.match(value):
        return value
    return uuid.uuid4().hex


def _route(request: HttpRequest) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unmatched"
    return "/" + str(match.route) if match.route else (match.view_name or "unmatched")


class RequestContextMiddleware(DualModeMiddleware):
    """Outermost middleware: the request id (in, out and in every log line) and the latency histogram."""

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        began, token = self._begin(request)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        return self._end(request, response, began)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        began, token = self._begin(request)
        try:
            response: HttpResponse = await self.get_response(request)
        finally:
            request_id_var.reset(token)
        return self._end(request, response, began)

    @staticmethod
    def _begin(request: HttpRequest) -> tuple[float, contextvars.Token[str]]:
        request_id = request_id_from(request.META.get("HTTP_X_REQUEST_ID"))
        request.request_id = request_id  # type: ignore[attr-defined]
        return time.perf_counter(), request_id_var.set(request_id)

    @staticmethod
    def _end(request: HttpRequest, response: HttpResponse, began: float) -> HttpResponse:
        response[REQUEST_ID_HEADER] = request.request_id  # type: ignore[attr-defined]
        REQUEST_SECONDS.labels(
            route=_route(request), method=request.method or "", status=f"{response.status_code // 100}xx"
        ).observe(time.perf_counter() - began)
        return response


# --- Logs -----------------------------------------------------------------------------------------------


class ContextFilter(logging.Filter):
    """Puts the current request id and task id on every record (empty outside a request or a task)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.task_id = task_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, request and task ids, and
    the exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "task_id"):
            value = getattr(record, key, "")
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(entry, ensure_ascii=False, default=str)


# --- Celery: ids across the queue, and each task's last run ------------------------------------------------

_HEADER = "cardhour_request_id"


def _on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    request_id = request_id_var.get()
    if headers is not None and request_id:
        headers.setdefault(_HEADER, request_id)


_task_tokens: dict[str, tuple[contextvars.Token[str], contextvars.Token[str], float]] = {}


def _on_prerun(task_id: str = "", task: Any = None, **_: Any) -> None:
    request_id = ""
    if task is not None:
        request_id = str(
            getattr(task.request, _HEADER, "") or (task.request.headers or {}).get(_HEADER, "") or ""
        )
    _task_tokens[task_id] = (task_id_var.set(task_id), request_id_var.set(request_id), time.monotonic())
    if task is not None:
        task_run_record(name=task.name, event="started")


def _on_postrun(task_id: str = "", task: Any = None, state: str | None = None, **_: Any) -> None:
    tokens = _task_tokens.pop(task_id, None)
    runtime = time.monotonic() - tokens[2] if tokens else None
    if task is not None:
        task_run_record(
            name=task.name, event="succeeded" if state == "SUCCESS" else "failed", runtime_seconds=runtime
        )
    if tokens:
        task_id_var.reset(tokens[0])
        request_id_var.reset(tokens[1])


def celery_signals_connect() -> None:
    from celery import signals

    signals.before_task_publish.connect(_on_publish, weak=False, dispatch_uid="cardhour-request-id")
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="cardhour-task-prerun")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="cardhour-task-postrun")


def task_run_record(*, name: str, event: str, runtime_seconds: float | None = None) -> None:
    """Note that task ``name`` (one of the platform's own: ``CARDHOUR_TASK_RUN_PREFIXES``) started,
    succeeded or failed now: one upsert, no lock. Never raises: a database that cannot take the note must
    not fail the task (readiness will show it)."""
    from django.conf import settings

    if not name.startswith(tuple(settings.CARDHOUR_TASK_RUN_PREFIXES)):
        return
    try:
        from django.utils import timezone

        from core.models import TaskRun

        now = timezone.now()
        column = {"started": "last_started_at", "succeeded": "last_succeeded_at"}.get(event, "last_failed_at")
        fields = [column] if event == "started" else [column, "last_runtime_seconds"]
        TaskRun.objects.bulk_create(
            [TaskRun(name=name[:200], **{column: now}, last_runtime_seconds=runtime_seconds)],
            update_conflicts=True,
            unique_fields=["name"],
            update_fields=fields,
        )
    except Exception:
        logger.warning("could not record the %s of task %s", event, name, exc_info=True)


# --- Gauges read from the database at scrape time ------------------------------------------------------------

GaugeSource = Callable[[], Iterable[Metric]]
_sources: dict[str, GaugeSource] = {}


def gauge_source(name: str) -> Callable[[GaugeSource], GaugeSource]:
    """Register a function that yields metric families computed at scrape time (each app its own)."""

    def register(source: GaugeSource) -> GaugeSource:
        _sources[name] = source
        return source

    return register


class _DatabaseGauges(Collector):
    def collect(self) -> Iterator[Metric]:
        for name, source in sorted(_sources.items()):
            try:
                yield from source()
            except Exception:  # one broken source must not take the others down
                logger.exception("metrics source %s failed", name)
                failed = GaugeMetricFamily(
                    "cardhour_metrics_source_failed", "1 when a metrics source raised.", labels=["source"]
                )
                failed.add_metric([name], 1)
                yield failed


@gauge_source("core")
def _task_gauges() -> Iterator[Metric]:
    from core.models import TaskRun

    started = GaugeMetricFamily(
        "cardhour_task_last_started_timestamp_seconds",
        "When each task last started (Unix time).",
        labels=["task"],
    )
    succeeded = GaugeMetricFamily(
        "cardhour_task_last_succeeded_timestamp_seconds",
        "When each task last finished without error (Unix time).",
        labels=["task"],
    )
    failed = GaugeMetricFamily(
        "cardhour_task_last_failed_timestamp_seconds",
        "When each task last failed (Unix time).",
        labels=["task"],
    )
    for run in TaskRun.objects.all():
        if run.last_started_at:
            started.add_metric([run.name], run.last_started_at.timestamp())
        if run.last_succeeded_at:
            succeeded.add_metric([run.name], run.last_succeeded_at.timestamp())
        if run.last_failed_at:
            failed.add_metric([run.name], run.last_failed_at.timestamp())
    yield from (started, succeeded, failed)


@gauge_source("celery")
def _queue_gauges() -> Iterator[Metric]:
    """Messages waiting in each of the platform's Celery queues (``CELERY_TASK_QUEUES``), asked of the broker
    at scrape time: a passive declare, which creates nothing. A queue the broker does not know has nothing
    waiting (Redis drops an empty list; RabbitMQ has it only once a worker or a publish declared it), so it
    reads 0. An unreachable broker fails this source alone (``cardhour_metrics_source_failed``). A growing
    ``control`` queue means the heartbeat monitor and failover are waiting: a control worker is missing or
    starved (README, *Celery workers and queues*)."""
    from django.conf import settings
    from kombu.exceptions import OperationalError

    from config.celery_app import app

    depth = GaugeMetricFamily(
        "cardhour_celery_queue_messages",
        "Messages waiting in each Celery queue, read from the broker at scrape time.",
        labels=["queue"],
    )
    with app.connection_for_read() as connection:
        try:
            connection.ensure_connection(max_retries=1)
        except OperationalError as exc:
            raise RuntimeError("the Celery broker is unreachable") from exc
        for queue in settings.CELERY_TASK_QUEUES:
            # One channel per queue: RabbitMQ closes the channel on which a passive declare found nothing.
            channel = connection.channel()
            try:
                waiting = channel.queue_declare(queue=queue.name, passive=True).message_count
            except connection.channel_errors as exc:  # not found: 404 (an int from RabbitMQ, text from kombu)
                if str(getattr(exc, "reply_code", "")) != "404":
                    raise
                waiting = 0
            finally:
                try:
                    channel.close()
                except Exception:  # already closed by the broker after a 404
                    logger.debug("channel already closed", exc_info=True)
            depth.add_metric([queue.name], waiting)
    yield depth


def metrics_exposition() -> tuple[bytes, str]:
    """The Prometheus text exposition: this process's (or, in multiprocess mode, every process's)
    request and quote histograms, and the database gauges."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        registry = _process_registry()
    body = generate_latest(registry) + generate_latest(_database_registry())
    return body, CONTENT_TYPE_LATEST


def _process_registry() -> CollectorRegistry:
    return REGISTRY


_db_registry: CollectorRegistry | None = None


def _database_registry() -> CollectorRegistry:
    global _db_registry
    if _db_registry is None:
        _db_registry = CollectorRegistry()
        _db_registry.register(_DatabaseGauges())
    return _db_registry
