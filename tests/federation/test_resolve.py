"""Hierarchical resolution of compute identifiers at every level."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from core.types import Actor
from federation import selectors, services
from federation.models import Cluster
from federation.types import IslandReport
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(operator, other_operator):
    make_cluster(
        operator=operator,
        hub="nx",
        name="zw-ai01",
        accelerator="nvidia-h800-sxm5-80gb",
        islands=[("isl-01", 64), ("isl-02", 32)],
    )
    make_cluster(
        operator=operator,
        hub="nx",
        name="zw-ai02",
        accelerator="huawei-ascend-910b3",
        fabric="hccs",
        islands=[("isl-01", 16)],
    )
    make_cluster(
        operator=operator, hub="gz", name="gy-01", accelerator="nvidia-a800-sxm4-80gb", islands=[("a", 8)]
    )
    retired = make_cluster(operator=operator, hub="gz", name="old", islands=[("a", 8)])
    services.cluster_status_set(
        actor=Actor(organisation=operator), cluster=retired, status="retired", reason="eol"
    )
    make_cluster(operator=other_operator, hub="nx", name="zw-ai01")


def test_operator_prefix_lists_hubs_and_clusters(api, fleet):
    data = api.get("/api/v1/resolve/cpi:cucc").json()
    assert data["level"] == "operator"
    assert data["operator"] == {"slug": "cucc", "name": "China Unicom"}
    assert data["hubs"] == [
        {"hub": "gz", "clusters": 1, "total_cards": 8, "available_cards": 8},
        {"hub": "nx", "clusters": 2, "total_cards": 112, "available_cards": 112},
    ]
    assert [c["cpi"] for c in data["clusters"]["results"]] == [
        "cpi:cucc:gz:gy-01",
        "cpi:cucc:nx:zw-ai01",
        "cpi:cucc:nx:zw-ai02",
    ]
    assert data["cluster"] is None


def test_operator_hub_prefix_lists_clusters_there_paginated(api, fleet):
    data = api.get("/api/v1/resolve/cpi:cucc:nx", {"page_size": 1}).json()
    assert data["level"] == "hub"
    assert data["hubs"] is None
    assert data["clusters"]["count"] == 2
    assert [c["cpi"] for c in data["clusters"]["results"]] == ["cpi:cucc:nx:zw-ai01"]
    assert data["clusters"]["next"] is not None


def test_full_identifier_returns_resource_description(other_api, fleet):
    data = other_api.get("/api/v1/resolve/cpi:cucc:nx:zw-ai01").json()
    assert data["level"] == "cluster"
    cluster = data["cluster"]
    assert cluster["operator"] == "cucc"
    assert cluster["hub"] == "nx"
    assert cluster["chip"]["slug"] == "nvidia-h800-sxm5-80gb"
    assert cluster["chip"]["standard_card_factor"] == "2.4735"  # 989.4 / 400
    assert (cluster["total_cards"], cluster["available_cards"]) == (96, 96)
    assert Decimal(cluster["total_standard_cards"]) == Decimal("237.46")  # 96 × 2.4735
    assert [i["name"] for i in cluster["islands"]] == ["isl-01", "isl-02"]
    assert cluster["status"] == "active"
    assert cluster["last_heartbeat_at"] is None
    assert cluster["endpoint_url"] is None  # another operator's view


def test_owner_sees_endpoint(api, fleet):
    assert (
        api.get("/api/v1/resolve/cpi:cucc:nx:zw-ai01")
        .json()["cluster"]["endpoint_url"]
        .startswith("https://")
    )


def test_island_identifier(api, fleet):
    data = api.get("/api/v1/resolve/cpi:cucc:nx:zw-ai02:isl-01").json()
    assert data["level"] == "island"
    assert data["island"]["cards"] == 16
    assert data["island"]["fabric"] == "hccs"
    assert data["island"]["standard_cards"] == "12.52"  # 16 × 313/400
    assert data["cluster"]["cpi"] == "cpi:cucc:nx:zw-ai02"


def test_retired_cluster_resolves_by_full_identifier_but_is_not_listed(api, fleet):
    assert api.get("/api/v1/resolve/cpi:cucc:gz:old").json()["cluster"]["status"] == "retired"
    listed = [c["cpi"] for c in api.get("/api/v1/resolve/cpi:cucc:gz").json()["clusters"]["results"]]
    assert listed == ["cpi:cucc:gz:gy-01"]


@pytest.mark.parametrize(
    ("identifier", "status", "code"),
    [
        ("cpi:nobody", 404, "identifier_not_found"),
        ("cpi:cucc:nx:missing", 404, "identifier_not_found"),
        ("cpi:cucc:nx:zw-ai01:isl-99", 404, "identifier_not_found"),
        ("cpi:CUCC", 400, "invalid_identifier"),
        ("cpi:cucc:moon", 400, "invalid_identifier"),
        ("nonsense", 400, "invalid_identifier"),
        ("cpi:cucc:nx:zw-ai01:isl-01:extra", 400, "invalid_identifier"),
    ],
)
def test_bad_identifiers(api, fleet, identifier, status, code):
    response = api.get(f"/api/v1/resolve/{identifier}")
    assert response.status_code == status
    assert response.json()["code"] == code


def test_resolution_query_count_is_constant(api, operator, django_assert_max_num_queries):
    make_cluster(operator=operator, islands=[(f"isl-{n:02d}", 8) for n in range(40)])
    with django_assert_max_num_queries(8):
        data = api.get("/api/v1/resolve/cpi:cucc:nx:zw-ai01").json()
    assert len(data["cluster"]["islands"]) == 40


def test_resolution_shows_the_last_heartbeat_at_once(api, operator, fleet):
    """Nothing is cached between resolutions: K2 and health are those of the last beat applied."""
    before = api.get("/api/v1/resolve/cpi:cucc:nx:zw-ai01:isl-02").json()
    assert (before["cluster"]["available_cards"], before["island"]["available_cards"]) == (96, 32)

    services.heartbeat_record(
        actor=Actor(organisation=operator),
        cluster=Cluster.objects.get(cpi="cpi:cucc:nx:zw-ai01"),
        sent_at=timezone.now() - timedelta(seconds=1),
        health="ok",
        islands=[IslandReport("isl-02", available_cards=20, unhealthy_cards=4)],
    )

    after = api.get("/api/v1/resolve/cpi:cucc:nx:zw-ai01:isl-02").json()
    assert (after["cluster"]["available_cards"], after["island"]["available_cards"]) == (84, 20)
    assert after["island"]["unhealthy_cards"] == 4
    assert after["cluster"]["health"] == "ok"
    assert after["island"]["reported_at"] is not None


@pytest.mark.postgres
def test_postgresql_description_is_the_generic_one(operator, other_operator, fleet):
    """The one-statement description on PostgreSQL equals the ORM's, for every cluster, viewer and chip
    (one without published figures included), after heartbeats."""
    make_cluster(
        operator=operator, hub="gz", name="unknown-chip", accelerator="huawei-ascend-910c", fabric="hccs"
    )
    services.heartbeat_record(
        actor=Actor(organisation=operator),
        cluster=Cluster.objects.get(cpi="cpi:cucc:nx:zw-ai01"),
        sent_at=timezone.now() - timedelta(seconds=1),
        health="degraded",
        islands=[IslandReport("isl-01", available_cards=10, unhealthy_cards=2)],
    )
    for cpi in Cluster.objects.values_list("cpi", flat=True):
        for viewer in [operator, other_operator, None]:
            fast = selectors._cluster_description_postgres(cluster_cpi=cpi, viewer=viewer)
            generic = selectors._cluster_description_generic(cluster_cpi=cpi, viewer=viewer)
            assert fast == generic, cpi
            assert fast is not None and fast.islands
    assert selectors._cluster_description_postgres(cluster_cpi="cpi:cucc:nx:nothing", viewer=None) is None
