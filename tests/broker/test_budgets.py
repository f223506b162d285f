"""Budgets and caps: a hard cap refusing an acceptance (with the numbers, writing nothing), pending holds
placed at acceptance and voided at the lease's end, a running lease stopped once posted spend reaches a cap,
member and token scopes, and 64 parallel acceptances against one cap on PostgreSQL."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from decimal import ROUND_DOWN, Decimal

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from broker.budgets import selectors as budget_selectors
from broker.budgets.models import Budget, BudgetAlert, BudgetBreach, BudgetHold, BudgetScope, LeaseOrigin
from broker.budgets.services import BudgetInput, budget_create, budget_update
from broker.models import BuyerNotice, Lease, LeaseState, LeaseTransition
from broker.services import dispatch
from core.models import ApiToken, Membership, Organisation
from core.services import api_token_create
from core.types import Actor
from federation.models import Cluster
from metering.services.rating import usage_rate_pending
from tests.broker.conftest import A800
from tests.broker.factories import make_job, make_lease
from tests.broker.test_leases import quote, submit
from tests.factories import BuyerFactory, MembershipFactory, UserFactory, make_cluster
from tests.metering.factories import make_paid_pack, make_price_card

Client = Callable[..., APIClient]
SYSTEM = Actor.system("test")


def _owner(buyer: Organisation) -> Actor:
    """An owner of ``buyer`` (made on first use): who may set budgets."""
    membership = Membership.objects.filter(organisation=buyer, role=Membership.Role.OWNER).first()
    if membership is None:
        membership = MembershipFactory(
            organisation=buyer, user=UserFactory(username=f"owner-{buyer.slug}"), role=Membership.Role.OWNER
        )
    return Actor(organisation=buyer, user=membership.user)


def cap(
    buyer: Organisation,
    amount: Decimal | str,
    *,
    name: str = "cap",
    scope: str = "organisation",
    **target: int,
) -> Budget:
    """A budget with a hard cap of ``amount`` CNY, set by an owner."""
    return budget_create(
        buyer=buyer,
        data=BudgetInput(name=name, scope=scope, hard_cap=Decimal(amount), **target),
        actor=_owner(buyer),
    )


@pytest.mark.django_db
def test_a_hard_cap_refuses_an_acceptance_with_the_numbers_and_writes_nothing(
    funded_buyer: Organisation, east_cluster: Cluster, token_client: Client
) -> None:
    client = token_client(funded_buyer)
    first_job = submit(client)
    first = quote(client, first_job["id"])["quotes"][0]
    cost = Decimal(first["cost"])
    budget = cap(funded_buyer, cost - Decimal("0.01"), name="Acme monthly")
    response = client.post(f"/api/v1/quotes/{first['id']}/accept")
    assert response.status_code == 409, response.json()
    body = response.json()
    period = budget_selectors.month_key(at=timezone.now())
    assert body["code"] == "budget_cap_exceeded"
    assert body["extra"] == {
        "budget_id": budget.pk,
        "scope": "organisation",
        "period": period,
        "cap": str(cost - Decimal("0.01")),
        "spent": "0.00",
        "held": "0.00",
        "this_lease": str(cost),
    }
    assert str(cost) in body["message"] and "Acme monthly" in body["message"]
    assert Lease.objects.count() == BudgetHold.objects.count() == LeaseOrigin.objects.count() == 0

    # Room for one lease: it is accepted, and its expected cost is held against the cap. (A cap is in fen:
    # half as much again as the cost, rounded down, still fits one lease and not two.)
    one_lease = (cost * 3 / 2).quantize(Decimal("0.01"), rounding=ROUND_DOWN)
    budget_update(
        budget=budget,
        data=BudgetInput(name="Acme monthly", scope="organisation", hard_cap=one_lease),
        actor=_owner(funded_buyer),
    )
    response = client.post(f"/api/v1/quotes/{first['id']}/accept")
    assert response.status_code == 201, response.json()
    lease = Lease.objects.get()
    hold = BudgetHold.objects.get()
    assert (hold.lease_id, hold.amount, hold.voided_at, hold.period_key) == (lease.pk, cost, None, period)
    origin = LeaseOrigin.objects.get(lease=lease)
    assert origin.token_id == ApiToken.objects.get(organisation=funded_buyer).pk and origin.user_id is None
    (status,) = budget_selectors.budget_status_list_for(buyer=funded_buyer)
    assert (status.spent, status.held, status.remaining) == (Decimal("0.00"), cost, one_lease - cost)

    # A second lease of about the same cost no longer fits: the first one's hold counts.
    second_job = submit(client)
    second = quote(client, second_job["id"])["quotes"][0]
    response = client.post(f"/api/v1/quotes/{second['id']}/accept")
    assert response.status_code == 409 and response.json()["extra"]["held"] == str(cost)
    # Cancelling the first voids its hold (nothing was posted), so the second now fits.
    assert client.post(f"/api/v1/leases/{lease.pk}/cancel").status_code == 200
    hold.refresh_from_db()
    assert hold.voided_at is not None
    response = client.post(f"/api/v1/quotes/{second['id']}/accept")
    assert response.status_code == 201, response.json()


@pytest.mark.django_db
def test_member_and_token_budgets_count_only_their_own_acceptances(
    funded_buyer: Organisation, east_cluster: Cluster, token_client: Client
) -> None:
    manager = _owner(funded_buyer)
    ci_token, ci_secret = api_token_create(organisation=funded_buyer, name="ci", scope="read_write")
    budget_create(
        buyer=funded_buyer,
        data=BudgetInput(name="CI", scope=BudgetScope.TOKEN, token_id=ci_token.pk, hard_cap=Decimal("0.01")),
        actor=manager,
    )
    ci = APIClient()
    ci.credentials(HTTP_AUTHORIZATION=f"Bearer {ci_secret}")
    other = token_client(funded_buyer)
    job = submit(ci)
    offered = quote(ci, job["id"])["quotes"][0]
    refused = ci.post(f"/api/v1/quotes/{offered['id']}/accept")
    assert refused.status_code == 409 and refused.json()["extra"]["scope"] == "token"
    # Another credential of the same organisation is not under the CI token's cap.
    assert other.post(f"/api/v1/quotes/{offered['id']}/accept").status_code == 201
    # A member's budget holds what that member accepts, not what a token does.
    member = UserFactory(username="mike")
    MembershipFactory(organisation=funded_buyer, user=member, role=Membership.Role.MEMBER)
    mine = budget_create(
        buyer=funded_buyer,
        data=BudgetInput(
            name="Mike", scope=BudgetScope.MEMBER, user_id=member.pk, soft_amount=Decimal("500")
        ),
        actor=manager,
    )
    assert not BudgetHold.objects.filter(budget=mine).exists()
    session = APIClient()
    session.force_authenticate(member)
    job = submit(session)
    offered = quote(session, job["id"])["quotes"][0]
    assert session.post(f"/api/v1/quotes/{offered['id']}/accept").status_code == 201
    assert BudgetHold.objects.get(budget=mine).lease.origin.user_id == member.pk


def priced_since(cluster: Cluster) -> Cluster:
    from metering.models import PriceCard

    PriceCard.objects.filter(cluster=cluster).update(effective_from=timezone.now() - timedelta(days=4))
    return cluster


@pytest.mark.django_db
def test_posted_spend_reaching_a_cap_stops_the_scopes_running_leases_once(
    funded_buyer: Organisation, east_cluster: Cluster, token_client: Client, east_operator: Organisation
) -> None:
    priced_since(east_cluster)
    start = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    capped_job = make_job(buyer=funded_buyer)
    other_job = make_job(buyer=funded_buyer)
    budget = cap(funded_buyer, "10.00", name="Capped job", scope=BudgetScope.JOB, job_id=capped_job.pk)
    leases = []
    for job, island in ((capped_job, "isl-01"), (other_job, "isl-02")):
        lease = make_lease(
            job=job, cluster=east_cluster, start_at=start, end_at=start + timedelta(hours=4), island=island
        )
        leases.append(dispatch.lease_start(operator=east_operator, lease_id=lease.pk, actor=SYSTEM, at=start))
    capped, other = leases
    assert dispatch.leases_stop_over_cap() == 0  # nothing posted yet

    operator_api = token_client(east_operator)
    for lease in leases:  # an hour of 8 A800 cards each: far more than 10 CNY of pack value
        records = [
            {
                "lease": lease.pk,
                "idempotency_key": f"hour-{lease.pk}",
                "start_at": start.isoformat(),
                "end_at": (start + timedelta(hours=1)).isoformat(),
                "cards": 8,
            }
        ]
        assert (
            operator_api.post("/api/v1/operator/usage", {"records": records}, format="json").status_code
            == 201
        )
    assert usage_rate_pending() == 2

    now = timezone.now().replace(microsecond=0)
    assert dispatch.leases_stop_over_cap(now=now) == 1
    capped.refresh_from_db()
    other.refresh_from_db()
    assert (capped.state, other.state) == (LeaseState.STOP_REQUESTED, LeaseState.RUNNING)
    assert capped.reason.startswith(f"budget cap reached: budget {budget.pk} (job) at ")
    transition = LeaseTransition.objects.filter(lease=capped).latest("id")
    assert (transition.to_state, transition.actor_label) == ("stop_requested", "broker: budget cap reached")
    breach = BudgetBreach.objects.get()
    assert breach.period_key == "job" and breach.spent > Decimal("10.00") and breach.cleared_at is None
    assert BuyerNotice.objects.filter(kind="budget_cap_reached", lease=capped).count() == 1
    (alert,) = BudgetAlert.objects.filter(kind="cap")
    assert (alert.percent, alert.spent) == (100, breach.spent)
    # Again: nothing more stopped, no second alert or notice.
    assert dispatch.leases_stop_over_cap(now=now) == 0
    assert BudgetAlert.objects.count() == 1
    assert BuyerNotice.objects.filter(kind="budget_cap_reached").count() == 2  # the alert's and the stop's
    # A new acceptance in the job's scope is refused too: its posted spend is over the cap already.
    # Raising the cap above the spend clears the breach.
    budget_update(
        budget=budget,
        data=BudgetInput(name="Capped job", scope="job", job_id=capped_job.pk, hard_cap=Decimal("10000")),
        actor=_owner(funded_buyer),
    )
    breach.refresh_from_db()
    assert breach.cleared_at is not None


@pytest.mark.django_db
def test_only_owners_admins_and_manager_tokens_set_budgets(funded_buyer: Organisation) -> None:
    from broker.errors import NotABudgetManagerError

    member = UserFactory(username="mike")
    MembershipFactory(organisation=funded_buyer, user=member, role=Membership.Role.MEMBER)
    plain, _ = api_token_create(organisation=funded_buyer, name="agent", scope="read_write")
    data = BudgetInput(name="x", scope="organisation", hard_cap=Decimal(1))
    for actor in (
        Actor(organisation=funded_buyer, user=member),
        Actor(organisation=funded_buyer, token=plain),
    ):
        with pytest.raises(NotABudgetManagerError):
            budget_create(buyer=funded_buyer, data=data, actor=actor)
    manager_token, _ = api_token_create(
        organisation=funded_buyer, name="ops", scope="read_write", can_manage_tokens=True
    )
    budget_create(buyer=funded_buyer, data=data, actor=Actor(organisation=funded_buyer, token=manager_token))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_64_parallel_acceptances_never_exceed_one_cap(east_operator: Organisation, presets: None) -> None:
    """One buyer, 64 jobs of one card for an hour on a flat 10 CNY tariff (each quote 10.00 CNY), an
    organisation cap of 85 CNY, and 64 acceptances at once on their own connections: exactly 8 win, 56 are
    refused with budget_cap_exceeded, and the holds never pass the cap."""
    cluster = make_cluster(operator=east_operator, hub="yrd", name="race", islands=[("isl-01", 128)])
    make_price_card(cluster=cluster, rate="10.0000", tariff_code="flat")
    buyer = BuyerFactory(slug="racer")
    make_paid_pack(buyer=buyer, accelerator=A800, card_hours=1000, price="9000.00", key="race")
    budget = cap(buyer, "85.00")
    _, secret = api_token_create(organisation=buyer, name="race", scope="read_write")
    start = timezone.now() + timedelta(hours=2)
    quote_ids = []
    setup = APIClient()
    setup.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    for _i in range(64):
        job = submit(
            setup,
            cards=1,
            earliest_start_at=start.isoformat(),
            deadline_at=(start + timedelta(hours=1)).isoformat(),
        )
        (only,) = quote(setup, job["id"])["quotes"]
        assert only["cost"] == "10.00"
        quote_ids.append(only["id"])
    barrier = threading.Barrier(64)
    outcomes: list[tuple[int, str]] = []
    lock = threading.Lock()

    def accept(i: int) -> None:
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
            barrier.wait()
            response = client.post(f"/api/v1/quotes/{quote_ids[i]}/accept")
            body = response.json()
            with lock:
                outcomes.append((response.status_code, body.get("code", body.get("state", ""))))
        finally:
            connection.close()

    threads = [threading.Thread(target=accept, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(outcomes) == Counter({(201, "reserved"): 8, (409, "budget_cap_exceeded"): 56})
    holds = list(
        BudgetHold.objects.filter(budget=budget, voided_at__isnull=True).values_list("amount", flat=True)
    )
    assert len(holds) == 8 == Lease.objects.count()
    assert sum(holds) == Decimal("80.00") <= Decimal("85.00")
    (status,) = budget_selectors.budget_status_list_for(buyer=buyer)
    assert status.held == Decimal("80.00") and status.remaining == Decimal("5.00")


@pytest.mark.django_db
def test_the_budgets_api_reads_for_everyone_and_writes_for_managers(
    funded_buyer: Organisation, token_client: Client
) -> None:
    manager = token_client(funded_buyer, can_manage_tokens=True)
    agent = token_client(funded_buyer)
    body = {"name": "Acme monthly", "soft_amount": "1000.00", "hard_cap": "1500"}
    assert agent.post("/api/v1/budgets", body, format="json").json()["code"] == "not_a_budget_manager"
    created = manager.post("/api/v1/budgets", body, format="json")
    assert created.status_code == 201, created.json()
    budget = created.json()
    period = budget_selectors.month_key(at=timezone.now())
    assert {
        k: budget[k] for k in ("scope", "soft_amount", "thresholds", "hard_cap", "period", "spent", "held")
    } == {
        "scope": "organisation",
        "soft_amount": "1000.00",
        "thresholds": [50, 80, 100],
        "hard_cap": "1500.00",
        "period": period,
        "spent": "0.00",
        "held": "0.00",
    }
    assert budget["remaining"] == "1500.00"
    # One budget per scope target; faults are named per field.
    again = manager.post("/api/v1/budgets", body, format="json")
    assert again.status_code == 400 and again.json()["code"] == "budget_invalid"
    bad = manager.post("/api/v1/budgets", {"name": "x", "scope": "member", "user_id": 999999}, format="json")
    assert bad.status_code == 400 and set(bad.json()["extra"]["fields"]) == {"user", "soft_amount"}
    listed = agent.get("/api/v1/budgets").json()
    assert [b["id"] for b in listed["results"]] == [budget["id"]]
    assert agent.get(f"/api/v1/budgets/{budget['id']}").json()["name"] == "Acme monthly"
    assert agent.put(f"/api/v1/budgets/{budget['id']}", body, format="json").status_code == 403
    updated = manager.put(
        f"/api/v1/budgets/{budget['id']}", {**body, "thresholds": [90], "hard_cap": None}, format="json"
    )
    assert updated.status_code == 200 and (updated.json()["thresholds"], updated.json()["hard_cap"]) == (
        [90],
        None,
    )
    # Another buyer sees nothing of it.
    stranger = token_client(BuyerFactory(slug="other"), can_manage_tokens=True)
    assert stranger.get(f"/api/v1/budgets/{budget['id']}").status_code == 404
    assert stranger.delete(f"/api/v1/budgets/{budget['id']}").status_code == 404
    assert stranger.get("/api/v1/budgets").json()["results"] == []
    assert agent.get("/api/v1/budget-alerts").json()["results"] == []
    assert manager.delete(f"/api/v1/budgets/{budget['id']}").status_code == 204
    assert agent.get("/api/v1/budgets").json()["results"] == []


@pytest.mark.django_db
def test_the_alert_endpoint_follows_the_ssrf_rules_and_its_secret_is_shown_once(
    funded_buyer: Organisation, token_client: Client, settings: object
) -> None:
    manager = token_client(funded_buyer, can_manage_tokens=True)
    settings.CARDHOUR_ENDPOINT_ALLOW_HTTP = False  # type: ignore[attr-defined]
    settings.CARDHOUR_ENDPOINT_ALLOW_LOOPBACK = False  # type: ignore[attr-defined]
    for url in ("http://alerts.example.com/hook", "https://127.0.0.1/hook", "https://10.0.0.5/x"):
        refused = manager.put("/api/v1/buyer/endpoint", {"url": url}, format="json")
        assert refused.status_code == 400 and refused.json()["code"] == "endpoint_url_forbidden", url
    ok = manager.put("/api/v1/buyer/endpoint", {"url": "https://alerts.example.com/hook"}, format="json")
    assert ok.status_code == 200 and ok.json() == {"url": "https://alerts.example.com/hook", "enabled": False}
    rotated = manager.post("/api/v1/buyer/endpoint-secret")
    assert rotated.status_code == 200 and rotated.json()["secret"].startswith("chw_")
    shown = manager.get("/api/v1/buyer/endpoint").json()
    assert shown == {"url": "https://alerts.example.com/hook", "enabled": True} and "secret" not in shown
    assert token_client(funded_buyer).post("/api/v1/buyer/endpoint-secret").status_code == 403
    assert manager.delete("/api/v1/buyer/endpoint-secret").status_code == 204
    assert manager.get("/api/v1/buyer/endpoint").json()["enabled"] is False
