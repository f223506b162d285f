"""Cluster registration and management over REST: good paths, bad-input tables, idempotency."""

from __future__ import annotations

from typing import Any

import pytest

from core.api.strict import JsonBody
from federation.api.views import ClusterListApi, _registration_plain
from federation.models import Cluster, ClusterStatusChange, Island, IssuedIdentifier
from tests.factories import BuyerFactory, make_cluster

pytestmark = pytest.mark.django_db

URL = "/api/v1/clusters"


def body(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "cpi": "cpi:cucc:nx:zw-ai01",
        "site": "Zhongwei",
        "accelerator": "nvidia-h800-sxm5-80gb",
        "endpoint_url": "https://agent.cucc.example/cardhour",
        "islands": [
            {"name": "isl-01", "cards": 64, "fabric": "infiniband"},
            {"name": "isl-02", "cards": 32, "fabric": "infiniband"},
        ],
    }
    data.update(overrides)
    return data


def counts() -> tuple[int, int, int, int]:
    return (
        Cluster.objects.count(),
        Island.objects.count(),
        IssuedIdentifier.objects.count(),
        ClusterStatusChange.objects.count(),
    )


def test_register_creates_cluster_islands_identifiers_and_history(api, operator):
    response = api.post(URL, body(), format="json")

    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["cpi"] == "cpi:cucc:nx:zw-ai01"
    assert data["hub"] == "nx"
    assert data["total_cards"] == 96
    assert data["available_cards"] == 96
    assert data["status"] == "active"
    assert [i["cpi"] for i in data["islands"]] == ["cpi:cucc:nx:zw-ai01:isl-01", "cpi:cucc:nx:zw-ai01:isl-02"]
    assert set(IssuedIdentifier.objects.values_list("cpi", flat=True)) == {
        "cpi:cucc:nx:zw-ai01",
        "cpi:cucc:nx:zw-ai01:isl-01",
        "cpi:cucc:nx:zw-ai01:isl-02",
    }
    change = ClusterStatusChange.objects.get()
    assert (change.from_status, change.to_status, change.reason) == ("", "active", "registered")
    assert change.actor_token is not None and change.actor_label.startswith("token test")


def test_identical_registration_is_idempotent(api):
    assert api.post(URL, body(), format="json").status_code == 201
    before = counts()

    again = api.post(URL, body(), format="json")

    assert again.status_code == 200
    assert again.json()["cpi"] == "cpi:cucc:nx:zw-ai01"
    assert counts() == before


def test_same_identifier_different_body_is_409(api):
    assert api.post(URL, body(), format="json").status_code == 201
    before = counts()

    response = api.post(URL, body(site="Yinchuan"), format="json")

    assert response.status_code == 409
    assert response.json()["code"] == "identifier_taken"
    assert counts() == before


