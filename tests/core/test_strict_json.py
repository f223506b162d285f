"""Request bodies and query strings as the schema declares them (issue #12, "an honest schema"): JSON
values of the declared type only (core.api.strict), no empty filter values (core.api.filters), the
identifier grammar where a value is an identifier, measurements not from the future, and the schema saying
all of it."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from core.api.schema import NOT_BLANK_PATTERN
from core.models import Organisation
from tests.factories import BuyerFactory, OrganisationFactory, make_cluster

pytestmark = pytest.mark.django_db

CPI = "cpi:cucc:nx:zw-ai01"


def fields(response: Any) -> dict[str, Any]:
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid"
    return dict(response.json()["extra"]["fields"])


def registration(**changes: Any) -> dict[str, Any]:
    body = {
        "cpi": CPI,
        "site": "Zhongwei",
        "accelerator": "nvidia-a800-sxm4-80gb",
        "islands": [{"name": "isl-01", "cards": 8, "fabric": "infiniband"}],
    }
    return {**body, **changes}


def test_values_of_another_json_type_are_refused_not_converted(
    api: APIClient, operator: Organisation
) -> None:
    body = registration(site=7, islands=[{"name": "isl-01", "cards": "8", "fabric": "infiniband"}, {}])
    assert fields(api.post("/api/v1/clusters", body, format="json")) == {
        "site": ["Must be a string, not a number."],
        "islands": {"0": {"cards": ["Must be an integer, not a string."]}},
    }
    token = api.post("/api/v1/tokens", {"name": "ci", "can_manage_tokens": "false"}, format="json")
    assert fields(token) == {"can_manage_tokens": ["Must be true or false, not a string."]}
    make_cluster(operator=operator, name="zw-ai02", islands=[("isl-01", 8)])
    price = api.post(
        "/api/v1/clusters/cpi:cucc:nx:zw-ai02/price-cards",
        {"rate_per_card_hour": 12.5, "tariff_id": True},
        format="json",
    )
    assert fields(price) == {
        "rate_per_card_hour": ['Must be a decimal number in a string (e.g. "12.50"), not a number.'],
        "tariff_id": ["Must be an integer, not a boolean."],
    }


def test_values_of_the_declared_type_still_pass(api: APIClient) -> None:
    response = api.post("/api/v1/clusters", registration(), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["islands"][0]["cards"] == 8


def test_query_strings_are_text_and_still_parse(api: APIClient) -> None:
    """Only JSON bodies are typed: a query string's "25" is the number 25."""
    response = api.get("/api/v1/operator/leases?after=0&wait=0&page_size=25")
    assert response.status_code == 200, response.content


def test_an_empty_filter_value_is_refused_and_an_absent_one_filters_nothing(
    token_client: Callable[[Organisation], APIClient],
) -> None:
    buyer = token_client(BuyerFactory(slug="acme"))
    assert fields(buyer.get("/api/v1/invoices?period_to=")) == {
        "period_to": ["Give a value, or leave the parameter out."]
    }
    assert fields(buyer.get("/api/v1/leases?state=&job=")) == {
        "state": ["Give a value, or leave the parameter out."],
        "job": ["Give a value, or leave the parameter out."],
    }
    assert buyer.get("/api/v1/invoices").status_code == 200


def test_identifiers_in_heartbeats_and_the_lease_feed_follow_the_grammar(
    api: APIClient, operator: Organisation
) -> None:
    make_cluster(operator=operator, islands=[("isl-01", 8)])
    stale = {"sent_at": "2000-01-01T00:00:00Z", "health": "ok"}
    beat = api.post(
        f"/api/v1/clusters/{CPI}/heartbeats",
        {**stale, "islands": [{"name": "Isl 01", "available_cards": 0}]},
        format="json",
    )
    assert fields(beat) == {
        "islands": {"0": {"name": ["name must be 1–32 characters of a–z, 0–9 and inner hyphens"]}}
    }
    feed = api.get("/api/v1/operator/leases", {"cluster": "0" * 136})
    assert set(fields(feed)) == {"cluster"}
    assert api.get("/api/v1/operator/leases", {"cluster": "cpi:cucc:nx"}).status_code == 400
    assert api.get("/api/v1/operator/leases", {"cluster": CPI}).status_code == 200


