"""Authorisation matrix: an operator can change only its own clusters and islands; another operator's
objects answer 404 (not 403) and stay untouched."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.services import api_token_create
from federation.models import Cluster, ClusterStatusChange, Island
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db

CPI = "cpi:cucc:nx:zw-ai01"

WRITES = [
    ("PATCH", f"/api/v1/clusters/{CPI}", {"site": "stolen", "status": "retired"}),
    ("POST", f"/api/v1/clusters/{CPI}/islands", {"name": "isl-99", "cards": 8, "fabric": "nvlink"}),
    ("PATCH", f"/api/v1/clusters/{CPI}/islands/isl-01", {"cards": 1}),
    (
        "POST",
        f"/api/v1/clusters/{CPI}/heartbeats",
        {
            "sent_at": "2026-11-21T10:00:00Z",
            "health": "critical",
            "islands": [{"name": "isl-01", "available_cards": 0}],
        },
    ),
]
READS = [
    f"/api/v1/clusters/{CPI}",
    f"/api/v1/clusters/{CPI}/status-history",
]


def snapshot() -> tuple:
    cluster = Cluster.objects.get(cpi=CPI)
    islands = tuple(
        Island.objects.filter(cluster=cluster)
        .order_by("name")
        .values_list("name", "cards", "available_cards")
    )
    return (
        cluster.site,
        cluster.status,
        cluster.health,
        cluster.last_heartbeat_at,
        islands,
        ClusterStatusChange.objects.count(),
    )


@pytest.mark.parametrize(("method", "url", "payload"), WRITES, ids=[f"{m} {u}" for m, u, _ in WRITES])
def test_other_operator_cannot_write_and_gets_404(operator, other_api, method, url, payload):
    make_cluster(operator=operator, islands=[("isl-01", 64)])
    before = snapshot()

    response = other_api.generic(
        method, url, data=__import__("json").dumps(payload), content_type="application/json"
    )

    assert response.status_code == 404, response.json()
    assert response.json()["code"] == "cluster_not_found"
    assert snapshot() == before


@pytest.mark.parametrize(("method", "url", "payload"), WRITES, ids=[f"{m} {u}" for m, u, _ in WRITES])
def test_owner_can_write(operator, api, method, url, payload):
    make_cluster(operator=operator, islands=[("isl-01", 64)])
    response = api.generic(
        method, url, data=__import__("json").dumps(payload), content_type="application/json"
    )
    assert response.status_code in {200, 201}, response.json()


@pytest.mark.parametrize("url", READS)
def test_other_operator_management_reads_are_404(operator, other_api, url):
    make_cluster(operator=operator)
    response = other_api.get(url)
    assert response.status_code == 404
    assert response.json()["code"] == "cluster_not_found"


def test_missing_and_foreign_clusters_are_indistinguishable(operator, other_api):
    make_cluster(operator=operator)
    foreign = other_api.patch(f"/api/v1/clusters/{CPI}", {"site": "x"}, format="json")
    missing = other_api.patch("/api/v1/clusters/cpi:cucc:nx:nope", {"site": "x"}, format="json")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["code"] == missing.json()["code"]


def test_other_operator_cannot_register_under_my_segment(other_api):
    response = other_api.post(
        "/api/v1/clusters",
        {
            "cpi": CPI,
            "site": "x",
            "accelerator": "nvidia-a800-sxm4-80gb",
            "islands": [{"name": "i", "cards": 1, "fabric": "pcie"}],
        },
        format="json",
    )
    assert response.status_code == 403
    assert response.json()["code"] == "identifier_operator_mismatch"
    assert not Cluster.objects.exists()


def test_other_operator_cannot_revoke_my_token(api, other_api, other_operator):
    token_id = api.get("/api/v1/tokens").json()["results"][0]["id"]
    # A plain token may not manage tokens at all; one that may still cannot reach another organisation's.
    assert other_api.delete(f"/api/v1/tokens/{token_id}").status_code == 403
    _, secret = api_token_create(organisation=other_operator, name="manager", can_manage_tokens=True)
    manager = APIClient()
    manager.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert manager.delete(f"/api/v1/tokens/{token_id}").status_code == 404
    assert api.get("/api/v1/me").status_code == 200


def test_latency_measurements_come_only_from_hubs_the_operator_runs(api):
    response = api.post(
        "/api/v1/hub-latencies/measurements",
        {
            "measurements": [
                {"source": "nx", "target": "jjj", "latency_ms": "1", "measured_at": "2026-11-21T10:00:00Z"}
            ]
        },
        format="json",
    )
    assert response.status_code == 403
    assert response.json()["code"] == "latency_source_not_operated"


def test_anonymous_gets_401_everywhere(client, operator):
    make_cluster(operator=operator)
    for url in [
        "/api/v1/clusters",
        f"/api/v1/clusters/{CPI}",
        f"/api/v1/resolve/{CPI}",
        "/api/v1/hubs",
        "/api/v1/tokens",
    ]:
        response = client.get(url)
        assert response.status_code == 401, url
        assert response.json()["code"] == "not_authenticated"
