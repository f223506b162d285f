"""Batches of heartbeats (``POST /api/v1/heartbeats``) held to the single-beat endpoint they stand in for.

Every scenario of the single endpoint (tests/federation/test_heartbeat_paths.py) is sent both ways: alone to
``/clusters/{cpi}/heartbeats``, and in a batch beside a good beat of another cluster. A beat the single
endpoint takes or refuses with a domain error (404, 409, 400 from the service) has, in the batch, the same
answer in its place and the same rows, and the other beat is applied; a body the single endpoint's serializer
refuses makes the whole batch a 400 that writes nothing. On PostgreSQL the usual beats go through one
statement for the batch; on SQLite every beat takes the single-beat path.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from core.api.strict import JsonBody
from core.types import Actor
from federation import services
from federation.api.views import HeartbeatApi, HeartbeatBatchApi, _heartbeat_batch_plain
from federation.models import Cluster, Island
from federation.types import HeartbeatResult, IslandReport
from tests.factories import make_cluster
from tests.federation.test_heartbeat_paths import CPI, SCENARIOS, T0, _answer, _effects, body, line

pytestmark = pytest.mark.django_db

BATCH_URL = "/api/v1/heartbeats"
OTHER = "cpi:cucc:nx:zw-ai02"


def _companion() -> dict[str, Any]:
    return {"cpi": OTHER, **body(islands=[line("isl-01", available_cards=5, unhealthy_cards=0)])}


@pytest.mark.parametrize(("description", "data", "setup", "url"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_a_beat_in_a_batch_answers_and_writes_as_it_would_alone(
    api, operator, other_operator, description, data, setup, url
):
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32)])
    companion = make_cluster(operator=operator, name="zw-ai02", islands=[("isl-01", 8)])
    make_cluster(operator=other_operator, islands=[("isl-01", 8)])
    setup(cluster, operator)
    cpi = url.removeprefix("/api/v1/clusters/").removesuffix("/heartbeats")

    with transaction.atomic():
        alone = api.post(url, data, format="json")
        alone_effects = _effects(cluster)
        transaction.set_rollback(True)
    before = (_effects(cluster), _effects(companion))

    batch = api.post(BATCH_URL, {"beats": [{"cpi": cpi, **data}, _companion()]}, format="json")

    if not HeartbeatApi.Input(data=JsonBody(data)).is_valid():  # the body itself is wrong: the whole batch
        assert batch.status_code == 400, batch.json()
        assert (_effects(cluster), _effects(companion)) == before
        return
    assert batch.status_code == 200, batch.json()
    first, second = batch.json()["results"]
    if alone.status_code == 200:
        single = _answer(alone.json())
        single.pop("interval_seconds")
        assert first == {**single, "error": None}
    else:
        error = _answer(alone.json())
        first["error"] = _answer(first["error"])  # the server's clock is in a clock-skew error
        assert first == {"cpi": cpi, "status": None, "applied": False, "detail": "", "error": error}
        assert alone_effects == before[0]  # the refused beat wrote nothing either way
    assert _effects(cluster) == alone_effects
    assert second == {"cpi": OTHER, "status": "active", "applied": True, "detail": "", "error": None}
    assert Island.objects.get(cluster=companion, name="isl-01").available_cards == 5


def test_a_batch_applies_many_clusters_in_request_order_and_answers_one_result_each(api, operator):
    clusters = [
        make_cluster(operator=operator, name=f"zw-ai{i:02d}", islands=[("isl-01", 8)]) for i in range(5)
    ]
    beats = [
        {"cpi": c.cpi, **body(islands=[line("isl-01", available_cards=i, unhealthy_cards=1)])}
        for i, c in enumerate(clusters)
    ][::-1]

    response = api.post(BATCH_URL, {"beats": beats}, format="json")

    assert response.status_code == 200, response.json()
    payload = response.json()
    assert [r["cpi"] for r in payload["results"]] == [b["cpi"] for b in beats]
    assert all(r["applied"] and r["error"] is None for r in payload["results"])
    assert payload["interval_seconds"] == 30
    for i, c in enumerate(clusters):
        c.refresh_from_db()
        assert (c.available_cards, c.last_heartbeat_sent_at, c.health) == (i, T0, "ok")
        assert Island.objects.get(cluster=c).unhealthy_cards == 1

    again = api.post(BATCH_URL, {"beats": beats}, format="json")  # a retry: acknowledged, nothing changes

    assert [(r["applied"], r["detail"]) for r in again.json()["results"]] == [(False, "stale")] * 5


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"beats": []}, "invalid"),
        ({}, "invalid"),
        ({"beats": "x"}, "invalid"),
        ({"beats": [{"cpi": CPI, **body(health="great")}, _companion()]}, "invalid"),
        ({"beats": [body()]}, "invalid"),  # no cpi
        ({"beats": [{"cpi": CPI, **body()}, {"cpi": CPI, **body()}]}, "duplicate_cluster"),
    ],
    ids=["empty", "no beats", "not a list", "one beat invalid", "no cpi", "a cluster twice"],
)
def test_a_body_that_is_not_a_valid_batch_is_refused_whole(api, operator, payload, code):
    cluster = make_cluster(operator=operator, islands=[("isl-01", 64), ("isl-02", 32)])
    companion = make_cluster(operator=operator, name="zw-ai02", islands=[("isl-01", 8)])
    before = (_effects(cluster), _effects(companion))

    response = api.post(BATCH_URL, payload, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["code"] in (
        {code, "validation_error", "invalid_input"} if code == "invalid" else {code}
    )
    assert (_effects(cluster), _effects(companion)) == before


def test_more_beats_than_the_batch_takes_are_refused(api, operator, settings):
    beats = [
        {"cpi": f"cpi:cucc:nx:c{i}", **body()}
        for i in range(HeartbeatBatchApi.Input._declared_fields["beats"].max_length + 1)
    ]  # type: ignore[attr-defined]

    response = api.post(BATCH_URL, {"beats": beats}, format="json")

    assert response.status_code == 400
    assert "beats" in str(response.json())


def test_a_buyer_token_cannot_send_heartbeats(token_client, operator):
    from tests.factories import BuyerFactory

    make_cluster(operator=operator)
    response = token_client(BuyerFactory(slug="acme")).post(
        BATCH_URL, {"beats": [{"cpi": CPI, **body()}]}, format="json"
    )
    assert response.status_code == 403


BATCH_BODIES: list[tuple[Any, bool]] = [
    ({"beats": [{"cpi": CPI, **body()}]}, True),
    ({"beats": [{"cpi": CPI, **body()}, _companion()]}, True),
    (
        {"beats": [{"cpi": "cpi:cucc:nx:nowhere", **body(sent_at="2099-01-01T00:00:00Z")}]},
        True,
    ),  # the service's
    ({"beats": [{"cpi": CPI, **body()}], "extra": 1}, False),
    ({"beats": []}, False),
    ({"beats": [{"cpi": " " + CPI, **body()}]}, False),
    ({"beats": [{"cpi": "x" * 141, **body()}]}, False),
    ({"beats": [{"cpi": 7, **body()}]}, False),
    ({"beats": [{"cpi": CPI, **body(health="great")}]}, False),
    ({"beats": [[CPI]]}, False),
]


@pytest.mark.parametrize(("data", "plain_expected"), BATCH_BODIES, ids=range(len(BATCH_BODIES)))
def test_plain_batch_path_agrees_with_the_serializer(data, plain_expected):
    serializer = HeartbeatBatchApi.Input(data=JsonBody(data))
    valid = serializer.is_valid()
    plain = _heartbeat_batch_plain(JsonBody(data))
    assert (plain is not None) == plain_expected
    if plain is not None:
        assert valid, serializer.errors
        expected = serializer.validated_data["beats"]
        assert [(b.cpi, b.sent_at, b.health, list(b.islands)) for b in plain] == [
            (e["cpi"], e["sent_at"], e["health"], [IslandReport(**i) for i in e["islands"]]) for e in expected
        ]


def _record_alone(
    actor: Actor, operator: Any, beat: services.HeartbeatBeat, now: datetime
) -> HeartbeatResult:
    """``beat`` through the single-beat service, as a batch would apply it on its own."""
    return services.heartbeat_record_for_operator(
        actor=actor,
        operator=operator,
        cpi=beat.cpi,
        sent_at=beat.sent_at,
        health=beat.health,
        islands=beat.islands,
        now=now,
    )


def test_service_batch_matches_beats_one_at_a_time(operator):
    """The batch statement (PostgreSQL) against the single-beat service, beat by beat, over a mixed batch: new,
    stale, retired, back from the monitor's offline, unknown island, a cluster not there."""
    actor = Actor(organisation=operator, system_label="agent")
    names = ["a1", "a2", "a3", "a4", "a5"]
    clusters = {
        n: make_cluster(operator=operator, name=n, islands=[("isl-01", 16), ("isl-02", 8)]) for n in names
    }
    services.heartbeat_record(
        actor=actor, cluster=clusters["a2"], sent_at=T0 + timedelta(minutes=1), health="ok", islands=[]
    )
    services.cluster_status_set(actor=actor, cluster=clusters["a3"], status="retired", reason="t")
    Cluster.objects.filter(pk=clusters["a4"].pk).update(last_heartbeat_at=T0)
    assert services.clusters_mark_missed_heartbeats(now=T0 + timedelta(minutes=5)) == [clusters["a4"].cpi]
    lines = [IslandReport("isl-01", 3, 1), IslandReport("isl-02", 2)]
    beats = [
        services.HeartbeatBeat(cpi=c.cpi, sent_at=T0, health="degraded", islands=lines)
        for c in clusters.values()
    ]
    beats[4] = services.HeartbeatBeat(
        cpi=clusters["a5"].cpi, sent_at=T0, health="ok", islands=[IslandReport("isl-09", 1)]
    )
    beats.append(services.HeartbeatBeat(cpi="cpi:cucc:nx:nowhere", sent_at=T0, health="ok", islands=[]))
    now = T0 + timedelta(minutes=6)

    def effects() -> list[Any]:
        return [_effects(c) for c in clusters.values()]

    def outcome_key(outcome: services.HeartbeatOutcome) -> Any:
        error = outcome.error
        return (outcome.cpi, outcome.result, error and (error.code, error.message, error.extra))

    with transaction.atomic():
        one_by_one = []
        for beat in beats:
            try:
                with transaction.atomic():
                    result = _record_alone(actor, operator, beat, now)
                one_by_one.append(services.HeartbeatOutcome(cpi=beat.cpi, result=result))
            except Exception as exc:
                one_by_one.append(services.HeartbeatOutcome(cpi=beat.cpi, error=exc))  # type: ignore[arg-type]
        single_effects = effects()
        transaction.set_rollback(True)

    batched = services.heartbeats_record_batch(actor=actor, operator=operator, beats=beats, now=now)

    assert [outcome_key(o) for o in batched] == [outcome_key(o) for o in one_by_one]
    assert effects() == single_effects
    assert [o.result.applied if o.result else o.error.code for o in batched] == [  # type: ignore[union-attr]
        True,
        False,
        "cluster_retired",
        True,
        "unknown_island",
        "cluster_not_found",
    ]


