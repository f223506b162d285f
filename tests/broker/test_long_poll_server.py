"""The production server (gunicorn + uvicorn workers, config.asgi) under long-polls: waiting agents hold no
thread and no database connection, so the rest of the API keeps answering, and a change made by another
process wakes them through PostgreSQL NOTIFY."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection

from benchmarks.prodserver import Server, free_port, production_env, production_server
from broker.models import Lease
from core.models import Organisation
from core.services import api_token_create
from federation.models import Cluster
from tests.broker.test_operator_api import lease_on, started

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASES = "/api/v1/operator/leases"
APP_NAME = "cardhour-server-test"
THREADS = 4
POOL_MAX = 6
WAITERS = 40  # ten times the server's threads


@pytest.fixture
def server() -> Any:
    db = connection.settings_dict
    url = (
        f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        f"?application_name={APP_NAME}"
    )
    env = production_env(
        database_url=url,
        port=free_port(),
        extra={"CARDHOUR_WSGI_THREADS": str(THREADS), "DATABASE_POOL_MAX_SIZE": str(POOL_MAX)},
    )
    with production_server(env) as running:
        yield running


def server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME])
        return int(cursor.fetchone()[0])


def test_waiting_agents_starve_nothing_and_wake_on_a_change_from_another_process(
    server: Server, east_operator: Organisation, east_cluster: Cluster, buyer: Organisation
) -> None:
    _, secret = api_token_create(organisation=east_operator, name="agent", scope="read_write")
    auth = {"Authorization": f"Bearer {secret}"}
    lease = lease_on(east_cluster, buyer)
    status, _, body = server.request("GET", LEASES, headers=auth)
    assert status == 200
    cursor = json.loads(body)["cursor"]

    answers: list[tuple[int, list[tuple[int, str]], float]] = []
    lock = threading.Lock()

    def agent() -> None:
        began = time.monotonic()
        code, _, raw = server.request("GET", f"{LEASES}?after={cursor}&wait=30", headers=auth, timeout=40)
        results = [(item["id"], item["state"]) for item in json.loads(raw)["results"]] if code == 200 else []
        with lock:
            answers.append((code, results, time.monotonic() - began))

    pool = ThreadPoolExecutor(WAITERS)
    for _ in range(WAITERS):
        pool.submit(agent)
    time.sleep(2)  # every agent is waiting by now
    assert answers == []

    # The rest of the API answers at its normal pace while 40 requests wait on 4 threads.
    slowest = 0.0
    for _ in range(20):
        began = time.monotonic()
        assert server.request("GET", "/healthz", timeout=5)[0] == 200
        slowest = max(slowest, time.monotonic() - began)
    beat = {
        "sent_at": datetime.now(UTC).isoformat(),
        "health": "ok",
        "islands": [{"name": "isl-01", "available_cards": 8, "unhealthy_cards": 0}],
    }
    code, _, raw = server.request(
        "POST", f"/api/v1/clusters/{east_cluster.cpi}/heartbeats", body=beat, headers=auth
    )
    assert code == 200, raw
    assert slowest < 1.0
    # Waiting costs no database connection: the pool's few plus the one listening connection.
    assert server_connections() <= POOL_MAX + 1
    assert answers == []

    # A change committed by this process (not the server's) wakes every agent at once.
    changed_at = time.monotonic()
    started(Lease.objects.get(pk=lease.pk), east_operator)
    pool.shutdown(wait=True)
    woke_after = time.monotonic() - changed_at

    assert len(answers) == WAITERS
    assert {code for code, _, _ in answers} == {200}
    assert all(results == [(lease.pk, "running")] for _, results, _ in answers)
    assert woke_after < 5  # far inside the wait (15–30 s): woken by NOTIFY, not by the wait running out


def waiting_on(server: Server) -> int:
    """The server's own count of waiting long-polls (its /metrics; the server has one process)."""
    code, _, raw = server.request("GET", "/metrics")
    assert code == 200
    line = next(line for line in raw.decode().splitlines() if line.startswith("cardhour_long_polls_waiting "))
    return int(float(line.split()[1]))


def test_an_agent_that_goes_away_stops_waiting_and_one_that_stays_is_answered(
    server: Server, east_operator: Organisation, east_cluster: Cluster, buyer: Organisation
) -> None:
    """The lean long-poll handler listens for the client while the request waits: a dropped connection ends
    its wait at once (no future held to the deadline); the one that stays gets its answer with the headers
    the middleware set, and the request's signals leave no database connection behind."""
    import http.client

    _, secret = api_token_create(organisation=east_operator, name="agent", scope="read_write")
    auth = {"Host": "127.0.0.1", "Authorization": f"Bearer {secret}"}
    lease = lease_on(east_cluster, buyer)
    _, _, body = server.request("GET", LEASES, headers=auth)
    cursor = json.loads(body)["cursor"]

    leaving = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=40) for _ in range(5)]
    for conn in leaving:
        conn.request("GET", f"{LEASES}?after={cursor}&wait=30", headers=auth)
    staying = http.client.HTTPConnection("127.0.0.1", server.port, timeout=40)
    staying.request("GET", f"{LEASES}?after={cursor}&wait=30", headers=auth)
    deadline = time.monotonic() + 10
    while waiting_on(server) < 6 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert waiting_on(server) == 6

    for conn in leaving:
        conn.close()
    deadline = time.monotonic() + 10
    while waiting_on(server) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert waiting_on(server) == 1

    started(Lease.objects.get(pk=lease.pk), east_operator)
    response = staying.getresponse()
    raw = response.read()
    staying.close()
    assert response.status == 200, raw
    assert response.getheader("Content-Type") == "application/json"
    assert response.getheader("Content-Length") == str(len(raw))
    assert response.getheader("X-Request-ID")  # set by the middleware before the wait, kept after it
    assert [(item["id"], item["state"]) for item in json.loads(raw)["results"]] == [(lease.pk, "running")]
    assert waiting_on(server) == 0
    # Nothing waits, so the server holds only its listening connection and what its pool keeps idle.
    assert server_connections() <= POOL_MAX + 1
