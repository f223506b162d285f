"""Enforcement on arrival (issue 16): usage that empties a buyer's packs stops its running lease when the
report is accepted — rated and stopped by the ``broker.usage_rate_on_arrival`` task queued on commit — not on
the minute's rating beat. Here the task runs eagerly, in the request's on-commit hook;
tests/integration/test_enforcement_worker.py runs it on a real worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from celery.signals import after_task_publish, task_prerun
from rest_framework.test import APIClient

from broker import tasks
from broker.models import BuyerNotice, Lease, LeaseState, LeaseTransition
from broker.services import dispatch, enforcement
from config.celery_app import app as celery_app
from core.models import Organisation
from core.types import Actor
from federation.models import Cluster
from metering.models import AccountKind, BuyerExhaustion, LedgerAccount, Pack, PriceCard, UsagePending
from metering.services.rating import usage_rate_pending
from tests.broker.conftest import A800
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory
from tests.metering.factories import make_paid_pack

pytestmark = pytest.mark.django_db

Client = Callable[[Organisation], APIClient]
SYSTEM = Actor.system("test")
USAGE = "/api/v1/operator/usage"
SHANGHAI = ZoneInfo("Asia/Shanghai")
TASK = "broker.usage_rate_on_arrival"
# Monday 2 March 2026, 14:00 in Shanghai. The lease runs from 12:00, in Guangdong's flat band (12–14,
# multiplier 1: 粤发改价格〔2021〕331号), so 8 A800 cards for 5 minutes draw 8 × 300 / 3600 = 0.666667
# card-hours of the buyer's single one.
NOW = datetime(2026, 3, 2, 14, 0, tzinfo=SHANGHAI)
LEASE_START = datetime(2026, 3, 2, 12, 0, tzinfo=SHANGHAI)
FIVE_MINUTES = timedelta(minutes=5)


@pytest.fixture
def arrival(settings: Any) -> Iterator[list[str]]:
    """Arrival rating on, the task run eagerly (its errors raised); yields the names of the tasks run."""
    settings.CARDHOUR_RATING_ON_ARRIVAL = True
    enforcement.usage_rating_request_clear()
    runs: list[str] = []

    def count(sender: Any = None, **kwargs: Any) -> None:
        runs.append(sender.name)

    task_prerun.connect(count, weak=False)
    eager, propagates = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
    celery_app.conf.task_always_eager = celery_app.conf.task_eager_propagates = True
    try:
        yield runs
    finally:
        celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = eager, propagates
        task_prerun.disconnect(count)
        enforcement.usage_rating_request_clear()


@pytest.fixture
def pinned() -> Iterator[datetime]:
    with mock.patch("django.utils.timezone.now", return_value=NOW):
        yield NOW


@pytest.fixture
def east(token_client: Client, east_operator: Organisation) -> APIClient:
    return token_client(east_operator)


def thin(buyer: Organisation, key: str = "tiny") -> Pack:
    """One A800 card-hour, bought three days before."""
    return make_paid_pack(
        buyer=buyer, accelerator=A800, card_hours=1, price="9.00", key=key, paid_at=NOW - timedelta(days=3)
    )


def running_lease(cluster: Cluster, buyer: Organisation, *, island: str = "isl-01") -> Lease:
    """8 cards over [12:00, 16:00), started at 12:00, at the price card in force then."""
    PriceCard.objects.filter(cluster=cluster).update(effective_from=NOW - timedelta(days=4))
    lease = make_lease(
        job=make_job(buyer=buyer, earliest_start_at=LEASE_START, deadline_at=NOW + timedelta(days=1)),
        cluster=cluster,
        start_at=LEASE_START,
        end_at=LEASE_START + timedelta(hours=4),
        island=island,
    )
    return dispatch.lease_start(operator=lease.operator, lease_id=lease.pk, actor=SYSTEM, at=LEASE_START)


def report(client: APIClient, lease: Lease, key: str, start: datetime, *, capture: Any) -> None:
    """Report 5 minutes of the lease's cards from ``start``, its on-commit hooks run as after a commit."""
    record = {
        "lease": lease.pk,
        "idempotency_key": key,
        "start_at": start.isoformat(),
        "end_at": (start + FIVE_MINUTES).isoformat(),
        "cards": lease.cards,
    }
    with capture(execute=True):
        response = client.post(USAGE, {"records": [record]}, format="json")
    assert response.status_code == 201, response.content


def pack_balance(pack: Pack) -> int:
    """Micro card-hours left."""
    return LedgerAccount.objects.get(kind=AccountKind.PACK, pack=pack).balance


