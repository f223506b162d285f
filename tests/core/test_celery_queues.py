"""Every task has a queue chosen for it, and the safety work has a queue of its own (config/settings/base.py:
CELERY_TASK_ROUTES). A design-load soak showed why: behind minute-long rating runs the heartbeat monitor's
and failover's runs expired in a shared queue, and silent clusters were never taken offline."""

from __future__ import annotations

from django.conf import settings

from config.celery_app import app as celery_app

CONTROL = "control"
RATING = "rating"
DEFAULT = "celery"


def _registered() -> set[str]:
    """The platform's tasks (Celery's own, and the test apps' shared ones, aside)."""
    celery_app.loader.import_default_modules()
    return {
        name
        for name in celery_app.tasks
        if name.split(".")[0] in {"core", "federation", "metering", "broker"}
    }


def test_every_task_is_routed_to_a_declared_queue() -> None:
    declared = {queue.name for queue in settings.CELERY_TASK_QUEUES}
    assert declared == {CONTROL, RATING, DEFAULT}
    unrouted = _registered() - set(settings.CELERY_TASK_ROUTES)
    assert not unrouted, f"choose a queue for {sorted(unrouted)} in CELERY_TASK_ROUTES"
    assert {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()} <= declared
    assert set(settings.CELERY_TASK_ROUTES) <= _registered(), "a route names a task that does not exist"


def test_the_safety_tasks_share_no_queue_with_rating_or_the_long_jobs() -> None:
    def queue_of(name: str) -> str:
        return celery_app.amqp.router.route({}, name)["queue"].name

    for name in (
        "federation.clusters_mark_missed_heartbeats",
        "broker.leases_fail_over",
        "broker.leases_stop_exhausted",
        "broker.leases_stop_over_cap",
        "broker.lease_events_deliver",
        "broker.budget_alerts_deliver",
    ):
        assert queue_of(name) == CONTROL, name
    for name in ("broker.usage_rate_on_arrival", "metering.usage_rate_pending"):
        assert queue_of(name) == RATING, name
    for name in ("metering.billing_close_previous_month", "metering.ledger_reconcile"):
        assert queue_of(name) == DEFAULT, name


def test_each_queue_has_its_own_exchange_and_key() -> None:
    """Queues declared by name alone are all bound to the default exchange under the default key: RabbitMQ
    would then copy every task into every queue, and each would run three times."""
    bindings = {(q.exchange.name, q.routing_key) for q in settings.CELERY_TASK_QUEUES}
    assert bindings == {(CONTROL, CONTROL), (RATING, RATING), (DEFAULT, DEFAULT)}
    assert celery_app.conf.task_default_queue == DEFAULT


def test_a_worker_started_without_queues_consumes_all_three() -> None:
    """Tests, benchmarks and a small deployment run one worker with no -Q: it must take every task."""
    assert set(celery_app.amqp.queues) == {CONTROL, RATING, DEFAULT}
