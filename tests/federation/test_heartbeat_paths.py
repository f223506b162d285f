"""The heartbeat's fast paths held to the paths they stand in for.

* The view reads a plainly valid body without the Input serializer (``_heartbeat_plain``): the same
  validated values, and for every body, valid or not, the same status, JSON answer and database effects as
  the serializer's path.
* On PostgreSQL the service writes a beat in one statement; the ORM's writes (the portable path, SQLite's)
  must leave the same rows and answer the same.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction

from core.api.strict import JsonBody
from core.models import Organisation
from core.types import Actor
from federation import services
from federation.api import views
from federation.api.views import HeartbeatApi, _heartbeat_plain
from federation.models import Cluster, ClusterStatusChange, Island
from federation.types import IslandReport
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db

CPI = "cpi:cucc:nx:zw-ai01"
URL = f"/api/v1/clusters/{CPI}/heartbeats"
T0 = datetime(2026, 11, 21, 2, 0, tzinfo=UTC)


def body(**overrides: Any) -> dict[str, Any]:
    return {
        "sent_at": "2026-11-21T10:00:00+08:00",
        "health": "ok",
        "islands": [
            {"name": "isl-01", "available_cards": 40, "unhealthy_cards": 2},
            {"name": "isl-02", "available_cards": 30, "unhealthy_cards": 0},
        ],
        **overrides,
    }


def line(name: Any = "isl-01", **overrides: Any) -> dict[str, Any]:
    return {"name": name, "available_cards": 10, "unhealthy_cards": 1, **overrides}


def without(key: str, data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


# Bodies around the edges of what the plain path takes, and whether it takes them: a body it takes gives the
# serializer's validated data; every other body (each error among them) goes to the serializer.
PLAIN_PATH_BODIES: list[tuple[dict[str, Any], bool]] = [
    (body(), True),
    (body(sent_at="2026-11-21T02:00:00Z"), True),
    (body(sent_at="2026-11-21T02:00:00.123456+00:00"), True),
    (body(sent_at="2026-11-21 10:00:00+08:00"), True),
    (body(health="degraded"), True),
    (body(health="critical"), True),
    (body(islands=[]), True),
    (without("islands", body()), True),
    (body(islands=[without("unhealthy_cards", line())]), True),
    (body(islands=[line(available_cards=0, unhealthy_cards=0)]), True),
    (body(islands=[line(available_cards=1_000_000)]), True),
    (body(extra="ignored", islands=[line(extra=1)]), True),
    (body(islands=[line(), line()]), True),  # a name twice, an unknown name, too many cards: the service's
    (body(islands=[line("isl-99")]), True),
    (body(islands=[line(available_cards=65)]), True),
    (body(sent_at="2099-01-01T00:00:00Z"), True),  # the clock-skew check is the service's
    (body(sent_at="2026-11-21T10:00:00"), False),  # naive
    (body(sent_at="yesterday"), False),
    (body(sent_at="2026-13-40T10:00:00Z"), False),
    (body(sent_at=1763690400), False),
    (body(sent_at=None), False),
    (without("sent_at", body()), False),
    (body(health="unknown"), False),
    (body(health="great"), False),
    (body(health="OK"), False),
    (body(health=None), False),
    (without("health", body()), False),
    (body(islands=None), False),
    (body(islands="isl-01"), False),
    (body(islands=[["isl-01", 10]]), False),
    (body(islands=[line(available_cards=-1)]), False),
    (body(islands=[line(unhealthy_cards=-1)]), False),
    (body(islands=[line(available_cards=1_000_001)]), False),
    (body(islands=[line(available_cards=10**12)]), False),
    (body(islands=[line(available_cards=True)]), False),
    (body(islands=[line(available_cards=1.0)]), False),
    (body(islands=[line(available_cards="1")]), False),
    (body(islands=[line(available_cards=None)]), False),
    (body(islands=[without("available_cards", line())]), False),
    (body(islands=[line(unhealthy_cards=None)]), False),
    (body(islands=[line(" isl-01")]), False),
    (body(islands=[line("ISL-01")]), False),
    (body(islands=[line("isl_01")]), False),
    (body(islands=[line("-isl")]), False),
    (body(islands=[line("x" * 33)]), False),
    (body(islands=[line("")]), False),
    (body(islands=[line("isl-\x00")]), False),
    (body(islands=[line("島-01")]), False),
    (body(islands=[line(7)]), False),
    (body(islands=[without("name", line())]), False),
]


@pytest.mark.parametrize(("data", "plain_expected"), PLAIN_PATH_BODIES, ids=range(len(PLAIN_PATH_BODIES)))
def test_plain_heartbeat_path_agrees_with_the_serializer(data, plain_expected):
    serializer = HeartbeatApi.Input(data=JsonBody(data))
    valid = serializer.is_valid()
    plain = _heartbeat_plain(JsonBody(data))
    assert (plain is not None) == plain_expected
    if plain is not None:
        assert valid, serializer.errors
        expected = serializer.validated_data
        assert plain["sent_at"] == expected["sent_at"]
        assert plain["sent_at"].utcoffset() == expected["sent_at"].utcoffset()
        assert plain["health"] == expected["health"]
        assert plain["islands"] == [IslandReport(**item) for item in expected["islands"]]


def test_plain_heartbeat_path_leaves_too_many_lines_to_the_serializer():
    # The plain path reads the bound from the declaration (CARDHOUR_MAX_ISLANDS_PER_CLUSTER when it was built).
    bound = HeartbeatApi.Input._declared_fields["islands"].max_length  # type: ignore[attr-defined]
    data = JsonBody(body(islands=[line(f"isl-{i:02d}") for i in range(bound + 1)]))
    assert _heartbeat_plain(data) is None
    assert not HeartbeatApi.Input(data=data).is_valid()


# --- The view: fast path against the serializer's, over the API -------------------------------------------


def _previous_beat(sent_at: str) -> Any:
    def setup(cluster: Cluster, operator: Organisation) -> None:
        services.heartbeat_record(
            actor=Actor(organisation=operator, system_label="agent"),
            cluster=cluster,
            sent_at=datetime.fromisoformat(sent_at),
            health="degraded",
            islands=[IslandReport("isl-01", 50, 1), IslandReport("isl-02", 20, 0)],
        )

    return setup


def _offline_by_monitor(before: str) -> Any:
    def setup(cluster: Cluster, operator: Organisation) -> None:
        if before != "active":
            services.cluster_status_set(
                actor=Actor(organisation=operator), cluster=cluster, status=before, reason="test"
            )
        Cluster.objects.filter(pk=cluster.pk).update(last_heartbeat_at=T0)
        assert services.clusters_mark_missed_heartbeats(now=T0 + timedelta(minutes=5)) == [CPI]

    return setup


def _status(status: str) -> Any:
    def setup(cluster: Cluster, operator: Organisation) -> None:
        services.cluster_status_set(
            actor=Actor(organisation=operator), cluster=cluster, status=status, reason="t"
        )

    return setup


def _nothing(cluster: Cluster, operator: Organisation) -> None:
    pass


# (description, body, setup, URL): each runs through both paths of the view.
SCENARIOS: list[tuple[str, dict[str, Any], Any, str]] = [
    ("every island", body(), _nothing, URL),
    (
        "one island: the other keeps its figures",
        body(islands=[line("isl-02", available_cards=3)]),
        _nothing,
        URL,
    ),
    ("no islands", body(islands=[]), _nothing, URL),
    ("islands left out", without("islands", body()), _nothing, URL),
    ("unhealthy left out", body(islands=[without("unhealthy_cards", line())]), _nothing, URL),
    ("everything free", body(islands=[line(available_cards=64, unhealthy_cards=0)]), _nothing, URL),
    ("after a beat", body(health="critical"), _previous_beat("2026-11-21T01:59:00+00:00"), URL),
    ("stale", body(), _previous_beat("2026-11-21T02:00:01+00:00"), URL),
    ("as old as the last", body(), _previous_beat("2026-11-21T02:00:00+00:00"), URL),
    (
        "stale with an unknown island: acknowledged",
        body(islands=[line("isl-99")]),
        _previous_beat("2026-11-21T03:00:00+00:00"),
        URL,
    ),
    ("back from the monitor's offline", body(), _offline_by_monitor("active"), URL),
    ("back to draining", body(islands=[]), _offline_by_monitor("draining"), URL),
    ("the operator's offline stays", body(), _status("offline"), URL),
    ("draining stays", body(), _status("draining"), URL),
    ("retired", body(), _status("retired"), URL),
    ("retired, stale-looking body", body(sent_at="2000-01-01T00:00:00Z"), _status("retired"), URL),
    ("unknown island", body(islands=[line("isl-99"), line("isl-98")]), _nothing, URL),
    ("unknown and twice", body(islands=[line("isl-99"), line(), line()]), _nothing, URL),
    ("twice", body(islands=[line(), line()]), _nothing, URL),
    ("more free than cards", body(islands=[line(available_cards=65, unhealthy_cards=0)]), _nothing, URL),
    (
        "free + unhealthy > cards, one good line",
        body(islands=[line("isl-02", available_cards=1), line(available_cards=60, unhealthy_cards=5)]),
        _nothing,
        URL,
    ),
    (
        "one island over, another fine",
        body(islands=[line(), line("isl-02", available_cards=33)]),
        _nothing,
        URL,
    ),
    ("a count past PostgreSQL's integer", body(islands=[line(available_cards=2**31)]), _nothing, URL),
    ("a count of 10**12", body(islands=[line(available_cards=10**12)]), _nothing, URL),
    ("negative", body(islands=[line(available_cards=-1)]), _nothing, URL),
    ("from the future", body(sent_at="2099-01-01T00:00:00Z"), _nothing, URL),
    ("from the future, retired", body(sent_at="2099-01-01T00:00:00Z"), _status("retired"), URL),
    ("naive time", body(sent_at="2026-11-21T10:00:00"), _nothing, URL),
    ("unknown health", body(health="great"), _nothing, URL),
    ("a string count", body(islands=[line(available_cards="8")]), _nothing, URL),
    ("a bad island name", body(islands=[line("ISL 01")]), _nothing, URL),
    ("not an object", body(islands=["isl-01"]), _nothing, URL),
    ("another operator's cluster", body(), _nothing, "/api/v1/clusters/cpi:cmcc:nx:zw-ai01/heartbeats"),
    ("a cluster that is not there", body(), _nothing, "/api/v1/clusters/cpi:cucc:nx:nowhere/heartbeats"),
    ("not a cluster identifier", body(), _nothing, f"/api/v1/clusters/{CPI}:isl-01/heartbeats"),
    (
        "an invalid body for a missing cluster",
        body(health="great"),
        _nothing,
        "/api/v1/clusters/cpi:cucc:nx:x/heartbeats",
    ),
]


def _answer(payload: dict[str, Any]) -> dict[str, Any]:
    # The server's clock is in the answer (and in the clock-skew error); everything else must be equal.
    payload = dict(payload)
    payload.pop("server_time", None)
    if isinstance(payload.get("extra"), dict):
        payload["extra"] = {k: v for k, v in payload["extra"].items() if k != "server_time"}
    return payload


def _effects(cluster: Cluster) -> tuple[Any, ...]:
    row: dict[str, Any] = dict(
        Cluster.objects.filter(pk=cluster.pk).values(
            "status",
            "status_before_offline",
            "offline_cause",
            "health",
            "total_cards",
            "available_cards",
            "last_heartbeat_sent_at",
            "last_heartbeat_at",
        )[0]
    )
    row["last_heartbeat_at"] = row["last_heartbeat_at"] is not None  # the server's clock
    islands = list(
        Island.objects.filter(cluster=cluster)
        .order_by("name")
        .values_list("name", "cards", "available_cards", "unhealthy_cards", "reported_at")
    )
    history = list(
        ClusterStatusChange.objects.filter(cluster=cluster)
        .order_by("pk")
        .values_list("from_status", "to_status", "actor_label", "actor_token_id", "reason")
    )
    return row, islands, history


@pytest.mark.parametrize(("description", "data", "setup", "url"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_fast_and_serializer_paths_answer_and_write_alike(
    api, operator, other_operator, monkeypatch, description, data, setup, url
):
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32)])
    make_cluster(operator=other_operator, islands=[("isl-01", 8)])
    setup(cluster, operator)
    outcomes = []
    fast_calls: list[str] = []
    record = services.heartbeat_record_for_operator

    def spy(**kwargs: Any) -> Any:
        fast_calls.append(kwargs["cpi"])
        return record(**kwargs)

    for plain in (True, False):
        with transaction.atomic():
            if plain:
                monkeypatch.setattr(services, "heartbeat_record_for_operator", spy)
            else:
                monkeypatch.setattr(views, "_heartbeat_plain", lambda data: None)
            response = api.post(url, data, format="json")
            outcomes.append((response.status_code, _answer(response.json()), _effects(cluster)))
            transaction.set_rollback(True)
        monkeypatch.undo()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][2] == _effects(cluster) or outcomes[0][0] == 200  # an error wrote nothing
    assert bool(fast_calls) == (_heartbeat_plain(JsonBody(data)) is not None)  # the fast path was taken


def test_fast_path_writes_what_was_reported(api, operator):
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32), ("isl-03", 8)])

    response = api.post(URL, body(), format="json")

    assert response.status_code == 200, response.json()
    assert _answer(response.json()) == {
        "cpi": CPI,
        "status": "active",
        "applied": True,
        "detail": "",
        "interval_seconds": 30,
    }
    assert datetime.fromisoformat(response.json()["server_time"].replace("Z", "+00:00")).tzinfo is not None
    row, islands, _ = _effects(cluster)
    assert (row["health"], row["available_cards"], row["last_heartbeat_sent_at"]) == ("ok", 40 + 30 + 8, T0)
    assert islands == [
        ("isl-01", 64, 40, 2, T0),
        ("isl-02", 32, 30, 0, T0),
        ("isl-03", 8, 8, 0, None),
    ]


# --- The service: PostgreSQL's statement against the ORM's writes ------------------------------------------

SERVICE_BEATS: list[tuple[str, list[IslandReport], Any]] = [
    ("every island", [IslandReport("isl-01", 40, 2), IslandReport("isl-02", 30, 1)], _nothing),
    ("one island", [IslandReport("isl-02", 0, 32)], _nothing),
    ("none", [], _nothing),
    ("back from offline", [IslandReport("isl-01", 1)], _offline_by_monitor("draining")),
    ("unknown", [IslandReport("isl-09", 1), IslandReport("isl-01", 1)], _nothing),
    ("twice", [IslandReport("isl-01", 1), IslandReport("isl-01", 2)], _nothing),
    ("too many", [IslandReport("isl-01", 1), IslandReport("isl-02", 30, 3)], _nothing),
    ("negative", [IslandReport("isl-01", -1)], _nothing),
    ("past an integer", [IslandReport("isl-01", 2**40)], _nothing),
    ("a name off the grammar", [IslandReport("isl-01\x00", 1)], _nothing),
    (
        "a name off the grammar, and a good line",
        [IslandReport("isl-02", 1), IslandReport("ISL-01", 1)],
        _nothing,
    ),
    ("retired", [IslandReport("isl-01", 1)], _status("retired")),
]


@pytest.mark.parametrize(("description", "lines", "setup"), SERVICE_BEATS, ids=[b[0] for b in SERVICE_BEATS])
def test_postgres_statement_and_portable_writes_agree(operator, monkeypatch, description, lines, setup):
    """On PostgreSQL, the one-statement write against the ORM's (the portable path, forced); on SQLite both
    runs take the portable path."""
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32)])
    setup(cluster, operator)
    actor = Actor(organisation=operator, system_label="agent")
    outcomes = []
    for statement in (True, False):
        with transaction.atomic():
            if not statement:
                monkeypatch.setattr(services, "_heartbeat_write_postgres", lambda **kwargs: False)
            try:
                result: Any = services.heartbeat_record_for_operator(
                    actor=actor, operator=operator, cpi=CPI, sent_at=T0, health="ok", islands=lines, now=T0
                )
            except Exception as exc:  # the error itself is what is compared
                result = (
                    type(exc).__name__,
                    str(exc),
                    getattr(exc, "code", None),
                    getattr(exc, "extra", None),
                )
            outcomes.append((result, _effects(cluster)))
            transaction.set_rollback(True)
        monkeypatch.undo()
    assert outcomes[0] == outcomes[1]
