"""Request ids in responses, logs and tasks; /metrics (request latency by route, quote latency, database
gauges, who may scrape); /livez and /readyz (database and beat)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from datetime import timedelta

import pytest
from django.test import Client, RequestFactory, override_settings
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from config.celery_app import app as celery_app
from core import observability
from core.models import TaskRun
from federation.models import Cluster, ClusterStatus
from tests.broker.test_jobs import body
from tests.factories import BuyerFactory, OperatorFactory, make_cluster

pytestmark = pytest.mark.django_db


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(observability.ContextFilter())
        self.setFormatter(observability.JsonFormatter())
        self.lines: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def log_lines() -> list[dict[str, str]]:
    handler = _Records()
    target = logging.getLogger("tests.observability")
    target.addHandler(handler)
    target.setLevel(logging.INFO)
    yield handler.lines
    target.removeHandler(handler)


# --- Request ids ------------------------------------------------------------------------------------


def test_a_response_carries_the_callers_request_id_or_a_new_one(client: Client) -> None:
    given = client.get("/livez", HTTP_X_REQUEST_ID="abc-123.x")
    made = client.get("/livez")
    hostile = client.get("/livez", HTTP_X_REQUEST_ID="<script>" + "x" * 300)

    assert given["X-Request-ID"] == "abc-123.x"
    assert len(made["X-Request-ID"]) == 32
    assert hostile["X-Request-ID"] != "<script>" and len(hostile["X-Request-ID"]) == 32


def test_log_lines_written_during_a_request_carry_its_id_as_json(log_lines: list[dict[str, str]]) -> None:
    def view(request: object) -> object:
        logging.getLogger("tests.observability").info("quoting for %s", "acme")
        from django.http import HttpResponse

        return HttpResponse("ok")

    middleware = observability.RequestContextMiddleware(view)  # type: ignore[arg-type]
    response = middleware(RequestFactory().get("/x", HTTP_X_REQUEST_ID="req-42"))

    assert response["X-Request-ID"] == "req-42"
    assert log_lines[0]["request_id"] == "req-42" and log_lines[0]["message"] == "quoting for acme"
    assert log_lines[0]["level"] == "INFO" and "time" in log_lines[0]
    assert observability.request_id_var.get() == ""  # nothing leaks past the request


@celery_app.task(name="tests.observability.log_ids")
def log_ids() -> str:
    logging.getLogger("tests.observability").info("in the task")
    return "done"


def test_a_task_enqueued_by_a_request_logs_that_request_id_and_its_own_id(
    log_lines: list[dict[str, str]],
) -> None:
    headers: dict[str, str] = {}
    token = observability.request_id_var.set("req-7")
    try:
        observability._on_publish(headers=headers)  # what before_task_publish does when the task is sent
    finally:
        observability.request_id_var.reset(token)

    with override_settings(CARDHOUR_TASK_RUN_PREFIXES=["tests."]):
        result = log_ids.apply(headers=headers, task_id="task-1")

    assert headers == {"cardhour_request_id": "req-7"}
    assert result.get() == "done"
    assert log_lines[-1]["request_id"] == "req-7" and log_lines[-1]["task_id"] == "task-1"
    run = TaskRun.objects.get(name="tests.observability.log_ids")
    assert (
        run.last_started_at is not None and run.last_succeeded_at is not None and run.last_failed_at is None
    )
    assert observability.task_id_var.get() == ""


# --- /metrics --------------------------------------------------------------------------------------------


def test_metrics_show_request_latency_by_route_quote_latency_and_database_gauges(
    client: Client, token_client
) -> None:
    offline = make_cluster(operator=OperatorFactory(slug="ctyun", name="China Telecom Cloud"))
    Cluster.objects.filter(pk=offline.pk).update(status=ClusterStatus.OFFLINE)
    api = token_client(BuyerFactory(slug="acme", name="Acme AI"))
    job = api.post("/api/v1/jobs", body(), format="json").json()
    assert api.post(f"/api/v1/jobs/{job['id']}/quotes", {}, format="json").status_code in (200, 201)
    client.get("/healthz")

    text = client.get("/metrics").content.decode()

    assert 'cardhour_http_request_duration_seconds_count{method="GET",route="/healthz",status="2xx"}' in text
    assert 'route="/api/v1/jobs/<int:job_id>/quotes"' in text
    assert float(re.search(r"^cardhour_quote_duration_seconds_count (\S+)$", text, re.M).group(1)) >= 1  # type: ignore[union-attr]
    assert "cardhour_clusters_offline 1.0" in text
    assert "cardhour_usage_unrated_records 0.0" in text
    assert "cardhour_lease_events_pending 0.0" in text


def test_metrics_show_the_messages_waiting_in_each_celery_queue_on_the_broker(client: Client) -> None:
    """Read from the configured broker (memory here; Redis in CI): three messages published to a queue of the
    settings show as 3, a queue nobody declared as 0, and the scrape creates no queue."""
    from kombu import Exchange, Producer, Queue

    tag = uuid.uuid4().hex[:8]
    busy = Queue(
        f"depth-busy-{tag}", Exchange(f"depth-busy-{tag}", type="direct"), routing_key=f"depth-busy-{tag}"
    )
    never = Queue(
        f"depth-never-{tag}", Exchange(f"depth-never-{tag}", type="direct"), routing_key=f"depth-never-{tag}"
    )
    with celery_app.connection_for_write() as connection:
        channel = connection.channel()
        try:
            producer = Producer(channel, exchange=busy.exchange, routing_key=busy.routing_key)
            for n in range(3):
                producer.publish({"n": n}, declare=[busy], serializer="json")
            with override_settings(CELERY_TASK_QUEUES=(busy, never)):
                text = client.get("/metrics").content.decode()
            assert f'cardhour_celery_queue_messages{{queue="{busy.name}"}} 3.0' in text
            assert f'cardhour_celery_queue_messages{{queue="{never.name}"}} 0.0' in text
            assert "cardhour_metrics_source_failed" not in text
            never_channel = connection.channel()
            with pytest.raises(connection.channel_errors):  # still not declared
                never_channel.queue_declare(queue=never.name, passive=True)
        finally:
            busy(connection.channel()).delete()


def test_an_unreachable_broker_fails_the_queue_gauge_alone(client: Client) -> None:
    before = celery_app.conf.broker_read_url  # what the gauge reads through
    celery_app.conf.broker_read_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        text = client.get("/metrics").content.decode()
    finally:
        celery_app.conf.broker_read_url = before
    assert 'cardhour_metrics_source_failed{source="celery"} 1.0' in text
    assert "cardhour_clusters_offline" in text  # the database's gauges are still there


def test_quote_latency_is_observed_per_quote(token_client) -> None:
    api = token_client(BuyerFactory(slug="acme", name="Acme AI"))
    job = api.post("/api/v1/jobs", body(), format="json").json()
    before = observability.QUOTE_SECONDS._sum.get()  # type: ignore[attr-defined]
    count = _quote_count()
    api.post(f"/api/v1/jobs/{job['id']}/quotes", {}, format="json")
    assert _quote_count() == count + 1
    assert observability.QUOTE_SECONDS._sum.get() > before  # type: ignore[attr-defined]


def _quote_count() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("cardhour_quote_duration_seconds_count") or 0.0


def test_metrics_are_not_served_to_other_addresses_without_the_token(client: Client) -> None:
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 404
    with override_settings(CARDHOUR_METRICS_TOKEN="s3cret-scrape"):
        assert (
            client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer wrong").status_code
            == 404
        )
        allowed = client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer s3cret-scrape")
    assert allowed.status_code == 200 and b"cardhour_clusters_offline" in allowed.content


# --- Probes ------------------------------------------------------------------------------------------------


def test_livez_answers_without_the_database(client: Client, django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        assert client.get("/livez").json() == {"status": "ok"}


def test_readyz_fails_while_beat_has_never_run_and_when_it_stops(client: Client) -> None:
    TaskRun.objects.all().delete()  # a worker of an earlier test may have noted a run after its flush
    if not PeriodicTask.objects.filter(enabled=True, interval__isnull=False).exists():
        # A transactional test flushed the schedules the migrations seed: put one back, as beat has it.
        every_5s, _ = IntervalSchedule.objects.get_or_create(every=5, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(
            name="Broker: fail over offline clusters", task="broker.leases_fail_over", interval=every_5s
        )
    never = client.get("/readyz")
    assert never.status_code == 503 and never.json()["checks"]["beat"] == "never ran"
    fastest = never.json()["checks"]["beat_task"]
    interval = never.json()["checks"]["beat_interval_seconds"]

    TaskRun.objects.create(name=fastest, last_started_at=timezone.now())
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {
        **ready.json()["checks"],
        "database": "ok",
        "beat": "ok",
    }

    TaskRun.objects.filter(name=fastest).update(
        last_started_at=timezone.now() - timedelta(seconds=interval * 7)
    )
    stale = client.get("/readyz")
    assert stale.status_code == 503 and stale.json()["checks"]["beat"] == "stale"

    with override_settings(CARDHOUR_READYZ_BEAT_INTERVALS=0):
        assert client.get("/readyz").status_code == 200
