"""The heartbeat monitor's mass-miss hold: most of the fleet missing heartbeats at once, across hubs, is the
platform failing to read them; the monitor takes nobody offline, says so, and staff can override."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from core.models import Organisation
from core.types import Actor
from federation import selectors, services
from federation.models import Cluster, ClusterStatus, ClusterStatusChange
from federation.selectors import HubHeartbeats, heartbeat_hold_applies
from federation.types import IslandReport
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db

HUBS = ("nx", "gz", "yrd")
# A small fleet (3 hubs × 4 clusters) with the hold's minimum scaled down to it.
HOLD = {
    "CARDHOUR_HEARTBEAT_HOLD_MIN_CLUSTERS": 6,
    "CARDHOUR_HEARTBEAT_HOLD_HUB_SHARE": 0.05,
    "CARDHOUR_HEARTBEAT_HOLD_FLEET_SHARE": 0.75,
}


def hub(code: str, clusters: int, missing: int) -> HubHeartbeats:
    return HubHeartbeats(hub=code, clusters=clusters, overdue=missing, missing=missing)


# --- the rule ------------------------------------------------------------------------------------------


@override_settings(**HOLD)
@pytest.mark.parametrize(
    ("hubs", "holding"),
    [
        pytest.param([hub("nx", 4, 4), hub("gz", 4, 4), hub("yrd", 4, 4)], True, id="everyone-silent"),
        pytest.param([hub("nx", 40, 2), hub("gz", 40, 2), hub("yrd", 40, 2)], True, id="uniform-5pc"),
        pytest.param([hub("nx", 40, 1), hub("gz", 40, 1), hub("yrd", 40, 4)], False, id="too-few-missing"),
        pytest.param(
            [hub("nx", 4, 4), hub("gz", 4, 0), hub("yrd", 4, 4)], False, id="two-of-three-hubs-down"
        ),
        pytest.param(
            [hub("nx", 100, 100), hub("gz", 10, 0), hub("yrd", 10, 0)], True, id="most-of-fleet-in-one"
        ),
        pytest.param([hub("nx", 40, 40), hub("gz", 40, 40), hub("yrd", 1, 0)], True, id="tiny-healthy-hub"),
        pytest.param([hub("nx", 40, 1), hub("gz", 40, 40), hub("yrd", 40, 40)], False, id="one-hub-healthy"),
        pytest.param([], False, id="no-fleet"),
    ],
)
def test_the_hold_rule(hubs: list[HubHeartbeats], holding: bool) -> None:
    assert heartbeat_hold_applies(hubs) is holding


@override_settings(**{**HOLD, "CARDHOUR_HEARTBEAT_HOLD_MIN_CLUSTERS": 0})
def test_a_minimum_of_zero_turns_the_hold_off() -> None:
    assert heartbeat_hold_applies([hub("nx", 400, 400), hub("gz", 400, 400)]) is False


def test_the_default_minimum_keeps_small_fleets_failing_over() -> None:
    """49 of 49 clusters silent is below the default minimum (50): each is failed over as before."""
    assert heartbeat_hold_applies([hub("nx", 25, 25), hub("gz", 24, 24)]) is False
    assert heartbeat_hold_applies([hub("nx", 25, 25), hub("gz", 25, 25)]) is True


# --- the monitor ---------------------------------------------------------------------------------------


@pytest.fixture
def fleet(operator: Organisation) -> dict[str, list[Cluster]]:
    """4 clusters in each of 3 hubs, every one beating at ``NOW`` - 10 s."""
    clusters = {
        code: [make_cluster(operator=operator, hub=code, name=f"c{n}") for n in range(4)] for code in HUBS
    }
    Cluster.objects.update(last_heartbeat_at=timezone.now() - timedelta(seconds=10))
    return clusters


def silence(clusters: list[Cluster], *, seconds: int = 200) -> None:
    Cluster.objects.filter(pk__in=[c.pk for c in clusters]).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=seconds)
    )


def statuses() -> dict[str, str]:
    return dict(Cluster.objects.values_list("cpi", "status"))


@override_settings(**HOLD)
def test_everyone_silent_at_once_takes_nobody_offline_and_says_so(
    fleet: dict[str, list[Cluster]], caplog: pytest.LogCaptureFixture
) -> None:
    silence([c for clusters in fleet.values() for c in clusters])

    with caplog.at_level(logging.ERROR, logger="cardhour.federation.heartbeats"):
        assert services.clusters_mark_missed_heartbeats() == []

    assert set(statuses().values()) == {ClusterStatus.ACTIVE}
    assert not ClusterStatusChange.objects.filter(to_status=ClusterStatus.OFFLINE).exists()
    [record] = caplog.records
    assert "heartbeat monitor holding: 12 of 12 clusters missing heartbeats" in record.getMessage()
    assessment = selectors.heartbeat_monitor_assess()
    assert (assessment.holding, assessment.overdue, assessment.missing, assessment.clusters) == (
        True,
        12,
        12,
        12,
    )
    assert [(h.hub, h.clusters, h.overdue) for h in assessment.hubs] == [
        ("gz", 4, 4),
        ("nx", 4, 4),
        ("yrd", 4, 4),
    ]


@override_settings(**HOLD)
def test_one_hub_down_is_failed_over(fleet: dict[str, list[Cluster]]) -> None:
    silence(fleet["nx"] + fleet["gz"][:1])  # a hub outage and one more cluster: 5 missing, below the minimum

    taken = services.clusters_mark_missed_heartbeats()

    assert sorted(taken) == sorted(c.cpi for c in fleet["nx"] + fleet["gz"][:1])
    assert selectors.heartbeat_monitor_assess().holding is False


@override_settings(**{**HOLD, "CARDHOUR_HEARTBEAT_HOLD_MIN_CLUSTERS": 2})
def test_two_of_three_hubs_down_is_failed_over(fleet: dict[str, list[Cluster]]) -> None:
    """The hubs that look down carry 2/3 of the fleet, under the 3/4 that makes it look like the platform."""
    silence(fleet["nx"] + fleet["gz"])

    assert len(services.clusters_mark_missed_heartbeats()) == 8


@override_settings(**HOLD)
def test_clusters_taken_offline_within_the_window_still_count_so_the_hold_is_not_crept_past(
    fleet: dict[str, list[Cluster]],
) -> None:
    """Overload makes beats late a few at a time: the first few go offline (too few to hold), and they
    keep counting as missing for the missed-beat window, so the next few tip the fleet into the hold."""
    first = [clusters[0] for clusters in fleet.values()]
    silence(first)
    assert sorted(services.clusters_mark_missed_heartbeats()) == sorted(c.cpi for c in first)

    second = [clusters[1] for clusters in fleet.values()]
    silence(second)
    assert services.clusters_mark_missed_heartbeats() == []
    assessment = selectors.heartbeat_monitor_assess()
    assert (assessment.holding, assessment.overdue, assessment.missing) == (True, 3, 6)
    assert {c.cpi: s for c in second for s in [statuses()[c.cpi]]} == {c.cpi: "active" for c in second}

    # Once the first ones went offline longer ago than the window, they are old news: the rest go too.
    later = timezone.now() + timedelta(seconds=91)
    Cluster.objects.exclude(pk__in=[c.pk for c in first + second]).update(last_heartbeat_at=later)
    assert sorted(services.clusters_mark_missed_heartbeats(now=later)) == sorted(c.cpi for c in second)


@override_settings(**HOLD)
def test_the_hold_ends_when_beats_return_and_the_truly_dead_go_offline(
    fleet: dict[str, list[Cluster]], operator: Organisation
) -> None:
    everyone = [c for clusters in fleet.values() for c in clusters]
    silence(everyone)
    assert services.clusters_mark_missed_heartbeats() == []

    dead = fleet["yrd"][3]
    sent = timezone.now()
    for cluster in everyone:
        if cluster != dead:
            services.heartbeat_record(
                actor=Actor(organisation=operator, system_label="agent"),
                cluster=cluster,
                sent_at=sent,
                health="ok",
                islands=[IslandReport("isl-01", 64, 0)],
            )

    assert services.clusters_mark_missed_heartbeats() == [dead.cpi]
    assert statuses()[dead.cpi] == ClusterStatus.OFFLINE


@override_settings(**HOLD)
def test_staff_override_takes_the_chosen_overdue_clusters_offline_and_records_who_and_why(
    fleet: dict[str, list[Cluster]], admin_user: User, operator: Organisation
) -> None:
    silence([c for clusters in fleet.values() for c in clusters])
    chosen = fleet["nx"][:2]
    fresh = fleet["gz"][0]
    Cluster.objects.filter(pk=fresh.pk).update(last_heartbeat_at=timezone.now())

    taken = services.clusters_mark_missed_heartbeats(
        override=Actor(organisation=None, user=admin_user),
        override_reason="Ningxia power cut confirmed by the operator",
        cluster_ids=[c.pk for c in chosen] + [fresh.pk],
    )

    assert sorted(taken) == sorted(c.cpi for c in chosen)  # a cluster that is beating is never taken
    changes = ClusterStatusChange.objects.filter(to_status=ClusterStatus.OFFLINE)
    assert {(c.cluster.cpi, c.actor_user, c.actor_label) for c in changes} == {
        (c.cpi, admin_user, f"user {admin_user.get_username()}") for c in chosen
    }
    assert {c.reason for c in changes} == {
        "missed 3 heartbeats (interval 30 s); mass-miss hold overridden: Ningxia power cut confirmed by the operator"
    }
    cluster = Cluster.objects.get(pk=chosen[0].pk)
    assert (cluster.offline_cause, cluster.status_before_offline) == (
        Cluster.OfflineCause.HEARTBEAT,
        "active",
    )
    assert cluster.offline_at is not None
    # Taken offline as the monitor would: its next beat brings it back.
    result = services.heartbeat_record(
        actor=Actor(organisation=operator, system_label="agent"),
        cluster=cluster,
        sent_at=timezone.now(),
        health="ok",
        islands=[],
    )
    assert (result.applied, result.status) == (True, ClusterStatus.ACTIVE)


def test_status_changes_to_offline_record_when(fleet: dict[str, list[Cluster]]) -> None:
    cluster = fleet["nx"][0]
    before = timezone.now()
    services.cluster_status_set(
        actor=Actor.system("test"), cluster=cluster, status=ClusterStatus.OFFLINE, reason="power work"
    )
    cluster.refresh_from_db()
    assert cluster.offline_at is not None and cluster.offline_at >= before


# --- what staff see ----------------------------------------------------------------------------------


def _changelist() -> str:
    return reverse("admin:federation_cluster_changelist")


@override_settings(**HOLD)
def test_the_admin_warns_while_holding_and_its_override_action_needs_a_reason(
    admin_client: Client, admin_user: User, fleet: dict[str, list[Cluster]]
) -> None:
    quiet = admin_client.get(_changelist())
    assert "heartbeat monitor is holding" not in quiet.content.decode()

    silence([c for clusters in fleet.values() for c in clusters])
    page = admin_client.get(_changelist()).content.decode()
    assert "The heartbeat monitor is holding: 12 of 12 clusters are missing heartbeats" in page
    assert "Take offline for missed heartbeats" in page

    chosen = [c.pk for c in fleet["gz"]]
    refused = admin_client.post(
        _changelist(),
        {"action": "take_offline_missed_heartbeats", "_selected_action": chosen, "reason": " ", "index": 0},
        follow=True,
    )
    assert "Give a reason to override the heartbeat monitor" in refused.content.decode()
    assert set(statuses().values()) == {ClusterStatus.ACTIVE}

    done = admin_client.post(
        _changelist(),
        {
            "action": "take_offline_missed_heartbeats",
            "_selected_action": chosen,
            "reason": "hub dark",
            "index": 0,
        },
        follow=True,
    )
    assert "Taken offline for missed heartbeats: 4 cluster(s)" in done.content.decode()
    assert {statuses()[c.cpi] for c in fleet["gz"]} == {ClusterStatus.OFFLINE}
    assert ClusterStatusChange.objects.filter(actor_user=admin_user, to_status="offline").count() == 4


@override_settings(**HOLD)
def test_metrics_show_overdue_clusters_and_the_hold(client: Client, fleet: dict[str, list[Cluster]]) -> None:
    text = client.get("/metrics").content.decode()
    assert "cardhour_clusters_heartbeat_overdue 0.0" in text
    assert "cardhour_heartbeat_monitor_holding 0.0" in text

    silence([c for clusters in fleet.values() for c in clusters])
    text = client.get("/metrics").content.decode()
    assert "cardhour_clusters_heartbeat_overdue 12.0" in text
    assert "cardhour_heartbeat_monitor_holding 1.0" in text
