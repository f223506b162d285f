"""The back office renders for every core and federation model, does not N+1, and changes cluster status
only through the service, recording the staff user and the reason."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib import admin
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import F, Model
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from core.demo import demo_record_add
from core.models import Organisation
from core.services import api_token_create, invitation_create
from core.types import Actor
from federation import services
from federation.admin import human_duration
from federation.models import (
    Accelerator,
    Cluster,
    ClusterStatus,
    ClusterStatusChange,
    HubLatency,
    Island,
    IssuedIdentifier,
    StandardCard,
)
from federation.types import IslandReport
from tests.factories import MembershipFactory, OperatorFactory, make_cluster

ADMINS = sorted(
    (model for model in admin.site._registry if model._meta.app_label in {"core", "federation"}),
    key=lambda model: model._meta.label,
)


def _url(model: type[Model], view: str, *args: object) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def fleet(operator: Organisation) -> list[Cluster]:
    """Two clusters with every kind of related row: islands, identifiers, status history, a heartbeat,
    a member, a token and an invitation, so each admin page has something to show."""
    a800 = make_cluster(operator=operator)
    unknown_chip = make_cluster(operator=operator, hub="gz", name="gy-910c", accelerator="huawei-ascend-910c")
    services.heartbeat_record(
        actor=Actor.system("test"),
        cluster=a800,
        sent_at=timezone.now(),
        health="ok",
        islands=[IslandReport(name="isl-01", available_cards=40, unhealthy_cards=2)],
    )
    owner = MembershipFactory(organisation=operator)
    api_token_create(organisation=operator, name="agent", scope="read_write")
    invitation_create(
        actor=Actor(organisation=operator, user=owner.user), email="new@example.com", role="member"
    )
    demo_record_add(key=f"seed_demo:cluster:{a800.cpi}", obj=a800)
    starts = timezone.now() + timedelta(days=2)
    services.cluster_maintenance_announce(
        actor=Actor(organisation=operator),
        cluster=a800,
        starts_at=starts,
        ends_at=starts + timedelta(hours=2),
        reason="firmware",
    )
    return [a800, unknown_chip]


@pytest.mark.parametrize("model", ADMINS, ids=lambda model: model._meta.label)
def test_every_changelist_search_and_change_page_renders(
    admin_client: Client, fleet: list[Cluster], model: type[Model]
) -> None:
    assert admin_client.get(_url(model, "changelist")).status_code == 200
    assert admin_client.get(_url(model, "changelist"), {"q": "cucc"}).status_code == 200
    obj = model._default_manager.order_by("pk").first()
    assert obj is not None, f"the fleet fixture should create a {model._meta.label}"
    response = admin_client.get(_url(model, "change", obj.pk))
    assert response.status_code == 200


def test_every_federation_model_has_an_admin() -> None:
    from django.apps import apps

    assert set(apps.get_app_config("federation").get_models()) <= set(admin.site._registry)


def test_admin_index_renders(admin_client: Client, fleet: list[Cluster]) -> None:
    response = admin_client.get(reverse("admin:index"))
    assert response.status_code == 200
    assert b"Clusters" in response.content


@pytest.mark.parametrize(
    "params",
    [
        {"status__exact": "active"},
        {"health__exact": "ok"},
        {"accelerator__vendor": "Huawei"},
        {"registered_at__year": str(timezone.now().year)},
        {"o": "9"},  # heartbeat age
    ],
)
def test_cluster_changelist_filters_and_sorting(
    admin_client: Client, fleet: list[Cluster], params: dict[str, str]
) -> None:
    # An unknown filter would redirect (302) to ?e=1; a broken column would be a 500.
    assert admin_client.get(_url(Cluster, "changelist"), params).status_code == 200


def test_cluster_changelist_shows_columns(admin_client: Client, fleet: list[Cluster]) -> None:
    content = admin_client.get(_url(Cluster, "changelist")).content.decode()
    assert "cpi:cucc:nx:zw-ai01" in content
    assert "cpi:cucc:gz:gy-910c" in content
    assert "never" in content  # the 910C cluster has not sent a heartbeat
    assert " s ago" in content  # the A800 cluster's heartbeat age, in seconds


def test_search_finds_a_cluster_by_site_and_operator_name(admin_client: Client, fleet: list[Cluster]) -> None:
    by_site = admin_client.get(_url(Cluster, "changelist"), {"q": "Zhongwei"}).context["cl"]
    assert by_site.result_count == 2
    by_cpi = admin_client.get(_url(Cluster, "changelist"), {"q": "gy-910c"}).context["cl"]
    assert [c.cpi for c in by_cpi.result_list] == ["cpi:cucc:gz:gy-910c"]
    by_name = admin_client.get(_url(Cluster, "changelist"), {"q": "Unicom"}).context["cl"]
    assert by_name.result_count == 2


def _changelist_queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(_url(Cluster, "changelist"))
    assert response.status_code == 200
    return len(queries)


def test_cluster_changelist_queries_do_not_grow_with_clusters(
    admin_client: Client, operator: Organisation
) -> None:
    other = OperatorFactory(slug="ctyun", name="China Telecom Cloud")
    chips = ["nvidia-a800-sxm4-80gb", "huawei-ascend-910b3", "huawei-ascend-910c"]
    hubs = ["nx", "gz", "nmg", "gs"]
    for i in range(3):
        make_cluster(operator=operator, hub=hubs[i % 4], name=f"c{i:02d}", accelerator=chips[i % 3])
    few = _changelist_queries(admin_client)
    for i in range(3, 30):
        owner = operator if i % 2 else other
        make_cluster(operator=owner, hub=hubs[i % 4], name=f"c{i:02d}", accelerator=chips[i % 3])
    many = _changelist_queries(admin_client)
    assert Cluster.objects.count() == 30
    assert many == few


@pytest.mark.parametrize("model", [Island, ClusterStatusChange, HubLatency])
def test_other_big_changelists_do_not_grow_with_rows(
    admin_client: Client, operator: Organisation, model: type[Model]
) -> None:
    make_cluster(operator=operator, name="c00")
    with CaptureQueriesContext(connection) as few:
        admin_client.get(_url(model, "changelist"))
    for i in range(1, 10):
        make_cluster(operator=operator, name=f"c{i:02d}")
    with CaptureQueriesContext(connection) as many:
        admin_client.get(_url(model, "changelist"))
    assert len(many) == len(few)


def _action(client: Client, action: str, clusters: list[Cluster], reason: str = "rack maintenance") -> None:
    response = client.post(
        _url(Cluster, "changelist"),
        {"action": action, "_selected_action": [c.pk for c in clusters], "reason": reason, "index": 0},
    )
    assert response.status_code == 302


def _staff_changes(user: AbstractBaseUser) -> list[tuple[str, str, str, str]]:
    return [
        (change.cluster.cpi, change.from_status, change.to_status, change.reason)
        for change in ClusterStatusChange.objects.filter(actor_user=user)
        .select_related("cluster")
        .order_by("pk")
    ]


def test_status_actions_go_through_the_service_and_record_the_staff_user(
    admin_client: Client, admin_user: AbstractBaseUser, fleet: list[Cluster]
) -> None:
    a800, chip910c = fleet

    _action(admin_client, "mark_draining", [a800])
    _action(admin_client, "take_offline", [a800, chip910c], reason="power work")
    _action(admin_client, "reactivate", [a800])

    assert _staff_changes(admin_user) == [
        ("cpi:cucc:nx:zw-ai01", "active", "draining", "rack maintenance (staff, admin)"),
        ("cpi:cucc:gz:gy-910c", "active", "offline", "power work (staff, admin)"),
        ("cpi:cucc:nx:zw-ai01", "draining", "offline", "power work (staff, admin)"),
        ("cpi:cucc:nx:zw-ai01", "offline", "active", "rack maintenance (staff, admin)"),
    ]
    by_people = admin_client.get(_url(ClusterStatusChange, "changelist"), {"actor": "user"}).context["cl"]
    assert by_people.result_count == 4
    by_platform = admin_client.get(_url(ClusterStatusChange, "changelist"), {"actor": "system"}).context["cl"]
    assert {c.reason for c in by_platform.result_list} == {"registered"}
    change = ClusterStatusChange.objects.filter(actor_user=admin_user).latest("pk")
    assert change.actor_label == f"user {admin_user.get_username()}"
    a800.refresh_from_db()
    chip910c.refresh_from_db()
    assert (a800.status, a800.offline_cause) == (ClusterStatus.ACTIVE, "")
    assert (chip910c.status, chip910c.offline_cause) == (ClusterStatus.OFFLINE, Cluster.OfflineCause.STAFF)


def test_status_action_without_a_reason_changes_nothing(
    admin_client: Client, admin_user: AbstractBaseUser, fleet: list[Cluster]
) -> None:
    _action(admin_client, "take_offline", fleet, reason="  ")
    assert _staff_changes(admin_user) == []
    assert set(Cluster.objects.values_list("status", flat=True)) == {ClusterStatus.ACTIVE}


def test_status_action_reports_a_refused_transition_and_writes_nothing_for_it(
    admin_client: Client, admin_user: AbstractBaseUser, fleet: list[Cluster]
) -> None:
    a800, _ = fleet
    services.cluster_status_set(
        actor=Actor.system("test"), cluster=a800, status=ClusterStatus.RETIRED, reason="end of life"
    )
    response = admin_client.post(
        _url(Cluster, "changelist"),
        {"action": "take_offline", "_selected_action": [a800.pk], "reason": "x", "index": 0},
        follow=True,
    )
    assert "retired" in " ".join(str(m) for m in response.context["messages"])
    assert _staff_changes(admin_user) == []


def test_cluster_cannot_be_added_or_deleted_and_status_is_read_only(
    admin_client: Client, fleet: list[Cluster]
) -> None:
    a800 = fleet[0]
    assert admin_client.get(_url(Cluster, "add")).status_code == 403
    assert admin_client.get(_url(Cluster, "delete", a800.pk)).status_code == 403
    form = admin_client.get(_url(Cluster, "change", a800.pk)).context["adminform"].form
    assert set(form.fields) == {"site", "endpoint_url"}


def _inline_management(prefix: str) -> dict[str, str]:
    return {f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0", f"{prefix}-MAX_NUM_FORMS": "1000"}


def test_cluster_site_change_goes_through_the_service(admin_client: Client, fleet: list[Cluster]) -> None:
    a800 = fleet[0]
    data = {
        "site": "Zhongwei West",
        "endpoint_url": a800.endpoint_url,
        **_inline_management("islands"),
        **_inline_management("status_changes"),
    }
    response = admin_client.post(_url(Cluster, "change", a800.pk), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    a800.refresh_from_db()
    assert a800.site == "Zhongwei West"
    assert a800.cpi == "cpi:cucc:nx:zw-ai01"


@pytest.mark.parametrize("model", [Island, ClusterStatusChange])
def test_history_and_islands_are_read_only(
    admin_client: Client, fleet: list[Cluster], model: type[Model]
) -> None:
    obj = model._default_manager.order_by("pk").first()
    assert obj is not None
    assert admin_client.get(_url(model, "add")).status_code == 403
    assert admin_client.get(_url(model, "delete", obj.pk)).status_code == 403
    response = admin_client.post(_url(model, "change", obj.pk), {})
    assert response.status_code == 403


def test_issued_identifiers_are_read_only(admin_client: Client, fleet: list[Cluster]) -> None:
    issued = IssuedIdentifier.objects.get(cpi="cpi:cucc:nx:zw-ai01")
    assert admin_client.get(_url(IssuedIdentifier, "delete", issued.pk)).status_code == 403
    assert (
        admin_client.post(_url(IssuedIdentifier, "change", issued.pk), {"kind": "island"}).status_code == 403
    )


def test_accelerator_list_shows_factor_and_unknown_marker(admin_client: Client, db: None) -> None:
    content = admin_client.get(_url(Accelerator, "changelist")).content.decode()
    assert "Std-card factor (÷ 400, v1)" in content
    assert "0.78" in content  # A800: 312 / 400
    assert ">unknown<" in content  # e.g. Ascend 910C: no published FP16 figure


def test_accelerator_change_page_shows_factor_against_the_current_standard(
    admin_client: Client, db: None
) -> None:
    a800 = Accelerator.objects.get(slug="nvidia-a800-sxm4-80gb")
    content = admin_client.get(_url(Accelerator, "change", a800.pk)).content.decode()
    assert "0.7800 (against standard card v1, 400.000 TFLOPS)" in content
    chip910c = Accelerator.objects.get(slug="huawei-ascend-910c")
    assert (
        "unknown — not public" in admin_client.get(_url(Accelerator, "change", chip910c.pk)).content.decode()
    )


def test_latency_change_form_records_a_measurement_through_the_service(
    admin_client: Client, db: None
) -> None:
    row = HubLatency.objects.get(source__code="nx", target__code="yrd")
    measured_at = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    response = admin_client.post(
        _url(HubLatency, "change", row.pk),
        {
            "latency_ms": "18.250",
            "measured_at_0": timezone.localtime(measured_at).strftime("%Y-%m-%d"),
            "measured_at_1": timezone.localtime(measured_at).strftime("%H:%M:%S"),
            "also_reverse": "on",
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    pairs = HubLatency.objects.filter(source__code__in=["nx", "yrd"], target__code__in=["nx", "yrd"]).exclude(
        source=F("target")
    )
    assert {(r.source.code, r.target.code, r.latency_ms, r.origin, r.measured_at) for r in pairs} == {
        ("nx", "yrd", Decimal("18.250"), "measured", measured_at),
        ("yrd", "nx", Decimal("18.250"), "measured", measured_at),
    }
    assert admin_client.get(_url(HubLatency, "add")).status_code == 403


def test_standard_card_in_force_is_frozen_and_new_versions_start_in_the_future(
    admin_client: Client, db: None
) -> None:
    v1 = StandardCard.objects.get(version=1)
    form = admin_client.get(_url(StandardCard, "change", v1.pk)).context["adminform"].form
    assert set(form.fields) == {"note"}
    assert admin_client.get(_url(StandardCard, "delete", v1.pk)).status_code == 403

    past = admin_client.post(
        _url(StandardCard, "add"),
        {
            "version": "2",
            "dense_fp16_tflops": "500",
            "effective_from_0": "2020-01-01",
            "effective_from_1": "00:00:00",
        },
    )
    assert past.status_code == 200
    assert "never retroactively" in str(past.context["adminform"].form.errors)
    assert not StandardCard.objects.filter(version=2).exists()


def test_human_duration() -> None:
    assert [human_duration(s) for s in [0, 42, 60, 303, 3600, 7500, 86_400, 100_000, -5]] == [
        "0 s",
        "42 s",
        "1 min",
        "5 min 3 s",
        "1 h",
        "2 h 5 min",
        "1 d",
        "1 d 3 h",
        "0 s",
    ]
