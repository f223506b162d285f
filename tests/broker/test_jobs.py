"""Submitting jobs: every bad spec is a 400 with a code per fault and writes nothing; idempotency."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.models import Job
from core.models import Organisation


def body(**overrides: object) -> dict:
    now = timezone.now()
    return {
        "name": "pretrain",
        "cards": 8,
        "origin_hub": "yrd",
        "latency_budget_ms": 30,
        "earliest_start_at": (now + timedelta(minutes=10)).isoformat(),
        "deadline_at": (now + timedelta(hours=10)).isoformat(),
        "duration_seconds": 7200,
        **overrides,
    }


def test_a_job_is_submitted_with_its_defaults(buyer: Organisation, token_client) -> None:
    response = token_client(buyer).post(
        "/api/v1/jobs", body(accelerators=["nvidia-a800-sxm4-80gb"], fabrics=["infiniband"]), format="json"
    )
    assert response.status_code == 201, response.json()
    job = response.json()
    assert (job["state"], job["gang"], job["preference"], job["price_weight"]) == (
        "open",
        "island",
        "price",
        "1.000",
    )
    assert job["accelerators"] == ["nvidia-a800-sxm4-80gb"] and job["checkpointable"] is False


def now_plus(**delta: float) -> str:
    return (timezone.now() + timedelta(**delta)).isoformat()


@pytest.mark.parametrize(
    ("overrides", "codes"),
    [
        ({"cards": 0}, ["cards_not_positive"]),
        ({"cards": None}, ["cards_or_standard_cards"]),
        ({"standard_cards": "4"}, ["cards_or_standard_cards"]),
        ({"cards": None, "standard_cards": "0"}, ["cards_not_positive"]),
        ({"duration_seconds": 0}, ["duration_not_positive"]),
        ({"deadline_at": "PLACEHOLDER_SHORT"}, ["deadline_before_end"]),
        ({"deadline_at": "PLACEHOLDER_FAR"}, ["window_beyond_horizon"]),
        ({"accelerators": ["nvidia-a9000"]}, ["unknown_accelerator"]),
        ({"origin_hub": "mars"}, ["unknown_hub"]),
        ({"latency_budget_ms": 0}, ["latency_budget_not_positive"]),
        ({"earliest_start_at": "PLACEHOLDER_PAST"}, ["start_in_past"]),
        ({"max_price_per_card_hour": "0"}, ["price_cap_not_positive"]),
        ({"price_weight": "1.5", "preference": "weighted"}, ["price_weight_range"]),
        (
            {"cards": 0, "duration_seconds": -5, "origin_hub": "mars"},
            ["cards_not_positive", "duration_not_positive", "unknown_hub"],
        ),
    ],
)
def test_bad_specs_are_400_with_a_code_per_fault(
    buyer: Organisation, token_client, overrides: dict, codes: list[str]
) -> None:
    placeholders = {
        "PLACEHOLDER_SHORT": now_plus(hours=1),
        "PLACEHOLDER_FAR": now_plus(days=8),
        "PLACEHOLDER_PAST": now_plus(hours=-1),
    }
    values = {
        key: placeholders.get(value, value) if isinstance(value, str) else value
        for key, value in overrides.items()
    }
    response = token_client(buyer).post("/api/v1/jobs", body(**values), format="json")
    assert response.status_code == 400, response.json()
    error = response.json()
    assert error["code"] == "job_invalid"
    assert [fault["code"] for fault in error["extra"]["errors"]] == codes
    assert all(fault["field"] and fault["message"] for fault in error["extra"]["errors"])
    assert not Job.objects.exists()


def test_malformed_input_is_a_400_from_the_serializer(buyer: Organisation, token_client) -> None:
    response = token_client(buyer).post(
        "/api/v1/jobs", body(fabrics=["ethernet"], gang="galaxy"), format="json"
    )
    assert response.status_code == 400
    assert set(response.json()["extra"]["fields"]) >= {"fabrics", "gang"}
    assert not Job.objects.exists()


def test_a_repeated_idempotency_key_returns_the_job_and_another_body_conflicts(
    buyer: Organisation, token_client
) -> None:
    client = token_client(buyer)
    first_body = body(idempotency_key="job-1")
    first = client.post("/api/v1/jobs", first_body, format="json")
    again = client.post("/api/v1/jobs", first_body, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = client.post("/api/v1/jobs", {**first_body, "cards": 16}, format="json")
    assert other.status_code == 409 and other.json()["code"] == "job_conflict"
    assert Job.objects.count() == 1


def test_cancelling_a_job(buyer: Organisation, token_client) -> None:
    client = token_client(buyer)
    job = client.post("/api/v1/jobs", body(), format="json").json()
    response = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["code"] == "job_closed"
    quoted = client.post(f"/api/v1/jobs/{job['id']}/quotes", {}, format="json")
    assert quoted.status_code == 409 and quoted.json()["code"] == "job_closed"