def test_a_latency_measured_in_the_future_is_refused(
    token_client: Callable[[Organisation], APIClient],
) -> None:
    platform = token_client(OrganisationFactory(slug="cardhour", is_platform=True))

    def measure(at: str) -> Any:
        body = {"measurements": [{"source": "nx", "target": "gz", "latency_ms": "12.5", "measured_at": at}]}
        return platform.post("/api/v1/hub-latencies/measurements", body, format="json")

    ahead = (timezone.now() + timedelta(minutes=10)).isoformat()
    assert fields(measure(ahead)) == {
        "measurements": {"0": {"measured_at": ["Is ahead of the server's clock."]}}
    }
    assert fields(measure("0768-02-19T22:14:57+08:00")) == {
        "measurements": {"0": {"measured_at": ["Is before 2000."]}}
    }
    assert measure(timezone.now().isoformat()).status_code == 200


def test_the_schema_declares_the_constraints(client: Any) -> None:
    document = client.get("/api/schema/", {"format": "json"}).json()
    components = document["components"]["schemas"]
    register = components["ClusterListInputRequest"]["properties"]
    assert register["cpi"]["pattern"] == (
        "^cpi:[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?:(?:jjj|yrd|gba|cy|nmg|gz|gs|nx|ext):"
        "[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$"
    )
    assert register["islands"]["minItems"] == 1
    # Stripped and refused when blank: a character other than whitespace, and no NUL.
    assert register["site"]["pattern"] == NOT_BLANK_PATTERN
    assert re.search(register["site"]["pattern"], "Zhongwei DC-2") and not re.search(NOT_BLANK_PATTERN, " \t")
    measurement = components["HubLatencyMeasureInputMeasurementRequest"]["properties"]
    assert measurement["source"]["allOf"] == [{"$ref": "#/components/schemas/HubCodeEnum"}]
    assert components["HubCodeEnum"]["enum"] == ["jjj", "yrd", "gba", "cy", "nmg", "gz", "gs", "nx", "ext"]
    assert measurement["latency_ms"]["pattern"] == r"^(?:\d{1,5}(?:\.\d{0,3})?|\.\d{1,3})$"
    price = components["PriceCardListInputRequest"]["properties"]["rate_per_card_hour"]
    assert price["pattern"] == r"^(?:\d{1,8}(?:\.\d{0,4})?|\.\d{1,4})$"
    feed = {p["name"]: p["schema"] for p in document["paths"]["/api/v1/operator/leases"]["get"]["parameters"]}
    assert feed["page_size"] == {"type": "integer", "minimum": 1, "maximum": 500}
    assert feed["after"]["minimum"] == 0
    leases = {p["name"]: p["schema"] for p in document["paths"]["/api/v1/leases"]["get"]["parameters"]}
    assert leases["job"]["minimum"] == 1
    request_bodies = [
        operation["requestBody"]["content"]
        for item in document["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "requestBody" in operation
    ]
    # JSON only, but for the fleet import's file upload.
    assert {tuple(content) for content in request_bodies} == {
        ("application/json",),
        ("multipart/form-data", "text/csv"),
    }


def test_the_resolver_checks_paging_on_every_level(api: APIClient, operator: Organisation) -> None:
    """Only operator and hub levels page their clusters, but the parameters are declared on every answer."""
    make_cluster(operator=operator, islands=[("isl-01", 8)])
    island = api.get(f"/api/v1/resolve/{CPI}:isl-01", {"page": "-1"})
    assert island.status_code == 400
    assert island.json()["code"] == "invalid_paging"
    assert api.get(f"/api/v1/resolve/{CPI}:isl-01", {"page_size": "x"}).json()["code"] == "invalid_paging"
    assert api.get(f"/api/v1/resolve/{CPI}:isl-01", {"page": "1", "page_size": "10"}).status_code == 200
