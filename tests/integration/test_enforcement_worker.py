"""A real Celery worker enforces on arrival: usage reported through the operator API that empties the buyer's
packs is rated by the ``broker.usage_rate_on_arrival`` task the report queued on commit — published on the
configured broker (memory:// locally, Redis in CI), run by a worker with its own database connection — and the
lease is asked to stop, with no rating beat and no stop beat running.

The delay measured (the report's answer → the run that committed the stop request) is printed, not asserted:
benchmarks/enforcement.py measures it on the production stack.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from broker.models import BuyerNotice, Lease, LeaseState
from broker.services import dispatch, enforcement
from config.celery_app import app as celery_app
from core.services import api_token_create
from core.types import Actor
from metering.models import BuyerExhaustion, PriceCard, UsagePending
from tests.broker.factories import make_job, make_lease
from tests.celery_watch import TaskWatcher, worker_pool
from tests.factories import BuyerFactory, OperatorFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

A800 = "nvidia-a800-sxm4-80gb"
TASK = "broker.usage_rate_on_arrival"
TASK_TIMEOUT_SECONDS = 30


@pytest.fixture
def rating_on_arrival(settings: Any) -> Iterator[None]:
    settings.CARDHOUR_RATING_ON_ARRIVAL = True
    enforcement.usage_rating_request_clear()
    try:
        yield
    finally:
        enforcement.usage_rating_request_clear()


def test_a_worker_stops_the_lease_of_a_buyer_whose_packs_a_report_empties(
    rating_on_arrival: None, task_watcher: TaskWatcher
) -> None:
    assert celery_app.conf.task_always_eager is False
    from rest_framework.test import APIClient

    from metering.services.tariffs import tariff_presets_install

    tariff_presets_install()
    operator = OperatorFactory(slug="ctyun", name="China Telecom Cloud")
    cluster = make_cluster(
        operator=operator, hub="yrd", name="sh-ai01", islands=[("isl-01", 8)], site="Shanghai"
    )
    make_price_card(cluster=cluster, rate="12.0000", tariff_code="cn-gd")
    now = timezone.now().replace(microsecond=0)
    PriceCard.objects.update(effective_from=now - timedelta(days=1))
    buyer = BuyerFactory(slug="acme", name="Acme AI")
    make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=1, price="9.00", key="tiny", paid_at=now - timedelta(days=1)
    )
    start = now - timedelta(hours=2)
    reserved = make_lease(
        job=make_job(buyer=buyer), cluster=cluster, start_at=start, end_at=start + timedelta(hours=4)
    )
    lease = dispatch.lease_start(
        operator=operator, lease_id=reserved.pk, actor=Actor.system("test"), at=start
    )
    _, secret = api_token_create(organisation=operator, name="agent")
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    # An hour of 8 cards: at least 3 A800 card-hours in any band, against a pack of 1.
    body = {
        "records": [
            {
                "lease": lease.pk,
                "idempotency_key": "hour",
                "start_at": start.isoformat(),
                "end_at": (start + timedelta(hours=1)).isoformat(),
                "cards": 8,
            }
        ]
    }
    celery_app.control.purge()  # nothing left over from another test's broker
    with start_worker(
        celery_app, pool=worker_pool(), concurrency=1, perform_ping_check=False, shutdown_timeout=30
    ):
        response = agent.post("/api/v1/operator/usage", body, format="json")
        answered_at = time.monotonic()
        assert response.status_code == 201, response.content
        # The report committed (no transaction around a request here) and queued the run on the broker.
        assert task_watcher.wait_named(TASK, 1, TASK_TIMEOUT_SECONDS), "the worker never ran the arrival task"

    print(
        f"\nenforcement on arrival: {task_watcher.named(TASK)[0].finished_at - answered_at:.3f} s from the report's 201 to "
        "the end of the worker's run that asked the lease to stop"
    )
    assert [run.retval for run in task_watcher.named(TASK)] == [1]
    lease.refresh_from_db()
    assert lease.state == LeaseState.STOP_REQUESTED
    assert lease.reason == f"packs exhausted: no {A800} or standard card-hours left"
    assert not UsagePending.objects.exists()
    assert BuyerExhaustion.objects.filter(buyer=buyer, pack_class=A800, cleared_at__isnull=True).count() == 1
    assert list(BuyerNotice.objects.values_list("lease_id", "kind")) == [(lease.pk, "packs_exhausted")]
    pulled = agent.get("/api/v1/operator/leases", {"state": "stop_requested"}).json()["results"]
    assert [item["id"] for item in pulled] == [lease.pk]
    assert Lease.objects.filter(state=LeaseState.RUNNING).count() == 0
