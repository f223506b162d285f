"""The production server's master loads the broker's market before it forks its workers (config/prefork.py):
each worker starts with it, quotes from it at once, and follows what changed after the master read it."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from benchmarks.prodserver import Server, free_port, production_env, production_server
from broker.catalog import epoch, market
from core.models import Organisation
from core.services import api_token_create
from federation.models import Cluster
from tests.broker.factories import make_job, make_lease

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

READY = "broker market ready for the workers"


def database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def metric(server: Server, name: str) -> float:
    code, _, raw = server.request("GET", "/metrics")
    assert code == 200
    line = next(line for line in raw.decode().splitlines() if line.startswith(f"{name} "))
    return float(line.split()[1])


def quoted_clusters(server: Server, secret: str, *, start: Any) -> list[str]:
    """A job that fits only at ``start`` (a 2-hour window for 2 hours of 8 cards), quoted: the clusters
    offered."""
    auth = {"Authorization": f"Bearer {secret}"}
    job = {
        "name": "pretrain",
        "cards": 8,
        "origin_hub": "yrd",
        "latency_budget_ms": 30,
        "earliest_start_at": start.isoformat(),
        "deadline_at": (start + timedelta(hours=2)).isoformat(),
        "duration_seconds": 7200,
    }
    code, _, raw = server.request("POST", "/api/v1/jobs", body=job, headers=auth)
    assert code == 201, raw
    job_id = json.loads(raw)["id"]
    code, _, raw = server.request("POST", f"/api/v1/jobs/{job_id}/quotes", body={}, headers=auth)
    assert code == 201, raw
    return [quote["cluster"] for quote in json.loads(raw)["quotes"]]


def run_server(tmp_path: Path, **extra: str) -> Any:
    log = tmp_path / "server.log"
    env = production_env(
        database_url=database_url(),
        port=free_port(),
        extra={"WEB_CONCURRENCY": "2", "CARDHOUR_BENCH_SERVER_LOG": str(log), **extra},
    )
    return production_server(env), log


def test_workers_start_with_the_masters_market_and_follow_later_lease_changes(
    tmp_path: Path, funded_buyer: Organisation, east_cluster: Cluster
) -> None:
    _, secret = api_token_create(organisation=funded_buyer, name="sdk", scope="read_write")
    start = timezone.now().replace(microsecond=0) + timedelta(hours=3)
    context, log = run_server(tmp_path)
    with context as server:
        # Both workers were forked from a master that had loaded the market: it was loaded once.
        assert {metric(server, "cardhour_broker_market_inherited") for _ in range(8)} == {1.0}
        assert 0 <= metric(server, "cardhour_broker_catalogue_age_seconds") < 60
        assert quoted_clusters(server, secret, start=start) == [east_cluster.cpi]

        # Both islands taken for the window after the master read the market: no worker may still offer
        # them (the hold book catches up from the master's last lease change).
        for island in ("isl-01", "isl-02"):
            make_lease(
                job=make_job(buyer=funded_buyer), cluster=east_cluster, cards=8, start_at=start, island=island
            )
        time.sleep(0.3)  # a worker's book asks for lease changes at most every 0.2 s
        for _ in range(4):
            assert quoted_clusters(server, secret, start=start) == []
    lines = log.read_text().splitlines()
    assert sum(READY in line for line in lines) == 1, lines


def test_with_preloading_off_each_worker_loads_its_own(
    tmp_path: Path, funded_buyer: Organisation, east_cluster: Cluster
) -> None:
    _, secret = api_token_create(organisation=funded_buyer, name="sdk", scope="read_write")
    start = timezone.now().replace(microsecond=0) + timedelta(hours=3)
    context, log = run_server(tmp_path, CARDHOUR_PRELOAD_MARKET="0")
    with context as server:
        assert {metric(server, "cardhour_broker_market_inherited") for _ in range(8)} == {0.0}
        assert quoted_clusters(server, secret, start=start) == [east_cluster.cpi]
    assert READY not in log.read_text()


# --- In one process -------------------------------------------------------------------------------------


def test_preparing_loads_once_per_ttl_and_reads_the_hold_book_whole_again_after(
    funded_buyer: Organisation, east_cluster: Cluster, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 5
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    make_lease(job=make_job(buyer=funded_buyer), cluster=east_cluster, cards=3, start_at=start)
    market.reset()
    try:
        market.prepare_for_fork()
        catalogue, book = market.catalogue, market.holds
        assert catalogue is not None and east_cluster.pk in catalogue.cluster_id.tolist()
        assert book.loaded and book.cards[: book._size].tolist() == [3]
        assert not market.inherited  # prepared in this very process
        market.prepare_for_fork()  # within the TTL: nothing again
        assert (market.catalogue, market.holds) == (catalogue, book)

        make_lease(job=make_job(buyer=funded_buyer), cluster=east_cluster, cards=2, start_at=start)
        market.prepared_at -= 5  # a fork one TTL later
        market.prepare_for_fork()
        assert market.holds is not book
        assert sorted(market.holds.cards[: market.holds._size].tolist()) == [2, 3]
        # A quote then reads from what was prepared, caught up with what changed since.
        make_lease(job=make_job(buyer=funded_buyer), cluster=east_cluster, cards=1, start_at=start)
        market._holds_refreshed_at -= 1  # the book asks for changes at most every 0.2 s
        _, holds = market.view(start=epoch(start), end=epoch(start + timedelta(hours=1)))
        assert sorted(holds[3].tolist()) == [1, 2, 3]
    finally:
        market.reset()


def test_preparing_with_a_zero_ttl_loads_nothing(settings) -> None:  # type: ignore[no-untyped-def]
    settings.CARDHOUR_BROKER_CATALOG_TTL_SECONDS = 0
    market.reset()
    market.prepare_for_fork()
    assert market.catalogue is None and market.prepared_in is None