def test_retired_identifier_is_never_reused(api, operator):
    make_cluster(operator=operator, name="old-01")
    assert api.patch(f"{URL}/cpi:cucc:nx:old-01", {"status": "retired"}, format="json").status_code == 200
    response = api.post(URL, body(cpi="cpi:cucc:nx:old-01"), format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "identifier_taken"


def test_island_identifier_ever_issued_blocks_reuse_even_if_rows_vanish(api, operator):
    cluster = make_cluster(operator=operator, name="zw-ai01")
    Island.objects.filter(cluster=cluster).delete()
    ClusterStatusChange.objects.filter(cluster=cluster).delete()
    cluster.delete()

    response = api.post(URL, body(), format="json")

    assert response.status_code == 409
    assert response.json()["code"] == "identifier_taken"
    assert "cpi:cucc:nx:zw-ai01" in response.json()["extra"]["taken"]


BAD_INPUTS = [
    # (description, overrides, status, code, field that must be named in extra, if any)
    ("missing cpi", {"cpi": None}, 400, "invalid", "cpi"),
    ("upper-case cpi", {"cpi": "cpi:CUCC:nx:zw-ai01"}, 400, "invalid_identifier", None),
    ("wrong scheme", {"cpi": "urn:cucc:nx:zw-ai01"}, 400, "invalid_identifier", None),
    ("unknown hub", {"cpi": "cpi:cucc:xx:zw-ai01"}, 400, "invalid_identifier", None),
    ("island-level cpi", {"cpi": "cpi:cucc:nx:zw-ai01:isl-01"}, 400, "invalid_identifier", None),
    ("hub-level cpi", {"cpi": "cpi:cucc:nx"}, 400, "invalid_identifier", None),
    ("another operator's segment", {"cpi": "cpi:cmcc:nx:zw-ai01"}, 403, "identifier_operator_mismatch", None),
    ("unknown accelerator", {"accelerator": "nvidia-b300"}, 400, "unknown_accelerator", None),
    ("no islands", {"islands": []}, 400, "invalid", "islands"),
    (
        "zero cards",
        {"islands": [{"name": "isl-01", "cards": 0, "fabric": "nvlink"}]},
        400,
        "invalid",
        "islands",
    ),
    (
        "negative cards",
        {"islands": [{"name": "isl-01", "cards": -8, "fabric": "nvlink"}]},
        400,
        "invalid",
        "islands",
    ),
    (
        "bad fabric",
        {"islands": [{"name": "isl-01", "cards": 8, "fabric": "ethernet"}]},
        400,
        "invalid",
        "islands",
    ),
    (
        "bad island name",
        {"islands": [{"name": "Isl_01", "cards": 8, "fabric": "nvlink"}]},
        400,
        "invalid",
        "islands[0]",
    ),
    (
        "duplicate island names",
        {
            "islands": [
                {"name": "isl-01", "cards": 8, "fabric": "nvlink"},
                {"name": "isl-01", "cards": 8, "fabric": "nvlink"},
            ]
        },
        400,
        "invalid",
        "islands[1]",
    ),
    (
        "more cards than any cluster",
        {"islands": [{"name": f"isl-{n}", "cards": 600_000, "fabric": "roce"} for n in range(2)]},
        400,
        "cluster_too_large",
        None,
    ),
    ("bad endpoint", {"endpoint_url": "not a url"}, 400, "invalid", "endpoint_url"),
    ("site too long", {"site": "x" * 101}, 400, "invalid", "site"),
    ("islands not a list", {"islands": "isl-01"}, 400, "invalid", "islands"),
]


@pytest.mark.parametrize(
    ("description", "overrides", "status", "code", "field"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_registration_is_rejected_with_a_code_and_writes_nothing(
    api, description, overrides, status, code, field
):
    data = {k: v for k, v in body(**overrides).items() if v is not None}
    before = counts()

    response = api.post(URL, data, format="json")

    assert response.status_code == status, response.json()
    payload = response.json()
    assert set(payload) == {"code", "message", "extra"}
    assert payload["code"] == code
    if field is not None:
        assert field in payload["extra"]["fields"]
    assert counts() == before


def test_malformed_json_is_400_parse_error(api):
    response = api.generic("POST", URL, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"


def test_buyer_organisation_cannot_register(token_client):
    buyer = BuyerFactory(slug="acme")
    response = token_client(buyer).post(URL, body(cpi="cpi:acme:nx:zw-ai01"), format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "not_an_operator"
    assert Cluster.objects.count() == 0


def test_read_only_token_cannot_register(token_client, operator):
    response = token_client(operator, scope="read_only").post(URL, body(), format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "read_only_credential"


def test_list_shows_only_own_clusters_with_filters(api, operator, other_operator):
    make_cluster(operator=operator, hub="nx", name="a")
    make_cluster(operator=operator, hub="gz", name="b", accelerator="huawei-ascend-910b3", fabric="hccs")
    make_cluster(operator=other_operator, hub="nx", name="c")

    assert [c["cpi"] for c in api.get(URL).json()["results"]] == ["cpi:cucc:gz:b", "cpi:cucc:nx:a"]
    assert [c["cpi"] for c in api.get(URL, {"hub": "gz"}).json()["results"]] == ["cpi:cucc:gz:b"]
    assert [c["cpi"] for c in api.get(URL, {"accelerator": "huawei-ascend-910b3"}).json()["results"]] == [
        "cpi:cucc:gz:b"
    ]
    bad_filter = api.get(URL, {"status": "exploded"})
    assert bad_filter.status_code == 400
    assert bad_filter.json()["code"] == "invalid"


def test_list_queries_do_not_grow_with_clusters(api, operator, django_assert_max_num_queries):
    for n in range(12):
        make_cluster(operator=operator, name=f"c{n:02d}")
    with django_assert_max_num_queries(8):
        response = api.get(URL)
    assert response.json()["count"] == 12


def test_update_site_endpoint_and_status_records_history(api, operator):
    make_cluster(operator=operator)
    response = api.patch(
        f"{URL}/cpi:cucc:nx:zw-ai01",
        {"site": "Zhongwei-2", "status": "draining", "reason": "maintenance window"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["site"] == "Zhongwei-2"
    assert response.json()["status"] == "draining"
    history = api.get(f"{URL}/cpi:cucc:nx:zw-ai01/status-history").json()["results"]
    assert [(h["from_status"], h["to_status"], h["reason"]) for h in history] == [
        ("active", "draining", "maintenance window"),
        ("", "active", "registered"),
    ]


def test_retired_cluster_cannot_change(api, operator):
    make_cluster(operator=operator)
    assert api.patch(f"{URL}/cpi:cucc:nx:zw-ai01", {"status": "retired"}, format="json").status_code == 200
    response = api.patch(f"{URL}/cpi:cucc:nx:zw-ai01", {"status": "active"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "cluster_retired"


def test_add_and_resize_islands_keeps_totals(api, operator):
    make_cluster(operator=operator, islands=[("isl-01", 64)])
    added = api.post(
        f"{URL}/cpi:cucc:nx:zw-ai01/islands", {"name": "isl-02", "cards": 16, "fabric": "roce"}, format="json"
    )
    assert added.status_code == 201, added.json()
    assert added.json()["cpi"] == "cpi:cucc:nx:zw-ai01:isl-02"
    resized = api.patch(f"{URL}/cpi:cucc:nx:zw-ai01/islands/isl-01", {"cards": 32}, format="json")
    assert resized.status_code == 200
    cluster = Cluster.objects.get(cpi="cpi:cucc:nx:zw-ai01")
    assert (cluster.total_cards, cluster.available_cards) == (48, 48)

    duplicate = api.post(
        f"{URL}/cpi:cucc:nx:zw-ai01/islands", {"name": "isl-02", "cards": 8, "fabric": "roce"}, format="json"
    )
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "identifier_taken"
    bad = api.patch(f"{URL}/cpi:cucc:nx:zw-ai01/islands/isl-01", {"cards": 0}, format="json")
    assert bad.status_code == 400
    assert Island.objects.get(cpi="cpi:cucc:nx:zw-ai01:isl-01").cards == 32


def test_registration_answers_what_was_stored(api):
    """The 201 answer is built from what the registration wrote; it is what reading the cluster shows."""
    created = api.post(URL, body(islands=[*body()["islands"], {"name": "a-0", "cards": 8, "fabric": "roce"}]))

    assert created.status_code == 201
    stored = api.get(f"{URL}/cpi:cucc:nx:zw-ai01").json()
    assert created.json() == stored
    assert [i["name"] for i in stored["islands"]] == ["a-0", "isl-01", "isl-02"]
    again = api.post(URL, body(islands=[*body()["islands"], {"name": "a-0", "cards": 8, "fabric": "roce"}]))
    assert again.status_code == 200
    assert again.json() == stored


def test_registration_by_alias_or_slug_in_capitals_names_the_catalog_slug(api):
    by_alias = api.post(URL, body(accelerator="A800-SXM4-80GB"))
    assert by_alias.status_code == 201, by_alias.json()
    assert by_alias.json()["accelerator"] == "nvidia-a800-sxm4-80gb"
    by_slug = api.post(URL, body(cpi="cpi:cucc:nx:zw-ai02", accelerator=" NVIDIA-H20 "))
    assert by_slug.status_code == 201, by_slug.json()
    assert by_slug.json()["accelerator"] == "nvidia-h20"


def test_one_island_identifier_taken_refuses_all_and_claims_nothing(api, operator):
    IssuedIdentifier.objects.create(cpi="cpi:cucc:nx:zw-ai01:isl-02", kind="island", operator=operator)
    before = counts()

    response = api.post(URL, body(), format="json")

    assert response.status_code == 409
    assert response.json()["code"] == "identifier_taken"
    assert response.json()["extra"]["taken"] == ["cpi:cucc:nx:zw-ai01:isl-02"]
    assert counts() == before
    assert not IssuedIdentifier.objects.filter(cpi="cpi:cucc:nx:zw-ai01").exists()
    # The identifiers it did not get stay free for a registration that avoids the taken one.
    other = body(islands=[{"name": "isl-01", "cards": 8, "fabric": "nvlink"}])
    assert api.post(URL, other, format="json").status_code == 201


def test_a_new_cluster_comes_back_with_its_islands_loaded_and_still_queryable(operator):
    cluster = make_cluster(operator=operator, islands=[("isl-02", 8), ("isl-01", 16)])

    assert [i.name for i in cluster.islands.all()] == ["isl-01", "isl-02"]
    assert cluster.islands.count() == 2
    assert [i.cards for i in cluster.islands.filter(name="isl-02")] == [8]
    assert {i.pk for i in cluster.islands.all()} == set(Island.objects.values_list("pk", flat=True))


def test_hub_and_chip_read_together_equal_the_orm_rows(db):
    """Registration reads its hub and chip in one raw statement; the rows it builds are the ORM's, field for
    field (decimals, the aliases JSON), and anything that is not an exact slug is left to accelerator_resolve."""
    from federation.models import Accelerator, Hub
    from federation.selectors import hub_and_chip_get

    hub, chip = hub_and_chip_get(hub_code="nx", accelerator_name=" NVIDIA-A800-SXM4-80GB ")

    assert hub is not None and chip is not None
    orm_hub = Hub.objects.get(code="nx")
    orm_chip = Accelerator.objects.get(slug="nvidia-a800-sxm4-80gb")
    for model, built, stored in ((Hub, hub, orm_hub), (Accelerator, chip, orm_chip)):
        for field in model._meta.concrete_fields:
            assert getattr(built, field.attname) == getattr(stored, field.attname), field.name
        assert not built._state.adding
    assert isinstance(chip.aliases, list) and chip.aliases == orm_chip.aliases
    assert hub_and_chip_get(hub_code="nx", accelerator_name="A800-SXM4-80GB") == (orm_hub, None)  # an alias
    assert hub_and_chip_get(hub_code="zz", accelerator_name="nvidia-h20")[0] is None
    assert hub_and_chip_get(hub_code="nx", accelerator_name="nvidia-h20\x00") == (orm_hub, None)
    assert hub_and_chip_get(hub_code="nx", accelerator_name="") == (orm_hub, None)


def test_registration_tables_carry_no_redundant_index(db):
    """Every index is one more insert per registered row (federation migration 0007): no single-column
    index where a composite one leads with the column, and no LIKE ("_like") index on an identifier."""
    from django.db import connection

    with connection.cursor() as cursor:
        constraints = {
            table: connection.introspection.get_constraints(cursor, table)
            for table in (
                "federation_cluster",
                "federation_island",
                "federation_issuedidentifier",
                "federation_clusterstatuschange",
            )
        }
    indexed = {
        (table, tuple(info["columns"]))
        for table, found in constraints.items()
        for info in found.values()
        if info["index"] or info["unique"]
    }
    for single, composite in [
        (("federation_cluster", ("operator_id",)), ("federation_cluster", ("operator_id", "hub_id"))),
        (("federation_cluster", ("hub_id",)), ("federation_cluster", ("hub_id", "accelerator_id", "status"))),
        (("federation_island", ("cluster_id",)), ("federation_island", ("cluster_id", "name"))),
        (
            ("federation_clusterstatuschange", ("cluster_id",)),
            ("federation_clusterstatuschange", ("cluster_id", "changed_at")),
        ),
    ]:
        assert composite in indexed
        assert single not in indexed
    like = [name for found in constraints.values() for name in found if name.endswith("_like")]
    assert like == []


def _island(**overrides: Any) -> dict[str, Any]:
    return {"name": "isl-01", "cards": 8, "fabric": "nvlink", **overrides}


# Bodies around the edges of what the plain path takes, and whether it takes them: a body it takes gives
# exactly the serializer's validated data; every other body (each error among them) goes to the serializer.
PLAIN_PATH_BODIES: list[tuple[dict[str, Any], bool]] = [
    (body(), True),
    (body(endpoint_url=""), True),
    ({k: v for k, v in body().items() if k != "endpoint_url"}, True),
    (body(extra="ignored", islands=[_island(extra=1)]), True),
    (body(site="x" * 100), True),
    (body(endpoint_url="ftp://agent.example/x"), True),  # a URL to the serializer; the service wants https
    (body(islands=[_island(cards=1_000_000)]), True),
    (body(islands=[_island(), _island()]), True),  # duplicates are the service's to refuse
    (body(islands=[_island(name="Isl_01")]), True),  # the grammar too
    (body(site=" Zhongwei "), False),
    (body(site="中卫"), False),
    (body(site=""), False),
    (body(site="x" * 101), False),
    (body(site="a\x00b"), False),
    (body(cpi=7), False),
    (body(cpi=None), False),
    (body(accelerator=["H20"]), False),
    (body(endpoint_url="not a url"), False),
    (body(endpoint_url=None), False),
    (body(endpoint_url="https://" + "a" * 600 + ".example/"), False),
    (body(islands=[]), False),
    (body(islands="isl-01"), False),
    (body(islands=[_island(cards=True)]), False),
    (body(islands=[_island(cards=8.0)]), False),
    (body(islands=[_island(cards="8")]), False),
    (body(islands=[_island(cards=0)]), False),
    (body(islands=[_island(cards=1_000_001)]), False),
    (body(islands=[_island(fabric="NVLink")]), False),
    (body(islands=[_island(fabric=None)]), False),
    (body(islands=[_island(name=" isl-01")]), False),
    (body(islands=[_island(name="x" * 33)]), False),
    (body(islands=[["isl-01", 8, "nvlink"]]), False),
    ({k: v for k, v in body().items() if k != "islands"}, False),
]


@pytest.mark.parametrize(("data", "plain_expected"), PLAIN_PATH_BODIES, ids=range(len(PLAIN_PATH_BODIES)))
def test_plain_registration_path_agrees_with_the_serializer(data, plain_expected):
    serializer = ClusterListApi.Input(data=JsonBody(data))
    valid = serializer.is_valid()
    plain = _registration_plain(JsonBody(data))
    assert (plain is not None) == plain_expected
    if plain is not None:
        assert valid, serializer.errors
        assert plain == serializer.validated_data
        assert plain["islands"] == [dict(island) for island in serializer.validated_data["islands"]]
