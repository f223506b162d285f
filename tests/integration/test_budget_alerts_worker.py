"""A real Celery worker evaluates budgets (the beat's ``broker.leases_stop_over_cap``) and, after that task's
commit, runs the ``broker.budget_alerts_deliver`` task it queued: the alert is e-mailed once, from the
worker, through the configured broker (memory:// locally, Redis in CI)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from celery.contrib.testing.worker import start_worker
from django.core import mail
from django.utils import timezone

from broker import tasks
from broker.budgets.models import BudgetAlert, DeliveryStatus
from broker.budgets.selectors import month_bounds, month_key
from broker.budgets.services import BudgetInput, budget_create
from config.celery_app import app as celery_app
from core.models import Membership
from core.types import Actor
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.celery_watch import TaskWatcher
from tests.factories import BuyerFactory, MembershipFactory, OperatorFactory, UserFactory, make_cluster
from tests.metering.factories import make_price_card

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TASK_TIMEOUT_SECONDS = 30


def test_the_worker_raises_an_alert_and_delivers_it_after_commit(task_watcher: TaskWatcher) -> None:
    from metering.services.tariffs import tariff_presets_install

    assert celery_app.conf.task_always_eager is False
    tariff_presets_install()
    operator = OperatorFactory(slug="ctyun")
    cluster = make_cluster(operator=operator, hub="yrd", name="sh-ai01", islands=[("isl-01", 8)])
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    buyer = BuyerFactory(slug="acme")
    owner = UserFactory(username="olga", email="olga@acme.example")
    MembershipFactory(organisation=buyer, user=owner, role=Membership.Role.OWNER)
    budget = budget_create(
        buyer=buyer,
        data=BudgetInput(
            name="Acme monthly", scope="organisation", soft_amount=Decimal("10.00"), thresholds=[1]
        ),
        actor=Actor(organisation=buyer, user=owner),
    )
    now = timezone.now().replace(microsecond=0)
    # A few card-minutes this month at 10 CNY/card-hour (at least 2: over 1 % of 10 CNY), however close to
    # the month's start the test runs (usage may end up to five minutes ahead of the clock).
    month_start, _ = month_bounds(key=month_key(at=now))
    start = max(now - timedelta(minutes=31), month_start)
    end = max(start + timedelta(minutes=2), min(start + timedelta(minutes=30), now))
    spent = (Decimal(int((end - start).total_seconds())) * 10 / 3600).quantize(Decimal("0.01"))
    record = UsageRecordInput("minutes", cluster.cpi, "acme", 1, start, end, 1)
    usage_record_create_batch(operator=operator, records=[record], now=now)
    assert usage_rate_pending(now=now) == 1

    with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        tasks.leases_stop_over_cap.delay()
        assert task_watcher.wait_named("broker.budget_alerts_deliver", 1, TASK_TIMEOUT_SECONDS), (
            f"tasks finished: {task_watcher.names()}"
        )

    assert task_watcher.names()[:2] == ["broker.leases_stop_over_cap", "broker.budget_alerts_deliver"]
    alert = BudgetAlert.objects.get(budget=budget)
    assert (alert.percent, alert.spent) == (1, spent)
    assert (alert.email_status, alert.webhook_status) == (DeliveryStatus.DELIVERED, DeliveryStatus.SKIPPED)
    assert [m.to for m in mail.outbox] == [["olga@acme.example"]]
    assert (
        f"crossed 1 % of its 10.00 CNY soft budget for {month_key(at=now)}: {spent} CNY"
        in mail.outbox[0].body
    )