def test_usage_that_empties_the_packs_stops_the_running_lease_when_it_is_accepted(
    pinned: datetime,
    arrival: list[str],
    east: APIClient,
    buyer: Organisation,
    east_cluster: Cluster,
    django_capture_on_commit_callbacks: Any,
) -> None:
    pack = thin(buyer)
    lease = running_lease(east_cluster, buyer)

    # 12:00–12:05 draws two thirds of the pack, rated on arrival: the lease runs on.
    report(east, lease, "first", LEASE_START, capture=django_capture_on_commit_callbacks)
    assert arrival == [TASK]
    assert not UsagePending.objects.exists()
    assert pack_balance(pack) == 1_000_000 - 666_667
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RUNNING
    assert not BuyerExhaustion.objects.exists()

    # 12:05–12:10 needs another 0.666667: the pack empties, the rest is arrears, and the same run that
    # rated it asks the operator to stop the lease — no minute's rating, no 10 s stop run.
    report(east, lease, "second", LEASE_START + FIVE_MINUTES, capture=django_capture_on_commit_callbacks)
    assert arrival == [TASK, TASK]
    assert not UsagePending.objects.exists()
    # The pack pays for the whole card-seconds it covers (1,199 of 2,400: 333,056 micro card-hours); the
    # 277 left cannot pay for one more (277.8 each), so it counts as empty.
    assert pack_balance(pack) == 333_333 - 333_056 == 277
    flag = BuyerExhaustion.objects.get()
    assert (flag.buyer_id, flag.pack_class, flag.raised_at, flag.cleared_at) == (buyer.pk, A800, NOW, None)

    lease.refresh_from_db()
    assert (lease.state, lease.stop_requested_at) == (LeaseState.STOP_REQUESTED, NOW)
    assert lease.reason == f"packs exhausted: no {A800} or standard card-hours left"
    transition = LeaseTransition.objects.filter(lease=lease).latest("id")
    assert (transition.from_state, transition.to_state, transition.at, transition.actor_label) == (
        "running",
        "stop_requested",
        NOW,
        "broker: packs exhausted",
    )
    notice = BuyerNotice.objects.get()
    assert (notice.buyer_id, notice.kind, notice.lease_id) == (buyer.pk, "packs_exhausted", lease.pk)

    # The operator's agent sees the request in its feed.
    pulled = east.get("/api/v1/operator/leases", {"state": "stop_requested"}).json()["results"]
    assert [(item["id"], item["state"], item["stop_requested_at"]) for item in pulled] == [
        (lease.pk, "stop_requested", NOW.isoformat())
    ]
    # A replay of the report stores nothing, queues nothing and changes nothing.
    report_again = east.post(
        USAGE,
        {
            "records": [
                {
                    "lease": lease.pk,
                    "idempotency_key": "second",
                    "start_at": (LEASE_START + FIVE_MINUTES).isoformat(),
                    "end_at": (LEASE_START + 2 * FIVE_MINUTES).isoformat(),
                    "cards": lease.cards,
                }
            ]
        },
        format="json",
    )
    assert report_again.status_code == 200
    assert arrival == [TASK, TASK]
    # The safety net finds nothing left to do.
    assert tasks.leases_stop_exhausted() == 0
    assert BuyerNotice.objects.count() == 1


def test_reports_while_a_run_is_waiting_queue_no_other_run(
    pinned: datetime,
    arrival: list[str],
    east: APIClient,
    buyer: Organisation,
    east_cluster: Cluster,
    django_capture_on_commit_callbacks: Any,
) -> None:
    thin(buyer)
    lease = running_lease(east_cluster, buyer)
    assert enforcement.usage_rating_request_mark()  # a run is queued and has not started yet

    report(east, lease, "first", LEASE_START, capture=django_capture_on_commit_callbacks)
    report(east, lease, "second", LEASE_START + FIVE_MINUTES, capture=django_capture_on_commit_callbacks)
    assert arrival == []
    assert UsagePending.objects.count() == 2  # left to the waiting run

    # The waiting run starts: it rates both reports and stops the lease, and clears the marker so that
    # the next report queues a run again.
    assert tasks.usage_rate_on_arrival.apply().get() == 1
    assert not UsagePending.objects.exists()
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.STOP_REQUESTED
    report(east, lease, "late", LEASE_START + 2 * FIVE_MINUTES, capture=django_capture_on_commit_callbacks)
    assert arrival == [TASK, TASK]