def test_a_batch_of_beats_reporting_some_islands_totals_each_cluster_as_beats_one_at_a_time(operator):
    """Beats that report some of their cluster's islands, none, or all, in one batch: each cluster's available
    cards (the reported islands as reported, the others as they were) and every island are what the
    single-beat service writes, beat by beat. On PostgreSQL the batch statement groups these per cluster once
    for the whole batch."""
    actor = Actor(organisation=operator, system_label="agent")
    islands = [("isl-01", 16), ("isl-02", 8), ("isl-03", 4)]
    clusters = [make_cluster(operator=operator, name=f"p{i}", islands=islands) for i in range(5)]
    # Cards available before the batch differ per island, so an island left out is visible in the total.
    for i, cluster in enumerate(clusters):
        for island, available in zip(
            Island.objects.filter(cluster=cluster).order_by("name"), (16 - i, 7, 3 - i % 2), strict=True
        ):
            Island.objects.filter(pk=island.pk).update(available_cards=available)
    reports = [
        [IslandReport("isl-01", 5, 1)],
        [IslandReport("isl-02", 0, 8), IslandReport("isl-03", 4)],
        [],
        [IslandReport("isl-01", 16), IslandReport("isl-02", 8), IslandReport("isl-03", 0, 4)],
        [IslandReport("isl-03", 1)],
    ]
    beats = [
        services.HeartbeatBeat(cpi=c.cpi, sent_at=T0, health="ok", islands=lines)
        for c, lines in zip(clusters, reports, strict=True)
    ]
    now = T0 + timedelta(seconds=5)

    with transaction.atomic():
        for beat in beats:
            _record_alone(actor, operator, beat, now)
        one_by_one = [_effects(c) for c in clusters]
        transaction.set_rollback(True)

    batched = services.heartbeats_record_batch(actor=actor, operator=operator, beats=beats, now=now)

    assert [o.result.applied for o in batched] == [True] * 5  # type: ignore[union-attr]
    assert [_effects(c) for c in clusters] == one_by_one
    assert [Cluster.objects.get(pk=c.pk).available_cards for c in clusters] == [
        5 + 7 + 3,
        15 + 0 + 4,
        14 + 7 + 3,
        16 + 8 + 0,
        12 + 7 + 1,
    ]


