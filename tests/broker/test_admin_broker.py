"""The broker back office: every page renders without N+1 queries, jobs, quotes, leases and their history are
read-only even for a superuser, the actions go through the services and record the staff user, and an
operator's signing secret is never shown.

The world: operators ``ctyun`` (16 A800 cards in Shanghai) and ``cucc`` (64 in Zhongwei), both sending lease
events to their clusters' endpoints; buyer ``acme`` with packs, and for each of ``n`` jobs a lease (reserved,
running, or run to completion) with its history and event deliveries, a quote and a notice.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.db.models import Model
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from broker import admin as broker_admin
from broker.budgets.models import Budget, BudgetAlert, BudgetBreach, BudgetHold, BuyerEndpoint, LeaseOrigin
from broker.models import (
    BuyerNotice,
    BuyerPreference,
    CapacityHold,
    ClusterReliability,
    DrawHold,
    DrawPending,
    Job,
    Lease,
    LeaseEventDelivery,
    LeaseState,
    LeaseTransition,
    OperatorEndpoint,
    Quote,
    SlaAssessment,
)
from broker.services import dispatch
from broker.services.leases import lease_lock, lease_transition, notice_create
from broker.services.preferences import buyer_home_hub_set
from broker.services.quotes import quote_create
from broker.services.reliability import cluster_reliability_refresh
from core.errors import ConflictError
from core.models import Membership, Organisation
from core.types import Actor
from federation.models import Cluster, ClusterStatus
from federation.services import cluster_status_set
from tests.broker.factories import make_job, make_lease
from tests.factories import BuyerFactory, OperatorFactory, UserFactory, make_cluster

pytestmark = pytest.mark.django_db

SYSTEM = Actor.system("test")
BROKER_ADMINS = sorted(
    (model for model in admin.site._registry if model._meta.app_label == "broker"),
    key=lambda model: model._meta.label,
)
INLINE_ONLY = {CapacityHold}
READ_ONLY = [
    DrawHold,
    DrawPending,
    Job,
    Quote,
    Lease,
    LeaseTransition,
    LeaseEventDelivery,
    BuyerNotice,
    Budget,
    BudgetHold,
    BudgetAlert,
    BudgetBreach,
    LeaseOrigin,
    BuyerEndpoint,
]
BIG_TABLES = [Job, Quote, Lease, LeaseTransition, LeaseEventDelivery, BuyerNotice]


def _url(model: type[Model], view: str, *args: object) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def _move(lease: Lease, *states: str, actor: Actor = SYSTEM) -> Lease:
    """Walk a lease through ``states`` with the state machine (each move records a transition)."""
    with transaction.atomic():
        locked = lease_lock(lease_id=lease.pk)
        for state in states:
            lease_transition(lease=locked, to_state=state, actor=actor, reason=f"test: {state}")
    return locked


def _grow(buyer: Organisation, clusters: list[Cluster], count: int, *, offset: int = 0) -> list[Lease]:
    """``count`` more jobs, each with a lease a day apart (so they never compete for cards), moved to
    reserved / running / completed in turn, one quote and one notice."""
    leases: list[Lease] = []
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    for i in range(offset, offset + count):
        cluster = clusters[i % len(clusters)]
        job = make_job(buyer=buyer, name=f"train-{i}", cards=4, checkpointable=bool(i % 2))
        lease = make_lease(job=job, cluster=cluster, cards=4, start_at=start + timedelta(days=i))
        lease = _move(lease, *[(), (LeaseState.RUNNING,), (LeaseState.RUNNING, LeaseState.COMPLETED)][i % 3])
        quoted = make_job(buyer=buyer, name=f"quoted-{i}", cards=4)
        quote_create(job=quoted, limit=1)
        notice_create(
            buyer_id=buyer.pk, kind="lease_replaced", message=f"notice {i}", job_id=job.pk, lease_id=lease.pk
        )
        # What broker.services.sla records once a lease on a card with a service level has ended.
        SlaAssessment.objects.create(
            lease=lease,
            assessed_at=timezone.now(),
            window_seconds=7200,
            lost_seconds=0,
            excluded_buyer_seconds=0,
            excluded_maintenance_seconds=0,
            availability_percent=Decimal("100.000"),
            outcome=SlaAssessment.Outcome.WITHIN_LEVEL,
        )
        leases.append(lease)
    return leases


def _budget_world(buyer: Organisation) -> Budget:
    from broker.budgets.selectors import BudgetStatus
    from broker.budgets.services import BudgetInput, _alert_raise, budget_create, buyer_endpoint_set

    owner = UserFactory(username="budget-owner")
    Membership.objects.create(organisation=buyer, user=owner, role=Membership.Role.OWNER)
    actor = Actor(organisation=buyer, user=owner)
    budget = budget_create(
        buyer=buyer,
        data=BudgetInput(
            name="Acme monthly", scope="organisation", soft_amount=Decimal("100"), hard_cap=Decimal("90000")
        ),
        actor=actor,
    )
    now = timezone.now()
    _alert_raise(
        status=BudgetStatus(budget=budget, period_key="2026-01", spent=Decimal("60.00"), held=Decimal(0)),
        kind="threshold",
        percent=50,
        limit=Decimal("100.00"),
        now=now,
    )
    BudgetBreach.objects.create(
        budget=budget, period_key="2026-01", raised_at=now, cleared_at=now, spent=Decimal(1), cap=Decimal(1)
    )
    buyer_endpoint_set(buyer=buyer, url="https://alerts.example.com/hook", actor=actor)
    return budget


class World:
    def __init__(self, buyer: Organisation, east: Cluster, west: Cluster) -> None:
        self.buyer = buyer
        self.east = east
        self.west = west
        self.endpoints = {
            cluster.operator.slug: dispatch.operator_endpoint_secret_rotate(
                operator=cluster.operator, actor=SYSTEM
            )
            for cluster in (east, west)
        }
        # Budgets (broker.budgets): a budget before the leases so they hold against it, an alert, a breach
        # and the buyer's alert endpoint.
        self.budget = _budget_world(buyer)
        # 0: reserved on east, 1: running on west (so both operators have history and deliveries).
        self.leases = _grow(buyer, [east, west], 2)
        self.preference = buyer_home_hub_set(buyer=buyer, hub_code="yrd", actor=SYSTEM)
        cluster_reliability_refresh()  # a score row per cluster, as the hourly beat leaves them


@pytest.fixture
def world(funded_buyer: Organisation, east_cluster: Cluster, west_cluster: Cluster) -> World:
    return World(funded_buyer, east_cluster, west_cluster)


def test_every_broker_model_has_an_admin_or_an_inline() -> None:
    from django.apps import apps

    assert set(apps.get_app_config("broker").get_models()) - INLINE_ONLY == set(BROKER_ADMINS)


def test_the_world_fills_every_table(world: World) -> None:
    empty = [m._meta.label for m in [*BROKER_ADMINS, *INLINE_ONLY] if not m._default_manager.exists()]
    assert empty == []


@pytest.mark.parametrize("model", BROKER_ADMINS, ids=lambda model: model._meta.label)
def test_every_changelist_search_and_change_page_renders(
    admin_client: Client, world: World, model: type[Model]
) -> None:
    assert admin_client.get(_url(model, "changelist")).status_code == 200
    for term in ["acme", "1", "cpi:cucc:nx:zw-ai01", "99999999999999999999"]:
        assert admin_client.get(_url(model, "changelist"), {"q": term}).status_code == 200, term
    for obj in model._default_manager.order_by("pk"):
        assert admin_client.get(_url(model, "change", obj.pk)).status_code == 200, obj


@pytest.mark.parametrize("model", BROKER_ADMINS, ids=lambda model: model._meta.label)
def test_changelist_queries_do_not_grow_with_rows(
    admin_client: Client, world: World, model: type[Model]
) -> None:
    admin_client.get(_url(model, "changelist"))  # warm the per-process caches (content types, session)
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(_url(model, "changelist")).status_code == 200
    _grow(world.buyer, [world.east, world.west], 4, offset=2)
    if model is OperatorEndpoint:
        for slug in ["gds", "cmcc", "ecloud", "ucloud"]:
            operator = OperatorFactory(slug=slug, name=slug)
            dispatch.operator_endpoint_secret_rotate(operator=operator, actor=SYSTEM)
    if model in (Budget, BudgetAlert, BudgetBreach, BuyerEndpoint):
        for slug in ["beta", "gamma", "delta", "epsilon", "zeta"]:
            _budget_world(BuyerFactory(slug=slug, name=slug))
    if model is ClusterReliability:
        for name in ["r-1", "r-2", "r-3", "r-4"]:
            make_cluster(operator=world.east.operator, hub="yrd", name=name, islands=[("isl-01", 8)])
        cluster_reliability_refresh()
    if model is DrawPending:  # one row per buyer and chip with live leases
        for i, slug in enumerate(["beta", "gamma", "delta", "epsilon", "zeta"]):
            make_lease(
                job=make_job(buyer=BuyerFactory(slug=slug, name=slug)),
                cluster=world.east,
                cards=1,
                start_at=timezone.now().replace(microsecond=0) + timedelta(days=5, hours=3 * i),
            )
    if model is BuyerPreference:
        for slug in ["beta", "gamma", "delta", "epsilon", "zeta"]:
            buyer_home_hub_set(buyer=BuyerFactory(slug=slug, name=slug), hub_code="nx", actor=SYSTEM)
    assert model._default_manager.count() >= 6
    with CaptureQueriesContext(connection) as many:
        assert admin_client.get(_url(model, "changelist")).status_code == 200
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]


def test_change_pages_do_not_grow_with_history(admin_client: Client, world: World) -> None:
    running = world.leases[1]
    admin_client.get(_url(Lease, "change", running.pk))  # warm the per-process caches (content types)
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(_url(Lease, "change", running.pk)).status_code == 200
    _move(running, LeaseState.STOP_REQUESTED, LeaseState.COMPLETED)
    with CaptureQueriesContext(connection) as many:
        assert admin_client.get(_url(Lease, "change", running.pk)).status_code == 200
    assert len(many) == len(few)


@pytest.mark.parametrize(
    ("model", "params"),
    [
        (Job, {"state__exact": "placed", "gang__exact": "island", "preference__exact": "price"}),
        (Job, {"checkpointable__exact": "1", "buyer": "1"}),
        (Job, {"origin_hub__id__exact": "1"}),
        (Lease, {"state__exact": "running", "operator": "1", "buyer": "2"}),
        (Lease, {"cluster__hub__id__exact": "1"}),
        (Quote, {"validity": "live"}),
        (Quote, {"validity": "expired", "balance_sufficient__exact": "1"}),
        (LeaseTransition, {"to_state__exact": "running"}),
        (LeaseTransition, {"at__year": str(timezone.now().year)}),
        (LeaseEventDelivery, {"status__exact": "pending", "operator": "1"}),
        (BuyerNotice, {"read_at__isempty": "1", "buyer": "1"}),
        (OperatorEndpoint, {"enabled__exact": "1"}),
        (Quote, {"job__id__exact": "1"}),
        (BuyerNotice, {"job__id__exact": "1"}),
    ],
)
def test_filters(admin_client: Client, world: World, model: type[Model], params: dict[str, str]) -> None:
    # An unknown filter would redirect (302) to ?e=1; a broken one would be a 500.
    assert admin_client.get(_url(model, "changelist"), params).status_code == 200


def test_big_tables_never_count_the_whole_table(world: World) -> None:
    for model in BIG_TABLES:
        model_admin = admin.site._registry[model]
        assert model_admin.show_full_result_count is False, model
        assert model_admin.paginator is broker_admin._EstimatedCountPaginator, model
    assert admin.site._registry[LeaseTransition].date_hierarchy == "at"


def test_the_unfiltered_count_is_the_planners_estimate_on_postgresql(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker_admin._EstimatedCountPaginator, "threshold", 0)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE broker_leasetransition")
    paginator = broker_admin._EstimatedCountPaginator(LeaseTransition.objects.order_by("-id"), 100)
    with CaptureQueriesContext(connection) as queries:
        count = paginator.count
    assert count == LeaseTransition.objects.count()
    counted = any("COUNT(" in q["sql"].upper() for q in queries.captured_queries)
    assert counted is (connection.vendor != "postgresql")
    running = world.leases[1]
    filtered = broker_admin._EstimatedCountPaginator(LeaseTransition.objects.filter(lease=running), 100)
    assert filtered.count == 2


def _results(client: Client, model: type[Model], **params: str) -> list[int]:
    return sorted(obj.pk for obj in client.get(_url(model, "changelist"), params).context["cl"].result_list)


def test_search_by_id_and_exact_keys(admin_client: Client, world: World) -> None:
    reserved, running = world.leases
    assert _results(admin_client, Lease, q=str(running.pk)) == [running.pk]
    assert _results(admin_client, Lease, q="cpi:cucc:nx:zw-ai01") == [running.pk]
    assert _results(admin_client, Lease, q="cpi:cucc:nx") == []  # exact, not a prefix scan
    assert _results(admin_client, Lease, q="not-a-number") == []
    jobs = _results(admin_client, Job, q="ac")  # the start of the buyer's slug
    assert jobs == sorted(Job.objects.values_list("pk", flat=True))
    assert _results(admin_client, Job, q="quoted-1") == list(
        Job.objects.filter(name="quoted-1").values_list("pk", flat=True)
    )
    assert _results(admin_client, LeaseTransition, q=str(running.pk)) == sorted(
        running.transitions.values_list("pk", flat=True)
    )
    assert _results(admin_client, LeaseEventDelivery, q=str(reserved.pk)) == sorted(
        LeaseEventDelivery.objects.filter(transition__lease=reserved).values_list("pk", flat=True)
    )


def test_lease_list_and_page_show_what_staff_need(admin_client: Client, world: World) -> None:
    running = world.leases[1]
    content = admin_client.get(_url(Lease, "changelist")).content.decode()
    for text in ["cpi:ctyun:yrd:sh-ai01", "cpi:cucc:nx:zw-ai01", ">reserved<", ">running<", ">v1<", "CNY"]:
        assert text in content, text
    page = admin_client.get(_url(Lease, "change", running.pk))
    holds = page.context["inline_admin_formsets"][0].formset.queryset
    assert [(h.island.cpi, h.cards, h.active) for h in holds] == [("cpi:cucc:nx:zw-ai01:isl-01", 4, True)]
    history = page.context["inline_admin_formsets"][1].formset.queryset
    assert [(t.from_state, t.to_state) for t in history] == [("", "reserved"), ("reserved", "running")]
    text = page.content.decode()
    assert f"lease:{running.pk}" in text
    assert "9.0000 CNY per card-hour, tariff cucc-west v1" in text
    job_page = admin_client.get(_url(Job, "change", running.job_id)).content.decode()
    assert _url(Lease, "change", running.pk) in job_page


# --- Read-only history and money -------------------------------------------------------------------


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda model: model._meta.label)
def test_rows_cannot_be_added_changed_or_deleted_even_by_a_superuser(
    admin_client: Client, admin_user: User, world: World, model: type[Model]
) -> None:
    obj = model._default_manager.order_by("pk").first()
    assert obj is not None
    model_admin = admin.site._registry[model]
    request = type("R", (), {"user": admin_user})()
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, obj)
    assert not model_admin.has_delete_permission(request, obj)
    assert admin_client.get(_url(model, "add")).status_code == 403
    assert admin_client.get(_url(model, "delete", obj.pk)).status_code == 403
    assert admin_client.post(_url(model, "change", obj.pk), {}).status_code == 403
    assert "delete_selected" not in admin_client.get(_url(model, "changelist")).content.decode()


def test_a_lease_is_unchanged_by_a_forged_change_post(admin_client: Client, world: World) -> None:
    lease = world.leases[0]
    response = admin_client.post(_url(Lease, "change", lease.pk), {"state": "cancelled", "cards": "1"})
    assert response.status_code == 403
    lease.refresh_from_db()
    assert (lease.state, lease.cards) == (LeaseState.RESERVED, 4)


# --- Actions ---------------------------------------------------------------------------------------


def _post_action(client: Client, model: type[Model], action: str, pks: list[int], **data: str):  # type: ignore[no-untyped-def]
    return client.post(_url(model, "changelist"), {"action": action, "_selected_action": pks, **data})


def _messages(response) -> str:  # type: ignore[no-untyped-def]
    return " ".join(str(m) for m in response.context["messages"])


def test_cancelling_jobs_asks_for_confirmation_and_a_reason_then_calls_the_service(
    admin_client: Client, admin_user: User, world: World
) -> None:
    reserved, running = world.leases
    pks = [reserved.job_id, running.job_id]

    confirm = _post_action(admin_client, Job, "cancel_jobs", pks, index="0")
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "Cancel these jobs?" in page
    assert f"lease {reserved.pk} cancelled, cards released" in page
    assert f"lease {running.pk} asked to stop" in page
    no_reason = _post_action(admin_client, Job, "cancel_jobs", pks, confirm="yes", reason="  ")
    assert no_reason.status_code == 200
    assert "reason" in no_reason.context["form"].errors
    assert set(Job.objects.filter(pk__in=pks).values_list("state", flat=True)) == {Job.State.PLACED}
    assert not LeaseTransition.objects.filter(actor_label__startswith="user ").exists()

    done = admin_client.post(
        _url(Job, "changelist"),
        {"action": "cancel_jobs", "_selected_action": pks, "confirm": "yes", "reason": "fraud review"},
        follow=True,
    )
    assert "Cancelled 2 job(s)" in _messages(done)
    jobs = Job.objects.filter(pk__in=pks)
    assert {(j.state, j.failure_reason) for j in jobs} == {
        (Job.State.CANCELLED, "fraud review (staff, admin)")
    }
    staff = list(
        LeaseTransition.objects.filter(actor_label=f"user {admin_user.get_username()}")
        .order_by("lease_id")
        .values_list("lease_id", "from_state", "to_state")
    )
    assert staff == [
        (reserved.pk, LeaseState.RESERVED, LeaseState.CANCELLED),
        (running.pk, LeaseState.RUNNING, LeaseState.STOP_REQUESTED),
    ]
    assert not CapacityHold.objects.filter(lease=reserved, active=True).exists()
    entry = LogEntry.objects.get(object_id=str(reserved.job_id), content_type__model="job")
    assert "fraud review" in entry.get_change_message()

    again = admin_client.post(
        _url(Job, "changelist"),
        {"action": "cancel_jobs", "_selected_action": pks[:1], "confirm": "yes", "reason": "twice"},
        follow=True,
    )
    assert "is cancelled" in _messages(again)


def test_cancelling_leases_cancels_reserved_stops_running_and_refuses_ended(
    admin_client: Client, admin_user: User, world: World
) -> None:
    reserved, running = world.leases
    ended = _grow(world.buyer, [world.east, world.west], 1, offset=2)[0]
    assert ended.state == LeaseState.COMPLETED
    pks = [reserved.pk, running.pk, ended.pk]

    confirm = _post_action(admin_client, Lease, "cancel_leases", pks, index="0")
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "Cancel or stop these leases?" in page
    assert "refused: the lease is completed" in page
    assert _post_action(admin_client, Lease, "cancel_leases", pks, confirm="yes").context["form"].errors
    assert Lease.objects.get(pk=reserved.pk).state == LeaseState.RESERVED

    done = admin_client.post(
        _url(Lease, "changelist"),
        {"action": "cancel_leases", "_selected_action": pks, "confirm": "yes", "reason": "operator asked"},
        follow=True,
    )
    text = _messages(done)
    assert f"Cancelled 1 lease(s): {reserved.pk}." in text
    assert f"Asked the operator to stop 1 lease(s): {running.pk}." in text
    assert f"Lease {ended.pk}: " in text
    states = dict(Lease.objects.filter(pk__in=pks).values_list("pk", "state"))
    assert states == {
        reserved.pk: LeaseState.CANCELLED,
        running.pk: LeaseState.STOP_REQUESTED,
        ended.pk: LeaseState.COMPLETED,
    }
    staff = LeaseTransition.objects.filter(actor_label=f"user {admin_user.get_username()}").order_by(
        "lease_id"
    )
    assert [(t.lease_id, t.to_state, t.reason) for t in staff] == [
        (reserved.pk, LeaseState.CANCELLED, "operator asked (staff, admin)"),
        (running.pk, LeaseState.STOP_REQUESTED, "operator asked (staff, admin)"),
    ]
    # Both operators are told: the transitions are queued for their endpoints.
    assert LeaseEventDelivery.objects.filter(transition__in=staff).count() == 2


def test_staff_who_may_only_view_get_no_actions(client: Client, world: World) -> None:
    viewer = UserFactory(is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_job", "view_lease", "view_leaseeventdelivery"])
    )
    client.force_login(viewer)
    for model in [Job, Lease, LeaseEventDelivery]:
        response = client.get(_url(model, "changelist"))
        assert response.status_code == 200
        assert response.context["action_form"] is None or not [
            choice for choice in response.context["action_form"].fields["action"].choices if choice[0]
        ], model
    forged = client.post(
        _url(Lease, "changelist"),
        {
            "action": "cancel_leases",
            "_selected_action": [world.leases[0].pk],
            "confirm": "yes",
            "reason": "x",
        },
    )
    assert forged.status_code in (200, 302)
    assert Lease.objects.get(pk=world.leases[0].pk).state == LeaseState.RESERVED


def test_run_failover_now_confirms_then_runs_the_failover_service(
    admin_client: Client, admin_user: User, world: World
) -> None:
    reserved, running = world.leases  # reserved on east (ctyun), running on west (cucc)
    cluster_status_set(actor=SYSTEM, cluster=world.west, status=ClusterStatus.OFFLINE, reason="power loss")

    confirm = _post_action(admin_client, Lease, "run_failover", [reserved.pk], index="0")
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "Live leases on down clusters right now: 1." in page
    assert _url(Lease, "change", running.pk) in page
    assert Lease.objects.get(pk=running.pk).state == LeaseState.RUNNING

    done = admin_client.post(
        _url(Lease, "changelist"),
        {"action": "run_failover", "_selected_action": [reserved.pk], "confirm": "yes"},
        follow=True,
    )
    assert "Failover ran: 1 lease(s) of down clusters handled." in _messages(done)
    assert Lease.objects.get(pk=running.pk).state == LeaseState.INTERRUPTED
    assert Lease.objects.get(pk=reserved.pk).state == LeaseState.RESERVED  # the selection is not used
    interrupted = LeaseTransition.objects.get(lease=running, to_state=LeaseState.INTERRUPTED)
    assert interrupted.actor_label == "failover"

    nothing = _post_action(admin_client, Lease, "run_failover", [reserved.pk], index="0")
    assert "failover would do nothing" in nothing.content.decode()


def test_retry_now_makes_pending_due_and_revives_given_up_deliveries(
    admin_client: Client, world: World
) -> None:
    later = timezone.now() + timedelta(hours=1)
    pending, gave_up, delivered = LeaseEventDelivery.objects.order_by("pk")[:3]
    LeaseEventDelivery.objects.filter(pk=pending.pk).update(
        attempts=3, next_attempt_at=later, last_error="HTTP 502"
    )
    LeaseEventDelivery.objects.filter(pk=gave_up.pk).update(
        status=LeaseEventDelivery.Status.GAVE_UP, attempts=12, next_attempt_at=later, last_error="HTTP 500"
    )
    delivered_at = timezone.now() - timedelta(minutes=1)
    LeaseEventDelivery.objects.filter(pk=delivered.pk).update(
        status=LeaseEventDelivery.Status.DELIVERED,
        attempts=1,
        delivered_at=delivered_at,
        next_attempt_at=later,
    )
    before = timezone.now()

    done = admin_client.post(
        _url(LeaseEventDelivery, "changelist"),
        {"action": "retry_now", "_selected_action": [pending.pk, gave_up.pk, delivered.pk], "index": "0"},
        follow=True,
    )
    assert "2 event(s) due now" in _messages(done)
    rows = {d.pk: d for d in LeaseEventDelivery.objects.filter(pk__in=[pending.pk, gave_up.pk, delivered.pk])}
    assert (rows[pending.pk].status, rows[pending.pk].attempts) == (LeaseEventDelivery.Status.PENDING, 3)
    assert before <= rows[pending.pk].next_attempt_at <= timezone.now()
    assert (rows[gave_up.pk].status, rows[gave_up.pk].attempts) == (LeaseEventDelivery.Status.PENDING, 0)
    assert before <= rows[gave_up.pk].next_attempt_at <= timezone.now()
    assert (rows[delivered.pk].status, rows[delivered.pk].next_attempt_at) == (
        LeaseEventDelivery.Status.DELIVERED,
        later,
    )


def test_retry_now_warns_about_operators_whose_events_are_disabled(
    admin_client: Client, world: World
) -> None:
    dispatch.operator_endpoint_disable(operator=world.east.operator, actor=SYSTEM)
    east_delivery = LeaseEventDelivery.objects.filter(transition__operator=world.east.operator).first()
    assert east_delivery is not None
    done = admin_client.post(
        _url(LeaseEventDelivery, "changelist"),
        {"action": "retry_now", "_selected_action": [east_delivery.pk], "index": "0"},
        follow=True,
    )
    assert "paused or disabled for ctyun" in _messages(done)


# --- Operator endpoints ----------------------------------------------------------------------------


def test_the_signing_secret_is_never_shown_in_full(admin_client: Client, world: World) -> None:
    endpoint = world.endpoints["cucc"]
    secret = endpoint.secret
    assert secret.startswith("chw_") and len(secret) > 20
    for response in [
        admin_client.get(_url(OperatorEndpoint, "changelist")),
        admin_client.get(_url(OperatorEndpoint, "change", endpoint.pk)),
        admin_client.get(_url(OperatorEndpoint, "changelist"), {"q": "cucc"}),
    ]:
        content = response.content.decode()
        assert secret not in content
        assert secret[:12] not in content
        assert f"{secret[:8]}…" in content
    form = admin_client.get(_url(OperatorEndpoint, "change", endpoint.pk)).context["adminform"].form
    assert set(form.fields) == {"enabled"}


def test_endpoints_are_not_added_or_deleted_here(admin_client: Client, world: World) -> None:
    endpoint = world.endpoints["cucc"]
    assert admin_client.get(_url(OperatorEndpoint, "add")).status_code == 403
    assert admin_client.get(_url(OperatorEndpoint, "delete", endpoint.pk)).status_code == 403


def test_pausing_and_resuming_an_endpoint_keeps_its_secret(admin_client: Client, world: World) -> None:
    endpoint = world.endpoints["cucc"]
    paused = admin_client.post(_url(OperatorEndpoint, "change", endpoint.pk), {"secret": "chw_forged"})
    assert paused.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.secret) == (False, world.endpoints["cucc"].secret)
    resumed = admin_client.post(_url(OperatorEndpoint, "change", endpoint.pk), {"enabled": "on"})
    assert resumed.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.secret) == (True, world.endpoints["cucc"].secret)


def test_an_endpoint_without_a_secret_cannot_be_resumed_here(admin_client: Client, world: World) -> None:
    dispatch.operator_endpoint_disable(operator=world.west.operator, actor=SYSTEM)
    endpoint = OperatorEndpoint.objects.get(operator=world.west.operator)
    response = admin_client.post(_url(OperatorEndpoint, "change", endpoint.pk), {"enabled": "on"})
    assert response.status_code == 200
    assert "rotating its secret" in str(response.context["adminform"].form.errors)
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.secret) == (False, "")
    with pytest.raises(ConflictError) as raised:
        dispatch.operator_endpoint_enabled_set(endpoint=endpoint, enabled=True, actor=SYSTEM)
    assert raised.value.code == "endpoint_secret_missing"


def test_helpers() -> None:
    assert [broker_admin._duration(s) for s in [0, 45, 3600, 5400, 90_061, 7 * 86_400]] == [
        "0 s",
        "45 s",
        "1 h",
        "1 h 30 min",
        "1 d 1 h 1 min",
        "7 d",
    ]
    assert broker_admin._mask("") == "— (none: the operator disabled lease events)"
    assert broker_admin._mask("chw_abcdefghijklmnop") == "chw_abcd… (20 characters, hidden)"


def test_reliability_scores_are_read_only_and_recomputed_by_the_action(
    admin_client: Client, world: World
) -> None:
    west = ClusterReliability.objects.get(cluster=world.west)
    ClusterReliability.objects.filter(cluster=world.east).delete()
    response = admin_client.post(
        _url(ClusterReliability, "changelist"),
        {"action": "recompute", helpers.ACTION_CHECKBOX_NAME: [west.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "2 reliability scores recomputed." in response.content.decode()
    assert set(ClusterReliability.objects.values_list("cluster_id", flat=True)) == {
        world.east.pk,
        world.west.pk,
    }
    assert (
        admin_client.post(_url(ClusterReliability, "change", west.pk), {"interruptions": 9}).status_code
        == 403
    )
