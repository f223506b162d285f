"""The matcher's catalogue is brought up to date from the rows written since it was read (broker.catalog
``_refreshed``), and the result is always what reading it whole gives.

PostgreSQL only (the refresh finds rows by ``xmin``; elsewhere the catalogue is always read whole), and with
real commits: rows written inside one test transaction all carry that transaction's id, so every refresh
would see everything as written.

The tests count whole reads, and those counts assume a quiet PostgreSQL server. A snapshot's ``xmin`` is the
oldest transaction still running anywhere on the server, in any database: while another session holds a
transaction open (a parallel test worker's, in its own database), rows this test committed before the
catalogue's read carry ids above the read's floor and look written since, so a refresh reads whole where
a quiet server would patch. That is the refresh erring on the safe side, not a fault, but it changes the
counts: run this module serially (as CI does), not under ``pytest -n``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import numpy as np
import pytest
from django.db import connection, transaction
from django.utils import timezone

from broker import catalog as catalog_module
from broker.catalog import _WATCHED, Catalogue, Market, _load_catalogue
from broker.models import ClusterReliability
from core.models import Organisation
from core.types import Actor
from federation import services
from federation.models import Cluster, HubLatency, Island
from federation.types import IslandReport, IslandSpec
from tests.factories import make_cluster
from tests.metering.factories import make_price_card

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Reads:
    """Counts the whole reads the catalogue makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.whole = 0
        real = catalog_module._read_whole

        def counted(connection):  # type: ignore[no-untyped-def]
            self.whole += 1
            return real(connection)

        monkeypatch.setattr(catalog_module, "_read_whole", counted)


def assert_same(refreshed: Catalogue, whole: Catalogue) -> None:
    """Every field a quote reads is equal (the time of the read and its source aside)."""
    for name in Catalogue.__dataclass_fields__:
        if name in ("loaded_at", "source"):
            continue
        got, expected = getattr(refreshed, name), getattr(whole, name)
        if isinstance(expected, np.ndarray):
            assert np.array_equal(got, expected, equal_nan=expected.dtype.kind == "f"), name
        else:
            assert got == expected, name
    # The derived arrays a refresh kept are the ones a whole read derives.
    for name in ("islands_by_cluster", "fabric_counts", "capacity_keys", "tariff_groups"):
        for got, expected in zip(getattr(refreshed, name), getattr(whole, name), strict=True):
            assert np.array_equal(got, expected) if isinstance(expected, np.ndarray) else got == expected, (
                name
            )
    assert refreshed.withheld_until_max == whole.withheld_until_max
    assert np.array_equal(refreshed.island_index(whole.island_id), np.arange(whole.size))


def refresh(previous: Catalogue, *, keeps_capacity_keys: bool | None = None) -> Catalogue:
    """``previous`` refreshed, checked against a whole read (and whether it kept the derived capacity keys
    of ``previous``, before the check derives them)."""
    refreshed = _load_catalogue(previous)
    if keeps_capacity_keys is not None:
        kept = refreshed.__dict__.get("_capacity_keys")
        assert (kept is not None and kept is previous.__dict__["_capacity_keys"]) == keeps_capacity_keys
    assert_same(refreshed, _load_catalogue())
    return refreshed


def beat(cluster: Cluster, *reports: IslandReport) -> None:
    services.heartbeat_record(
        actor=Actor(organisation=cluster.operator, system_label="test"),
        cluster=Cluster.objects.get(pk=cluster.pk),
        sent_at=timezone.now(),
        health="ok",
        islands=list(reports),
    )


