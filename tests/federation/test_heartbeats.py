"""Heartbeats: K2 reports, ordering, and the monitor's offline → back cycle with recorded history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from core.types import Actor
from federation import services
from federation.models import Cluster, ClusterStatusChange, Island
from federation.types import IslandReport
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db

CPI = "cpi:cucc:nx:zw-ai01"
URL = f"/api/v1/clusters/{CPI}/heartbeats"
T0 = datetime(2026, 11, 21, 2, 0, tzinfo=UTC)


def beat(api, sent_at: str = "2026-11-21T10:00:00+08:00", health: str = "ok", islands=None):
    payload = {
        "sent_at": sent_at,
        "health": health,
        "islands": islands or [{"name": "isl-01", "available_cards": 40, "unhealthy_cards": 2}],
    }
    return api.post(URL, payload, format="json")


def test_heartbeat_updates_k2_and_health(api, operator):
    make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32)])

    response = beat(api)

    assert response.status_code == 200, response.json()
    assert response.json()["applied"] is True
    assert response.json()["interval_seconds"] == 30
    cluster = Cluster.objects.get(cpi=CPI)
    assert cluster.health == "ok"
    assert cluster.available_cards == 40 + 32  # isl-02 not reported: keeps its last value
    island = Island.objects.get(cpi=f"{CPI}:isl-01")
    assert (island.available_cards, island.unhealthy_cards) == (40, 2)
    assert island.reported_at == datetime(2026, 11, 21, 2, 0, tzinfo=UTC)


def test_older_heartbeat_is_acknowledged_but_ignored(api, operator):
    make_cluster(operator=operator, islands=[("isl-01", 64)])
    assert beat(api, sent_at="2026-11-21T10:00:30+08:00").json()["applied"] is True

    late = beat(api, sent_at="2026-11-21T10:00:00+08:00", islands=[{"name": "isl-01", "available_cards": 1}])

    assert late.status_code == 200
    assert late.json()["applied"] is False
    assert Island.objects.get(cpi=f"{CPI}:isl-01").available_cards == 40


def test_beats_give_the_same_answers_when_their_statements_are_prepared(api, operator, prepare_threshold):
    """The lock and the write of a beat are bound by PostgreSQL, and production prepares them: run past the
    threshold, beats still apply, the older one is still ignored, and an unknown island still refused."""
    make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32)])
    for second, free in ((10, 40), (20, 30), (30, 20)):
        response = beat(
            api,
            sent_at=f"2026-11-21T10:00:{second}+08:00",
            islands=[{"name": "isl-01", "available_cards": free, "unhealthy_cards": 1}],
        )
        assert response.status_code == 200 and response.json()["applied"] is True
    late = beat(api, sent_at="2026-11-21T10:00:15+08:00", islands=[{"name": "isl-01", "available_cards": 1}])
    assert late.status_code == 200 and late.json()["applied"] is False
    unknown = beat(
        api, sent_at="2026-11-21T10:00:40+08:00", islands=[{"name": "isl-99", "available_cards": 1}]
    )
    assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_island"
    island = Island.objects.get(cpi=f"{CPI}:isl-01")
    assert (island.available_cards, island.unhealthy_cards) == (20, 1)
    assert Cluster.objects.get(cpi=CPI).available_cards == 20 + 32


BAD_BEATS = [
    ("naive time", {"sent_at": "2026-11-21T10:00:00"}, "invalid"),
    ("unknown health", {"health": "great"}, "invalid"),
    ("unknown island", {"islands": [{"name": "isl-99", "available_cards": 1}]}, "unknown_island"),
    ("more free than cards", {"islands": [{"name": "isl-01", "available_cards": 65}]}, "invalid_heartbeat"),
    (
        "free + unhealthy > cards",
        {"islands": [{"name": "isl-01", "available_cards": 60, "unhealthy_cards": 5}]},
        "invalid_heartbeat",
    ),
    ("negative", {"islands": [{"name": "isl-01", "available_cards": -1}]}, "invalid"),
    (
        "island twice",
        {"islands": [{"name": "isl-01", "available_cards": 1}, {"name": "isl-01", "available_cards": 2}]},
        "invalid_heartbeat",
    ),
    ("from the future", {"sent_at": "2099-01-01T00:00:00Z"}, "invalid_heartbeat"),
]


@pytest.mark.parametrize(("description", "override", "code"), BAD_BEATS, ids=[b[0] for b in BAD_BEATS])
def test_bad_heartbeat_is_400_and_changes_nothing(api, operator, description, override, code):
    make_cluster(operator=operator, islands=[("isl-01", 64)])
    payload = {
        "sent_at": "2026-11-21T10:00:00+08:00",
        "health": "ok",
        "islands": [{"name": "isl-01", "available_cards": 40}],
    }
    payload.update(override)

    response = api.post(URL, payload, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    cluster = Cluster.objects.get(cpi=CPI)
    assert (cluster.health, cluster.last_heartbeat_at, cluster.available_cards) == ("unknown", None, 64)


@override_settings(CARDHOUR_HEARTBEAT_INTERVAL_SECONDS=30, CARDHOUR_HEARTBEAT_MISSED_LIMIT=3)
def test_missed_heartbeats_take_cluster_offline_and_beats_bring_it_back(operator):
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64)])
    agent = Actor(organisation=operator, system_label="agent")
    services.heartbeat_record(
        actor=agent, cluster=cluster, sent_at=T0, health="ok", islands=[IslandReport("isl-01", 64)], now=T0
    )

    # Two intervals and a half of silence: still active (three must be missed).
    assert services.clusters_mark_missed_heartbeats(now=T0 + timedelta(seconds=89)) == []
    assert Cluster.objects.get(pk=cluster.pk).status == "active"

    assert services.clusters_mark_missed_heartbeats(now=T0 + timedelta(seconds=91)) == [CPI]
    cluster.refresh_from_db()
    assert (cluster.status, cluster.offline_cause, cluster.status_before_offline) == (
        "offline",
        "heartbeat",
        "active",
    )
    # Running the monitor again does nothing more.
    assert services.clusters_mark_missed_heartbeats(now=T0 + timedelta(seconds=200)) == []

    result = services.heartbeat_record(
        actor=agent,
        cluster=cluster,
        sent_at=T0 + timedelta(seconds=300),
        health="ok",
        islands=[],
        now=T0 + timedelta(seconds=300),
    )
    assert result.status == "active"
    history = list(
        ClusterStatusChange.objects.filter(cluster=cluster)
        .order_by("pk")
        .values_list("from_status", "to_status", "actor_label", "reason")
    )
    assert history == [
        ("", "active", "test", "registered"),
        ("active", "offline", "heartbeat monitor", "missed 3 heartbeats (interval 30 s)"),
        ("offline", "active", "agent", "heartbeats resumed"),
    ]


def test_draining_cluster_returns_to_draining(operator):
    cluster = make_cluster(operator=operator)
    actor = Actor(organisation=operator, system_label="ops")
    services.cluster_status_set(actor=actor, cluster=cluster, status="draining", reason="decommission soon")
    Cluster.objects.filter(pk=cluster.pk).update(last_heartbeat_at=T0)
    services.clusters_mark_missed_heartbeats(now=T0 + timedelta(minutes=5))
    services.heartbeat_record(
        actor=actor,
        cluster=cluster,
        sent_at=T0 + timedelta(minutes=6),
        health="ok",
        islands=[],
        now=T0 + timedelta(minutes=6),
    )
    assert Cluster.objects.get(pk=cluster.pk).status == "draining"


def test_never_beating_cluster_goes_offline_after_grace(operator):
    cluster = make_cluster(operator=operator)
    registered = Cluster.objects.get(pk=cluster.pk).registered_at
    assert services.clusters_mark_missed_heartbeats(now=registered + timedelta(seconds=60)) == []
    assert services.clusters_mark_missed_heartbeats(now=registered + timedelta(seconds=120)) == [CPI]


def test_operator_offline_is_not_undone_by_heartbeats(operator):
    cluster = make_cluster(operator=operator)
    actor = Actor(organisation=operator, system_label="ops")
    services.cluster_status_set(actor=actor, cluster=cluster, status="offline", reason="maintenance")
    services.heartbeat_record(actor=actor, cluster=cluster, sent_at=T0, health="ok", islands=[], now=T0)
    assert Cluster.objects.get(pk=cluster.pk).status == "offline"


def test_retired_clusters_are_never_marked(operator):
    cluster = make_cluster(operator=operator)
    services.cluster_status_set(
        actor=Actor(organisation=operator), cluster=cluster, status="retired", reason="gone"
    )
    assert services.clusters_mark_missed_heartbeats(now=T0 + timedelta(days=400)) == []