def test_a_burst_publishes_one_message_on_the_broker(
    settings: Any,
    east: APIClient,
    funded_buyer: Organisation,
    east_cluster: Cluster,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Not eager: the task is published on the configured broker (memory:// here, Redis in CI), once for
    three reports; the message is purged afterwards."""
    settings.CARDHOUR_RATING_ON_ARRIVAL = True
    enforcement.usage_rating_request_clear()
    assert celery_app.conf.task_always_eager is False
    lease = running_lease_now(east_cluster, funded_buyer)
    published: list[str] = []

    def on_publish(sender: Any = None, **kwargs: Any) -> None:
        published.append(sender)

    after_task_publish.connect(on_publish, weak=False)
    try:
        for n in range(3):
            start = lease.start_at + n * FIVE_MINUTES
            with django_capture_on_commit_callbacks(execute=True):
                response = east.post(
                    USAGE,
                    {
                        "records": [
                            {
                                "lease": lease.pk,
                                "idempotency_key": f"burst-{n}",
                                "start_at": start.isoformat(),
                                "end_at": (start + FIVE_MINUTES).isoformat(),
                                "cards": lease.cards,
                            }
                        ]
                    },
                    format="json",
                )
            assert response.status_code == 201
    finally:
        after_task_publish.disconnect(on_publish)
        celery_app.control.purge()
        enforcement.usage_rating_request_clear()
    assert published == [TASK]
    assert UsagePending.objects.count() == 3


def running_lease_now(cluster: Cluster, buyer: Organisation) -> Lease:
    """A lease started an hour ago (real time), for tests that do not pin the clock."""
    from django.utils import timezone

    start = timezone.now().replace(microsecond=0) - timedelta(hours=1)
    PriceCard.objects.filter(cluster=cluster).update(effective_from=start - timedelta(days=1))
    lease = make_lease(
        job=make_job(buyer=buyer), cluster=cluster, start_at=start, end_at=start + timedelta(hours=3)
    )
    return dispatch.lease_start(operator=lease.operator, lease_id=lease.pk, actor=SYSTEM, at=start)


def test_arrival_rating_turned_off_leaves_usage_to_the_minute(
    pinned: datetime,
    arrival: list[str],
    settings: Any,
    east: APIClient,
    buyer: Organisation,
    east_cluster: Cluster,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.CARDHOUR_RATING_ON_ARRIVAL = False
    thin(buyer)
    lease = running_lease(east_cluster, buyer)
    report(east, lease, "first", LEASE_START, capture=django_capture_on_commit_callbacks)
    report(east, lease, "second", LEASE_START + FIVE_MINUTES, capture=django_capture_on_commit_callbacks)

    assert arrival == []
    assert UsagePending.objects.count() == 2
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RUNNING
    assert enforcement.usage_rating_request_mark()  # no marker was left behind


def test_stopping_what_is_flagged_can_be_limited_to_some_buyers(
    pinned: datetime,
    east: APIClient,
    buyer: Organisation,
    east_cluster: Cluster,
    django_capture_on_commit_callbacks: Any,
) -> None:
    other = BuyerFactory(slug="beta", name="Beta Labs")
    thin(buyer)
    thin(other, key="beta")
    mine = running_lease(east_cluster, buyer)
    theirs = running_lease(east_cluster, other, island="isl-02")
    for lease in (mine, theirs):
        report(east, lease, f"{lease.pk}-a", LEASE_START, capture=django_capture_on_commit_callbacks)
        report(
            east,
            lease,
            f"{lease.pk}-b",
            LEASE_START + FIVE_MINUTES,
            capture=django_capture_on_commit_callbacks,
        )
    assert usage_rate_pending() == 4  # arrival rating is off here (the test settings' default)
    assert BuyerExhaustion.objects.count() == 2

    assert dispatch.leases_stop_flagged(buyer_ids=[other.pk]) == 1
    assert dict(Lease.objects.values_list("pk", "state")) == {
        mine.pk: LeaseState.RUNNING,
        theirs.pk: LeaseState.STOP_REQUESTED,
    }
    assert dispatch.leases_stop_flagged() == 1
    assert Lease.objects.get(pk=mine.pk).state == LeaseState.STOP_REQUESTED


def test_usage_that_reaches_a_hard_cap_stops_the_running_lease_when_it_is_accepted(
    pinned: datetime,
    arrival: list[str],
    east: APIClient,
    buyer: Organisation,
    east_cluster: Cluster,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The same arrival run that rates a report evaluates the buyer's budgets: posted spend reaching the
    organisation's hard cap stops its running lease at once (packs are plentiful: not an exhaustion)."""
    from broker.budgets.models import BudgetBreach
    from broker.budgets.selectors import budget_statuses
    from tests.broker.test_budgets import cap

    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=100, price="900.00", key="big", paid_at=NOW)
    lease = running_lease(east_cluster, buyer)
    report(east, lease, "first", LEASE_START, capture=django_capture_on_commit_callbacks)
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.RUNNING
    budget = cap(buyer, "1000.00")
    (status,) = budget_statuses(buyer_id=buyer.pk, budgets=[budget], at=NOW)
    first_spend = status.spent
    assert first_spend > 0
    # A cap a fen above what is spent: the next five minutes (the same spend again) reach it.
    budget.hard_cap = first_spend + Decimal("0.01")
    budget.save(update_fields=["hard_cap"])

    report(east, lease, "second", LEASE_START + FIVE_MINUTES, capture=django_capture_on_commit_callbacks)
    assert arrival == [TASK, TASK, "broker.budget_alerts_deliver"]  # the cap's alert goes out after commit
    lease.refresh_from_db()
    assert (lease.state, lease.stop_requested_at) == (LeaseState.STOP_REQUESTED, NOW)
    assert lease.reason.startswith(f"budget cap reached: budget {budget.pk} (organisation) at ")
    breach = BudgetBreach.objects.get()
    assert (breach.spent, breach.cap) == (2 * first_spend, first_spend + Decimal("0.01"))
    assert not BuyerExhaustion.objects.exists()
    pulled = east.get("/api/v1/operator/leases", {"state": "stop_requested"}).json()["results"]
    assert [item["id"] for item in pulled] == [lease.pk]
    # The 10 s safety net finds nothing left to stop.
    assert tasks.leases_stop_over_cap() == 0


def test_a_standard_pack_that_cannot_pay_for_the_chip_does_not_keep_the_lease_running(
    pinned: datetime,
    arrival: list[str],
    east: APIClient,
    east_operator: Organisation,
    buyer: Organisation,
    presets: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Hygon's DCU K100 has no published dense FP16 figure, so no standard-card factor: a standard pack cannot
    pay for it, and usage on it is arrears at once — the buyer is flagged and the lease stopped, however
    many standard card-hours it holds."""
    from tests.factories import make_cluster
    from tests.metering.factories import make_price_card

    cluster = make_cluster(
        operator=east_operator,
        hub="yrd",
        name="sh-dcu",
        accelerator="hygon-dcu-k100",
        islands=[("isl-01", 8)],
    )
    make_price_card(cluster=cluster, rate="6.0000", tariff_code="cn-gd")
    standard = make_paid_pack(
        buyer=buyer, card_hours=1000, price="12000.00", key="std", paid_at=NOW - timedelta(days=3)
    )
    lease = running_lease(cluster, buyer)

    report(east, lease, "first", LEASE_START, capture=django_capture_on_commit_callbacks)

    assert arrival == [TASK]
    assert pack_balance(standard) == 1000 * 1_000_000  # not drawn: it cannot pay for this chip
    flag = BuyerExhaustion.objects.get()
    assert (flag.buyer_id, flag.pack_class, flag.shortfall) == (buyer.pk, "hygon-dcu-k100", 666_667)
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.STOP_REQUESTED


def test_a_run_over_its_time_budget_hands_the_rest_to_the_next_run_at_once(
    settings: Any,
    pinned: datetime,
    arrival: list[str],
    east: APIClient,
    buyer: Organisation,
    east_cluster: Cluster,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Behind a backlog a run rates for CARDHOUR_RATING_RUN_SECONDS (0 here: one batch of one record), stops
    the leases its records flagged, and queues the next run itself rather than wait for a report or the
    minute's beat: three records take four runs (the last finds nothing), and the lease is stopped."""
    settings.CARDHOUR_RATING_RUN_SECONDS = 0
    settings.CARDHOUR_RATING_BATCH_SIZE = 1
    thin(buyer)
    lease = running_lease(east_cluster, buyer)
    records = [
        {
            "lease": lease.pk,
            "idempotency_key": f"backlog-{n}",
            "start_at": (LEASE_START + n * FIVE_MINUTES).isoformat(),
            "end_at": (LEASE_START + (n + 1) * FIVE_MINUTES).isoformat(),
            "cards": lease.cards,
        }
        for n in range(3)
    ]
    with django_capture_on_commit_callbacks(execute=True):
        response = east.post(USAGE, {"records": records}, format="json")
    assert response.status_code == 201, response.content
    assert arrival == [TASK] * 4
    assert not UsagePending.objects.exists()
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.STOP_REQUESTED