@pytest.mark.django_db(transaction=True)
def test_two_batches_naming_the_same_clusters_in_opposite_orders_both_finish(operator):
    """Real concurrent transactions (PostgreSQL): the statement locks a batch's clusters in id order, so two
    batches over the same clusters, listed in opposite orders, serialise instead of deadlocking."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    actor = Actor(organisation=operator, system_label="agent")
    clusters = [make_cluster(operator=operator, name=f"r{i}", islands=[("isl-01", 8)]) for i in range(30)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def send(order: list[Cluster], minute: int) -> None:
        try:
            barrier.wait()
            beats = [
                services.HeartbeatBeat(
                    cpi=c.cpi,
                    sent_at=T0 + timedelta(minutes=minute),
                    health="ok",
                    islands=[IslandReport("isl-01", minute)],
                )
                for c in order
            ]
            outcomes = services.heartbeats_record_batch(
                actor=actor, operator=operator, beats=beats, now=T0 + timedelta(minutes=10)
            )
            assert all(o.error is None for o in outcomes)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=send, args=(clusters, 1)),
        threading.Thread(target=send, args=(clusters[::-1], 2)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for c in clusters:  # the newer beat wins, whichever batch committed first
        c.refresh_from_db()
        assert c.last_heartbeat_sent_at == T0 + timedelta(minutes=2)
        assert c.available_cards == 2


def test_batch_sent_at_keeps_its_offset_and_microseconds(operator):
    actor = Actor(organisation=operator, system_label="agent")
    cluster = make_cluster(operator=operator, islands=[("isl-01", 8)])
    at = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC) + timedelta(hours=0)
    services.heartbeats_record_batch(
        actor=actor,
        operator=operator,
        beats=[services.HeartbeatBeat(cpi=cluster.cpi, sent_at=at, health="ok", islands=[])],
        now=at + timedelta(seconds=1),
    )
    cluster.refresh_from_db()
    assert cluster.last_heartbeat_sent_at == at
    later = services.heartbeats_record_batch(
        actor=actor,
        operator=operator,
        beats=[services.HeartbeatBeat(cpi=cluster.cpi, sent_at=at, health="ok", islands=[])],
        now=at + timedelta(seconds=2),
    )
    assert later[0].result is not None and later[0].result.detail == "stale"  # the same instant is not newer


def test_usual_beats_cost_the_same_queries_however_many_on_postgresql(operator, monkeypatch):
    """No query per beat: on PostgreSQL the usual beats of a batch are one statement, never the single-beat
    path (on SQLite every beat takes that path)."""
    from django.test.utils import CaptureQueriesContext

    actor = Actor(organisation=operator, system_label="agent")
    clusters = [make_cluster(operator=operator, name=f"q{i:02d}", islands=[("isl-01", 8)]) for i in range(20)]
    single_calls: list[str] = []
    record = services.heartbeat_record_for_operator
    monkeypatch.setattr(
        services, "heartbeat_record_for_operator", lambda **kw: single_calls.append(kw["cpi"]) or record(**kw)
    )
    counts = []
    for minute, size in ((1, 2), (2, 20)):
        beats = [
            services.HeartbeatBeat(
                cpi=c.cpi,
                sent_at=T0 + timedelta(minutes=minute),
                health="ok",
                islands=[IslandReport("isl-01", 1)],
            )
            for c in clusters[:size]
        ]
        with CaptureQueriesContext(connection) as queries:
            outcomes = services.heartbeats_record_batch(
                actor=actor, operator=operator, beats=beats, now=T0 + timedelta(minutes=10)
            )
        assert all(o.result is not None and o.result.applied for o in outcomes)
        counts.append(len(queries))
    if connection.vendor == "postgresql":
        assert single_calls == []
        assert counts[0] == counts[1]
    else:
        assert len(single_calls) == 22
