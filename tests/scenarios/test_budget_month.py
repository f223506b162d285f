"""A month of budgets, with time pinned (every service is given its ``now``): a buyer's organisation budget
of 100 CNY with alerts at 50/80/100 % and a member's budget, usage rated day by day through March 2026 in
the billing zone — each threshold alerts once (notice, e-mail, signed webhook), none is repeated however
often the evaluation runs, April starts afresh, and the budget's "spent" is the usage page's figure for the
month to the fen. Spend is arrears at the operator's list price on a flat tariff, so each card-hour is
exactly 10 CNY (checked independently of rating)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core import mail
from django.db import transaction

from broker.budgets import selectors as budget_selectors
from broker.budgets.models import BudgetAlert, BudgetScope, DeliveryStatus
from broker.budgets.services import (
    BudgetInput,
    budget_alerts_deliver_due,
    budget_create,
    budgets_evaluate,
    buyer_endpoint_secret_rotate,
    buyer_endpoint_set,
)
from broker.models import BuyerNotice, Lease
from broker.services.leases import lease_create
from core.models import Membership, Organisation
from core.types import Actor
from federation.models import Cluster
from metering.selectors.usage_dashboard import UsagePeriod, usage_spend_lines
from metering.services.rating import usage_rate_pending
from metering.services.usage import usage_record_create_batch
from metering.types import UsageRecordInput
from tests.broker.factories import make_job
from tests.factories import BuyerFactory, MembershipFactory, OperatorFactory, UserFactory, make_cluster
from tests.metering.factories import make_price_card

pytestmark = pytest.mark.django_db

SHANGHAI = ZoneInfo("Asia/Shanghai")
RATE = Decimal("10.0000")  # CNY per card-hour, flat tariff: one card-hour of arrears is 10 CNY of spend


def sh(day: int, hour: int, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=SHANGHAI)


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    _Receiver.received = []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/budget", _Receiver.received
    server.shutdown()
    server.server_close()


@pytest.fixture
def world(presets: None) -> dict[str, Any]:
    operator = OperatorFactory(slug="ctyun")
    cluster = make_cluster(operator=operator, hub="yrd", name="sh-ai01", islands=[("isl-01", 64)])
    make_price_card(cluster=cluster, rate=str(RATE), tariff_code="flat")
    buyer = BuyerFactory(slug="acme")
    owner = UserFactory(username="olga", email="olga@acme.example")
    member = UserFactory(username="mike", email="mike@acme.example")
    MembershipFactory(organisation=buyer, user=owner, role=Membership.Role.OWNER)
    MembershipFactory(organisation=buyer, user=member, role=Membership.Role.MEMBER)
    return {"operator": operator, "cluster": cluster, "buyer": buyer, "owner": owner, "member": member}


@pytest.fixture
def presets(db: None) -> None:
    from metering.services.tariffs import tariff_presets_install

    tariff_presets_install()


def lease_by(member: Any, buyer: Organisation, cluster: Cluster) -> Lease:
    """A lease over all of March accepted by ``member`` (its origin is what a member's budget counts)."""
    job = make_job(buyer=buyer, earliest_start_at=sh(1, 0), deadline_at=sh(1, 0, month=4))
    with transaction.atomic():
        return lease_create(
            job=job,
            cluster_id=cluster.pk,
            allocation=[(cluster.islands.get().pk, 1)],
            start_at=sh(1, 0),
            end_at=sh(1, 0, month=4),
            price_card_id=cluster.price_cards.get().pk,
            expected_cost=Decimal("0.00"),
            expected_draw=Decimal(0),
            draw_class=cluster.accelerator.slug,
            standard_card_factor=None,
            actor=Actor(organisation=buyer, user=member),
            check_balance=False,
        )


def use(world: dict[str, Any], lease: Lease, day: int, card_hours: int) -> None:
    """``card_hours`` of one card on ``day`` (from 09:00 local), reported that evening and rated."""
    start = sh(day, 9)
    now = sh(day, 20)
    record = UsageRecordInput(
        idempotency_key=f"use-{day}",
        cluster=world["cluster"].cpi,
        buyer="acme",
        cards=1,
        start_at=start,
        end_at=start + timedelta(hours=card_hours),
        price_card_version=1,  # the lease's locked card (written today, so not in force in March)
        reference=lease.reference,
    )
    result = usage_record_create_batch(operator=world["operator"], records=[record], now=now)
    assert result.created == 1, result
    assert usage_rate_pending(now=now) == 1


def status_of(buyer: Organisation, at: datetime) -> dict[str, budget_selectors.BudgetStatus]:
    return {s.budget.scope: s for s in budget_selectors.budget_status_list_for(buyer=buyer, at=at)}


def test_a_month_crosses_50_80_and_100_percent_once_each(
    world: dict[str, Any], receiver: tuple[str, list[tuple[dict[str, str], bytes]]]
) -> None:
    buyer, owner, member = world["buyer"], world["owner"], world["member"]
    manager = Actor(organisation=buyer, user=owner)
    budget = budget_create(
        buyer=buyer,
        data=BudgetInput(name="Acme monthly", scope=BudgetScope.ORGANISATION, soft_amount=Decimal("100.00")),
        actor=manager,
    )
    assert budget.thresholds == [50, 80, 100]
    member_budget = budget_create(
        buyer=buyer,
        data=BudgetInput(
            name="Mike",
            scope=BudgetScope.MEMBER,
            user_id=member.pk,
            soft_amount=Decimal("200"),
            thresholds=[25],
        ),
        actor=manager,
    )
    url, received = receiver
    buyer_endpoint_set(buyer=buyer, url=url, actor=manager)
    secret = buyer_endpoint_secret_rotate(buyer=buyer, actor=manager).secret

    lease = lease_by(member, buyer, world["cluster"])
    # Day by day: (day, card-hours that day, total CNY spent after it, alerts expected after it).
    days = [
        (2, 2, 20, []),
        (3, 3, 50, [50]),
        (4, 2, 70, []),
        (9, 1, 80, [80]),
        (12, 1, 90, []),
        (20, 3, 120, [100]),
    ]
    spent_total = Decimal(0)
    raised: list[int] = []
    for day, hours, total, expected in days:
        use(world, lease, day, hours)
        spent_total += hours * RATE
        assert spent_total == total  # the independent figure: card-hours × 10 CNY
        evening = sh(day, 21)
        for _ in range(3):  # the beat runs again and again: nothing is repeated
            budgets_evaluate(now=evening)
        alerts = BudgetAlert.objects.filter(budget=budget).order_by("percent")
        assert [a.percent for a in alerts if a.percent not in raised] == expected
        raised = [a.percent for a in alerts]
        status = status_of(buyer, evening)
        assert status["organisation"].spent == Decimal(total)
        assert status["member"].spent == Decimal(total)  # every lease here was accepted by Mike
        budget_alerts_deliver_due(now=evening)

    alerts = list(BudgetAlert.objects.filter(budget=budget).order_by("percent"))
    assert [(a.percent, a.period_key, a.spent) for a in alerts] == [
        (50, "2026-03", Decimal("50.00")),
        (80, "2026-03", Decimal("80.00")),
        (100, "2026-03", Decimal("120.00")),
    ]
    assert all(a.email_status == a.webhook_status == DeliveryStatus.DELIVERED for a in alerts)
    (member_alert,) = BudgetAlert.objects.filter(budget=member_budget)
    assert (member_alert.percent, member_alert.spent) == (25, Decimal("50.00"))

    # One portal notice per alert, in the order they were raised.
    notices = list(
        BuyerNotice.objects.filter(buyer=buyer, kind="budget_threshold").order_by("created_at", "id")
    )
    assert [n.message for n in notices] == [
        "Budget “Acme monthly” crossed 50 % of its 100.00 CNY soft budget for 2026-03: 50.00 CNY spent.",
        "Budget “Mike” crossed 25 % of its 200.00 CNY soft budget for 2026-03: 50.00 CNY spent.",
        "Budget “Acme monthly” crossed 80 % of its 100.00 CNY soft budget for 2026-03: 80.00 CNY spent.",
        "Budget “Acme monthly” crossed 100 % of its 100.00 CNY soft budget for 2026-03: 120.00 CNY spent.",
    ]
    # One e-mail per alert, to the owner (and Mike for his own budget); never a second one.
    assert len(mail.outbox) == 4
    assert [m.to for m in mail.outbox] == [
        ["olga@acme.example"],
        ["mike@acme.example", "olga@acme.example"],
        ["olga@acme.example"],
        ["olga@acme.example"],
    ]
    # One signed POST per alert.
    assert len(received) == 4
    for headers, body in received:
        expected_signature = hmac.new(
            secret.encode(), headers["X-Cardhour-Timestamp"].encode() + b"." + body, hashlib.sha256
        ).hexdigest()
        assert headers["X-Cardhour-Signature"] == f"sha256={expected_signature}"
    documents = [json.loads(body) for _, body in received]
    assert [(d["type"], d["percent"], d["spent"], d["period"]) for d in documents] == [
        ("budget.threshold", 50, "50.00", "2026-03"),
        ("budget.threshold", 25, "50.00", "2026-03"),
        ("budget.threshold", 80, "80.00", "2026-03"),
        ("budget.threshold", 100, "120.00", "2026-03"),
    ]
    budget_alerts_deliver_due(now=sh(31, 23))
    assert len(mail.outbox) == 4 and len(received) == 4

    # The budget's figure is the usage page's for the month, to the fen (one definition of spend).
    period = UsagePeriod(start_date=date(2026, 3, 1), end_date=date(2026, 3, 31))
    page_total = sum((line.spend for line in usage_spend_lines(buyer=buyer, period=period)), Decimal("0.00"))
    assert status_of(buyer, sh(31, 23))["organisation"].spent == page_total == Decimal("120.00")

    # April is a new period: nothing spent, nothing alerted, March's alerts untouched.
    assert budgets_evaluate(now=sh(2, 12, month=4)) == 0
    assert status_of(buyer, sh(2, 12, month=4))["organisation"].spent == Decimal("0.00")
    assert BudgetAlert.objects.count() == 4


def test_a_hold_shrinks_as_usage_is_posted_and_is_voided_when_the_lease_ends(world: dict[str, Any]) -> None:
    """TigerBeetle's pending transfer: 100 CNY held at acceptance, 30 CNY posted by rating leaves 70 held;
    the lease's end voids the rest, and what was posted stays spent."""
    from broker.budgets.models import BudgetHold
    from broker.models import LeaseState
    from broker.services.leases import lease_lock, lease_transition

    buyer, owner = world["buyer"], world["owner"]
    budget_create(
        buyer=buyer,
        data=BudgetInput(name="cap", scope=BudgetScope.ORGANISATION, hard_cap=Decimal("1000")),
        actor=Actor(organisation=buyer, user=owner),
    )
    job = make_job(buyer=buyer, earliest_start_at=sh(1, 0), deadline_at=sh(1, 0, month=4))
    cluster = world["cluster"]
    with transaction.atomic():
        lease = lease_create(
            job=job,
            cluster_id=cluster.pk,
            allocation=[(cluster.islands.get().pk, 1)],
            start_at=sh(1, 0),
            end_at=sh(1, 0, month=4),
            price_card_id=cluster.price_cards.get().pk,
            expected_cost=Decimal("100.00"),
            expected_draw=Decimal(0),
            draw_class=cluster.accelerator.slug,
            standard_card_factor=None,
            actor=Actor(organisation=buyer, user=owner),
            check_balance=False,
        )
    march = sh(10, 12)
    assert (status_of(buyer, march)["organisation"].spent, status_of(buyer, march)["organisation"].held) == (
        Decimal("0.00"),
        Decimal("100.00"),
    )
    use(world, lease, 5, 3)  # 3 card-hours: 30 CNY posted
    status = status_of(buyer, march)["organisation"]
    assert (status.spent, status.held, status.remaining) == (
        Decimal("30.00"),
        Decimal("70.00"),
        Decimal("900.00"),
    )
    with transaction.atomic():
        locked = lease_lock(lease_id=lease.pk)
        lease_transition(
            lease=locked, to_state=LeaseState.INTERRUPTED, actor=Actor.system("test"), at=sh(6, 0)
        )
    assert BudgetHold.objects.get(lease=lease).voided_at == sh(6, 0)
    status = status_of(buyer, march)["organisation"]
    assert (status.spent, status.held) == (Decimal("30.00"), Decimal("0.00"))


def test_a_failing_webhook_is_retried_with_backoff_and_the_email_is_not_sent_twice(
    world: dict[str, Any], receiver: tuple[str, list[tuple[dict[str, str], bytes]]], settings: Any
) -> None:
    buyer, owner = world["buyer"], world["owner"]
    manager = Actor(organisation=buyer, user=owner)
    budget_create(
        buyer=buyer,
        data=BudgetInput(
            name="Acme", scope=BudgetScope.ORGANISATION, soft_amount=Decimal("10"), thresholds=[100]
        ),
        actor=manager,
    )
    url, received = receiver
    buyer_endpoint_set(buyer=buyer, url=url, actor=manager)
    buyer_endpoint_secret_rotate(buyer=buyer, actor=manager)
    lease = lease_by(owner, buyer, world["cluster"])
    use(world, lease, 3, 1)
    assert budgets_evaluate(now=sh(3, 21)) == 1
    # The endpoint's address is refused at send time (the SSRF guard resolves and checks it again).
    settings.CARDHOUR_ENDPOINT_ALLOW_LOOPBACK = False
    assert budget_alerts_deliver_due(now=sh(3, 21)) == 0
    alert = BudgetAlert.objects.get()
    assert (alert.email_status, alert.webhook_status, alert.attempts) == (
        DeliveryStatus.DELIVERED,
        DeliveryStatus.PENDING,
        1,
    )
    assert alert.last_error.startswith("webhook: refused:") and "loopback" in alert.last_error
    assert alert.next_attempt_at == sh(3, 21) + timedelta(seconds=5)
    assert budget_alerts_deliver_due(now=sh(3, 21) + timedelta(seconds=4)) == 0  # not due yet
    assert BudgetAlert.objects.get().attempts == 1
    settings.CARDHOUR_ENDPOINT_ALLOW_LOOPBACK = True
    assert budget_alerts_deliver_due(now=sh(3, 21) + timedelta(seconds=5)) == 1
    alert.refresh_from_db()
    assert (alert.webhook_status, alert.attempts, alert.last_error) == (DeliveryStatus.DELIVERED, 2, "")
    assert len(mail.outbox) == 1 and len(received) == 1