def test_heartbeats_and_status_changes_are_patched_in(
    east_cluster: Cluster, east_operator: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = make_cluster(operator=east_operator, hub="nx", name="zw-ai02", islands=[("isl-01", 8)])
    make_price_card(cluster=second, rate="9.0000")
    first = _load_catalogue()
    assert first.source is not None
    first.capacity_keys  # noqa: B018 (derived now: a refresh that changes no capacity keeps it)
    reads = Reads(monkeypatch)

    same = refresh(first, keeps_capacity_keys=True)  # nothing written
    assert reads.whole == 1  # the comparison's own whole read
    assert same.source is not None and same.source.xid_floor >= first.source.xid_floor

    # A heartbeat: cards kept from sale (K2), one unhealthy; a cluster's last beat moves its report's expiry.
    beat(
        east_cluster, IslandReport("isl-01", available_cards=3, unhealthy_cards=1), IslandReport("isl-02", 8)
    )
    after_beat = refresh(same, keeps_capacity_keys=False)  # capacity changed: derived again
    assert reads.whole == 2
    at = after_beat.island_index(np.array([Island.objects.get(cluster=east_cluster, name="isl-01").pk]))[0]
    assert after_beat.island_capacity[at] == 7
    assert at in after_beat.withheld_island.tolist()

    # A status change (draining), then the cluster back to active.
    services.cluster_status_set(
        actor=Actor(organisation=east_operator, system_label="test"),
        cluster=second,
        status="draining",
        reason="x",
    )
    drained = refresh(after_beat)
    assert reads.whole == 3
    assert drained.cluster_status[drained.cluster_id.tolist().index(second.pk)] == "draining"
    services.cluster_status_set(
        actor=Actor(organisation=east_operator, system_label="test"),
        cluster=second,
        status="active",
        reason="x",
    )
    refresh(drained)
    assert reads.whole == 4  # every refresh here was a patch; each comparison read whole once


@pytest.mark.parametrize(
    "change",
    [
        "island added",
        "cluster registered",
        "cluster retired",
        "price card",
        "latency deleted",
        "reliability stored",
        "island fabric",
    ],
)
def test_a_change_a_patch_cannot_follow_reads_whole(
    change: str, east_cluster: Cluster, east_operator: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    actor = Actor(organisation=east_operator, system_label="test")
    first = _load_catalogue()
    reads = Reads(monkeypatch)
    if change == "island added":
        services.island_add(
            actor=actor, cluster=east_cluster, spec=IslandSpec(name="isl-03", cards=8, fabric="infiniband")
        )
    elif change == "cluster registered":
        make_cluster(operator=east_operator, hub="nx", name="zw-ai09", islands=[("isl-01", 8)])
    elif change == "cluster retired":
        services.cluster_status_set(actor=actor, cluster=east_cluster, status="retired", reason="closed")
    elif change == "price card":
        make_price_card(cluster=east_cluster, rate="13.0000", tariff_code="cn-gd")
    elif change == "latency deleted":  # a deletion leaves no row to find: the trigger records it
        HubLatency.objects.filter(
            pk=HubLatency.objects.order_by("pk").values_list("pk", flat=True)[0]
        ).delete()
    elif change == "reliability stored":
        now = timezone.now()
        ClusterReliability.objects.create(
            cluster=east_cluster,
            window_start_at=now - timedelta(days=30),
            computed_at=now,
            sold_card_seconds=3600,
            delivered_card_seconds=3510,
            interruptions=1,
            card_hours=Decimal(1),
            prior_card_hours=Decimal(100),
            prior_percent=Decimal("99.000"),
            reliability_percent=Decimal("97.500"),
        )
    elif change == "island fabric":
        Island.objects.filter(cluster=east_cluster, name="isl-01").update(fabric="roce")
    refresh(first)
    assert reads.whole == 2  # the refresh's and the comparison's


def test_a_retired_clusters_islands_stay_out(
    east_cluster: Cluster, east_operator: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of a cluster retired before the catalogue was read are written again (an operator's tool, the
    admin): they are not in the catalogue and a refresh keeps them out, without a whole read."""
    services.cluster_status_set(
        actor=Actor(organisation=east_operator, system_label="test"),
        cluster=east_cluster,
        status="retired",
        reason="closed",
    )
    first = _load_catalogue()
    reads = Reads(monkeypatch)
    Island.objects.filter(cluster=east_cluster).update(available_cards=2)
    Cluster.objects.filter(pk=east_cluster.pk).update(last_heartbeat_at=timezone.now())
    refreshed = refresh(first)
    assert reads.whole == 1
    assert east_cluster.pk not in refreshed.cluster_id.tolist()


def test_a_price_card_coming_into_force_reads_whole(
    east_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A card set for later changes the catalogue when its time comes, without a write then."""
    later = timezone.now() + timedelta(hours=1)
    make_price_card(cluster=east_cluster, rate="15.0000", tariff_code="cn-gd", effective_from=later)
    first = _load_catalogue()
    reads = Reads(monkeypatch)
    assert _load_catalogue(first).cluster_rate.tolist() == [12.0]
    assert reads.whole == 0
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=2))
    assert _load_catalogue(first).cluster_rate.tolist() == [15.0]
    assert reads.whole == 1


def test_a_write_committed_after_the_read_began_is_not_lost(east_cluster: Cluster) -> None:
    """A transaction in progress while the catalogue is read commits after: its rows are not in that read,
    and the next refresh finds them (they carry an id at or above the read's snapshot's xmin, though
    below ids that committed before the read)."""
    island = Island.objects.get(cluster=east_cluster, name="isl-02")
    written, release = threading.Event(), threading.Event()

    def slow() -> None:
        try:
            with transaction.atomic():
                Island.objects.filter(pk=island.pk).update(unhealthy_cards=5)
                written.set()
                assert release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=slow)
    thread.start()
    assert written.wait(10)
    # A later transaction commits first, so the read's snapshot is taken with the slow one still running
    # below its newest completed id (the slow one is then in the snapshot's list of running ids).
    Island.objects.filter(cluster=east_cluster, name="isl-01").update(available_cards=7)
    first = _load_catalogue()
    at = first.island_index(np.array([island.pk]))[0]
    assert first.island_capacity[at] == 8
    release.set()
    thread.join()
    assert refresh(first).island_capacity[at] == 3


def test_the_market_reloads_by_refreshing(
    east_cluster: Cluster, settings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Production (a TTL): the background reload patches the catalogue it has; a TTL of 0 reads whole."""
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5.0
    market = Market()
    first, _ = market.view(start=0, end=1)
    reads = Reads(monkeypatch)
    Island.objects.filter(cluster=east_cluster, name="isl-01").update(unhealthy_cards=8)
    first.loaded_at -= 6
    market.view(start=0, end=1)
    market.wait_for_reload(10)
    fresh, _ = market.view(start=0, end=1)
    assert fresh is not first
    assert sorted(fresh.island_capacity.tolist()) == [0, 8]
    assert reads.whole == 0
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 0.0
    market.view(start=0, end=1)
    assert reads.whole == 1


def test_every_watched_table_records_its_deletions() -> None:
    """A table the catalogue is read from without the deletion trigger would let a deleted row live on in
    every process's catalogue."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = 'broker_catalogue_deleted'"
        )
        triggered = {name for (name,) in cursor.fetchall()}
    assert triggered == {model._meta.db_table for model in _WATCHED}
