"""Hostile input on the API is a 4xx in the one error shape, never a 500 or an HTML page, and writes
nothing: deep nesting, oversized bodies, lone surrogates and NUL, naive timestamps, form bodies."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from core.models import ApiToken, Organisation

pytestmark = pytest.mark.django_db

Client = Callable[..., APIClient]
JSON_WRITES = ["/api/v1/tokens", "/api/v1/clusters", "/api/v1/operator/usage", "/api/v1/jobs"]


def error(response, status: int, code: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"code", "message", "extra"} and body["code"] == code, body
    return body


@pytest.mark.parametrize("path", JSON_WRITES)
def test_fifty_thousand_brackets_are_payload_too_deep_not_a_500(
    path: str, operator: Organisation, buyer_org: Organisation, token_client: Client
) -> None:
    client = token_client(buyer_org if path == "/api/v1/jobs" else operator, can_manage_tokens=True)
    response = client.post(path, "[" * 50_000 + "]" * 50_000, content_type="application/json")

    error(response, 400, "payload_too_deep")


def test_nesting_just_past_the_limit_is_refused_and_within_it_is_not(
    operator: Organisation, token_client: Client
) -> None:
    client = token_client(operator, can_manage_tokens=True)
    with override_settings(CARDHOUR_API_JSON_MAX_DEPTH=8):
        deep = {"name": "x", "extra": json.loads("[" * 9 + "]" * 9)}
        body = error(client.post("/api/v1/tokens", deep, format="json"), 400, "payload_too_deep")
        assert body["extra"] == {"max_depth": 8}
        fine = client.post("/api/v1/tokens", {"name": "x", "extra": [[[1]]]}, format="json")
    assert fine.status_code == 201


def test_an_oversized_body_is_a_json_413_before_it_is_read(
    operator: Organisation, token_client: Client
) -> None:
    client = token_client(operator, can_manage_tokens=True)
    before = ApiToken.objects.count()
    with override_settings(CARDHOUR_API_BODY_MAX_BYTES=1000):
        response = client.post("/api/v1/tokens", {"name": "x" * 2000}, format="json")

    body = error(response, 413, "payload_too_large")
    assert body["extra"]["max_bytes"] == 1000
    assert ApiToken.objects.count() == before


def test_the_usage_endpoint_takes_the_largest_documented_batch(
    operator: Organisation, token_client: Client
) -> None:
    """10,000 records with 200-character keys: past Django's 2.5 MB default, inside the usage limit. (Every
    record names a lease that does not exist, so the batch is refused for that — after it was read.)"""
    records = [
        {
            "lease": 10**9 + i,
            "idempotency_key": f"{i:0200d}",
            "start_at": "2026-11-01T00:00:00Z",
            "end_at": "2026-11-01T00:01:00Z",
            "cards": 8,
        }
        for i in range(10_000)
    ]
    body = json.dumps({"records": records})
    assert len(body) > 2_621_440

    response = token_client(operator).post("/api/v1/operator/usage", body, content_type="application/json")

    assert response.status_code == 400 and response.json()["code"] == "lease_usage_invalid"


@pytest.mark.parametrize(
    ("text", "what"), [('"\\ud800"', "surrogate"), ('"a\\u0000b"', "NUL"), ('"\\udfff\\ud800"', "surrogate")]
)
def test_lone_surrogates_and_nul_are_invalid_text(
    text: str, what: str, operator: Organisation, token_client: Client
) -> None:
    client = token_client(operator, can_manage_tokens=True)
    before = ApiToken.objects.count()

    for payload in (
        f'{{"name": {text}}}',
        f'{{"name": "ok", "scope": {text}}}',  # a choice field would echo it in its error
    ):
        body = error(
            client.post("/api/v1/tokens", payload, content_type="application/json"), 400, "invalid_text"
        )
        assert what in body["message"] or "surrogate" in body["message"] or "NUL" in body["message"]
    assert ApiToken.objects.count() == before


def test_a_surrogate_pair_is_a_character_and_is_accepted(
    operator: Organisation, token_client: Client
) -> None:
    client = token_client(operator, can_manage_tokens=True)

    response = client.post(
        "/api/v1/tokens", '{"name": "gpu \\ud83d\\ude80"}', content_type="application/json"
    )

    assert response.status_code == 201 and response.json()["token"]["name"] == "gpu 🚀"


def test_a_surrogate_in_a_usage_key_never_reaches_the_database(
    operator: Organisation, token_client: Client
) -> None:
    payload = (
        '{"records": [{"lease": 1, "idempotency_key": "k\\ud800", "start_at": "2026-11-01T00:00:00Z", '
        '"end_at": "2026-11-01T00:01:00Z", "cards": 1}]}'
    )
    response = token_client(operator).post("/api/v1/operator/usage", payload, content_type="application/json")

    body = error(response, 400, "invalid_text")
    assert "records[0].idempotency_key" in body["extra"]["fields"]


def test_nan_is_not_json(operator: Organisation, token_client: Client) -> None:
    response = token_client(operator).post("/api/v1/tokens", '{"name": NaN}', content_type="application/json")

    error(response, 400, "parse_error")


def test_form_bodies_are_refused_not_half_read(operator: Organisation, token_client: Client) -> None:
    client = token_client(operator, can_manage_tokens=True)

    response = client.post("/api/v1/tokens", {"name": "x"}, format="multipart")

    error(response, 415, "unsupported_media_type")


def test_a_naive_job_window_is_refused_not_read_as_beijing_time(
    buyer_org: Organisation, token_client: Client
) -> None:
    response = token_client(buyer_org).post(
        "/api/v1/jobs",
        {
            "name": "naive",
            "cards": 8,
            "origin_hub": "yrd",
            "latency_budget_ms": 50,
            "earliest_start_at": "2026-12-01T10:00:00",
            "deadline_at": "2026-12-02T10:00:00",
            "duration_seconds": 3600,
        },
        format="json",
    )

    body = error(response, 400, "invalid")
    assert set(body["extra"]["fields"]) == {"earliest_start_at", "deadline_at"}
    assert "UTC offset" in body["extra"]["fields"]["deadline_at"][0]


@pytest.fixture
def buyer_org(db: None) -> Organisation:
    from tests.factories import BuyerFactory

    return BuyerFactory(slug="naive-buyer")


@pytest.mark.parametrize("page_size", ["-1", "0", "1.5", "abc", "501", ""])
def test_malformed_page_size_is_refused_not_ignored(
    page_size: str, operator: Organisation, token_client: Client
) -> None:
    response = token_client(operator).get(f"/api/v1/tokens?page_size={page_size}")

    body = error(response, 400, "invalid_paging")
    assert "page_size" in body["extra"]["fields"]


def test_a_good_page_size_pages(operator: Organisation, token_client: Client) -> None:
    response = token_client(operator).get("/api/v1/tokens?page_size=1")

    assert response.status_code == 200 and len(response.json()["results"]) == 1
