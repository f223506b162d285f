"""The tariffs API: presets and own tariffs, schedules as HH:MM windows, named gaps, day strips."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from metering.models import Tariff, TariffVersion
from tests.factories import BuyerFactory

pytestmark = pytest.mark.django_db


def preset_id(code: str) -> int:
    return Tariff.objects.get(owner__isnull=True, code=code).pk


def post(client, url: str, body: Any):
    return client.post(url, data=json.dumps(body), content_type="application/json")


def body(**changes: Any) -> dict[str, Any]:
    """A valid two-season tariff; ``changes`` replace top-level keys."""
    base = {
        "code": "night-owl",
        "name": "Night owl",
        "time_zone": "Asia/Shanghai",
        "source": "Our own schedule",
        "bands": [
            {"band": "valley", "multiplier": "0.4"},
            {"band": "flat", "multiplier": "1"},
            {"band": "peak", "multiplier": "1.6"},
        ],
        "windows": [
            {"band": "valley", "start": "22:00", "end": "07:00"},
            {"band": "flat", "start": "07:00", "end": "18:00"},
            {
                "band": "peak",
                "start": "18:00",
                "end": "22:00",
                "weekdays": ["mon", "tue", "wed", "thu", "fri"],
            },
            {"band": "flat", "start": "18:00", "end": "22:00", "weekdays": ["sat", "sun"]},
        ],
    }
    return {**base, **changes}


def test_list_shows_presets_then_own_tariffs_only(operator, other_operator, api, other_api):
    assert post(other_api, "/api/v1/tariffs", body(code="theirs")).status_code == 201
    assert post(api, "/api/v1/tariffs", body()).status_code == 201

    results = api.get("/api/v1/tariffs").json()["results"]

    presets = ["cn-bj", "cn-gd", "cn-gz", "cn-hebei-jibei", "cn-js", "cn-nx", "cn-sc", "flat"]
    assert [(r["code"], r["owner"], r["is_preset"]) for r in results] == [
        *((code, None, True) for code in presets),
        ("night-owl", "cucc", False),
    ]
    assert all(r["current_version"] == 1 for r in results)
    assert "粤发改价格〔2021〕331号" in results[1]["source"]


def test_a_buyer_can_read_presets_but_not_define_tariffs(token_client):
    client = token_client(BuyerFactory(slug="acme"))
    assert client.get("/api/v1/tariffs").json()["count"] == 8
    assert client.get(f"/api/v1/tariffs/{preset_id('cn-nx')}").status_code == 200
    response = post(client, "/api/v1/tariffs", body())
    assert response.status_code == 403
    assert response.json()["code"] == "not_an_operator"


def test_create_returns_the_schedule_as_written(api):
    response = post(
        api,
        "/api/v1/tariffs",
        body(
            windows=[
                *body()["windows"][:3],
                {**body()["windows"][3], "months": [7, 8]},
                {
                    "band": "valley",
                    "start": "18:00",
                    "end": "22:00",
                    "weekdays": ["sat", "sun"],
                    "months": [1, 2, 3, 4, 5, 6, 9, 10, 11, 12],
                },
            ]
        ),
    )

    assert response.status_code == 201, response.json()
    tariff = response.json()
    assert (tariff["code"], tariff["owner"], tariff["is_preset"], tariff["current_version"]) == (
        "night-owl",
        "cucc",
        False,
        1,
    )
    [version] = tariff["versions"]
    assert version["version"] == 1 and version["in_force"] is True
    assert version["bands"] == [
        {"band": "peak", "multiplier": "1.6000"},
        {"band": "flat", "multiplier": "1.0000"},
        {"band": "valley", "multiplier": "0.4000"},
    ]
    assert version["windows"][0] == {
        "band": "flat",
        "start": "07:00",
        "end": "18:00",
        "weekdays": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        "months": list(range(1, 13)),
    }
    wrap = next(w for w in version["windows"] if w["start"] == "22:00")
    assert (wrap["band"], wrap["end"]) == ("valley", "07:00")
    summer = next(w for w in version["windows"] if w["months"] == [7, 8])
    assert summer["weekdays"] == ["sat", "sun"]


def test_a_gap_is_400_tariff_invalid_naming_the_gap(api):
    windows = [
        {"band": "valley", "start": "00:00", "end": "08:00"},
        {"band": "flat", "start": "10:00", "end": "24:00"},
    ]
    response = post(
        api,
        "/api/v1/tariffs",
        body(
            bands=[{"band": "valley", "multiplier": "0.5"}, {"band": "flat", "multiplier": "1"}],
            windows=windows,
        ),
    )
    assert response.status_code == 400
    error = response.json()
    assert error["code"] == "tariff_invalid"
    assert error["extra"]["gaps"] == [
        {"months": "Jan–Dec", "weekdays": "Mon–Sun", "from": "08:00", "to": "10:00"}
    ]
    assert "08:00–10:00 on Mon–Sun in Jan–Dec has no band" in error["message"]
    assert not Tariff.objects.filter(code="night-owl").exists()


def test_an_overlap_is_400_tariff_invalid(api):
    windows = [*body()["windows"], {"band": "peak", "start": "12:00", "end": "13:00", "months": [7]}]
    response = post(api, "/api/v1/tariffs", body(windows=windows))
    assert response.status_code == 400
    assert response.json()["extra"]["overlaps"] == [
        {"months": "Jul", "weekdays": "Mon–Sun", "from": "12:00", "to": "13:00", "bands": ["peak", "flat"]}
    ]


W = {"band": "flat", "start": "00:00", "end": "24:00"}
BANDS = [{"band": "flat", "multiplier": "1"}]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"code": "Not A Slug"}, "code"),
        ({"code": ""}, "code"),
        ({"name": ""}, "name"),
        ({"bands": []}, "bands"),
        ({"bands": [{"band": "flat", "multiplier": "0"}]}, "bands"),
        ({"bands": [{"band": "flat", "multiplier": "1.00001"}]}, "bands"),
        ({"bands": [{"band": "turbo", "multiplier": "1"}]}, "bands"),
        ({"bands": [*BANDS, *BANDS]}, "bands"),
        ({"windows": []}, "windows"),
        ({"windows": [{**W, "start": "24:00"}]}, "windows"),
        ({"windows": [{**W, "start": "7:00"}]}, "windows"),
        ({"windows": [{**W, "end": "24:01"}]}, "windows"),
        ({"windows": [{**W, "end": "12:60"}]}, "windows"),
        ({"windows": [{**W, "weekdays": ["funday"]}]}, "windows"),
        ({"windows": [{**W, "weekdays": []}]}, "windows"),
        ({"windows": [{**W, "months": [13]}]}, "windows"),
        ({"windows": [{**W, "months": [0]}]}, "windows"),
        ({"windows": "all day"}, "windows"),
        ({"effective_from": "2030-01-01T00:00:00"}, "effective_from"),
        ({"effective_from": "tomorrow"}, "effective_from"),
    ],
)
def test_bad_input_is_400_invalid_with_the_field(api, changes, field):
    response = post(api, "/api/v1/tariffs", body(**{"bands": BANDS, "windows": [W], **changes}))
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid"
    assert field in response.json()["extra"]["fields"]
    assert not Tariff.objects.filter(owner__isnull=False).exists()


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"time_zone": "Mars/Olympus"}, "time_zone"),
        ({"windows": [{**W, "start": "10:00", "end": "10:00"}]}, "windows"),
        ({"bands": [*BANDS, {"band": "peak", "multiplier": "2"}]}, "unused_bands"),
        ({"windows": [W, {**W, "band": "peak"}]}, "missing_multipliers"),
        ({"effective_from": "2020-01-01T00:00:00Z"}, "fields"),
    ],
)
def test_schedule_faults_are_400_tariff_invalid(api, changes, key):
    response = post(api, "/api/v1/tariffs", body(**{"bands": BANDS, "windows": [W], **changes}))
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "tariff_invalid"
    assert key in response.json()["extra"]


def test_a_code_is_unique_per_operator(api, other_api):
    assert post(api, "/api/v1/tariffs", body()).status_code == 201
    response = post(api, "/api/v1/tariffs", body())
    assert response.status_code == 409
    assert response.json()["code"] == "tariff_code_taken"
    assert post(other_api, "/api/v1/tariffs", body()).status_code == 201


def test_a_read_only_token_cannot_create(operator, token_client):
    response = post(token_client(operator, scope="read_only"), "/api/v1/tariffs", body())
    assert response.status_code == 403
    assert response.json()["code"] == "read_only_credential"


def test_get_own_and_presets_but_not_others(api, other_api):
    theirs = post(other_api, "/api/v1/tariffs", body()).json()["id"]
    assert api.get(f"/api/v1/tariffs/{preset_id('cn-gd')}").json()["code"] == "cn-gd"
    for tariff_id in (theirs, 2**63, 2**70):
        response = api.get(f"/api/v1/tariffs/{tariff_id}")
        assert response.status_code == 404
        assert response.json()["code"] == "tariff_not_found"


def test_publish_a_new_version(api):
    tariff_id = post(api, "/api/v1/tariffs", body()).json()["id"]
    starts = (timezone.now() + timedelta(days=1)).isoformat()

    response = post(
        api,
        f"/api/v1/tariffs/{tariff_id}/versions",
        {"bands": BANDS, "windows": [W], "effective_from": starts},
    )

    assert response.status_code == 201, response.json()
    versions = response.json()["versions"]
    assert [(v["version"], v["in_force"]) for v in versions] == [(1, True), (2, False)]
    assert versions[1]["windows"] == [
        {**W, "weekdays": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "months": list(range(1, 13))}
    ]
    assert response.json()["current_version"] == 1


def test_versions_of_presets_and_others_tariffs_are_refused(api, other_api):
    response = post(api, f"/api/v1/tariffs/{preset_id('cn-gd')}/versions", {"bands": BANDS, "windows": [W]})
    assert response.status_code == 403
    assert response.json()["code"] == "tariff_read_only"
    theirs = post(other_api, "/api/v1/tariffs", body()).json()["id"]
    response = post(api, f"/api/v1/tariffs/{theirs}/versions", {"bands": BANDS, "windows": [W]})
    assert response.status_code == 404
    assert TariffVersion.objects.filter(tariff_id=theirs).count() == 1


def test_a_version_with_a_gap_is_400(api):
    tariff_id = post(api, "/api/v1/tariffs", body()).json()["id"]
    response = post(
        api, f"/api/v1/tariffs/{tariff_id}/versions", {"bands": BANDS, "windows": [{**W, "end": "23:00"}]}
    )
    assert response.status_code == 400
    assert response.json()["extra"]["gaps"] == [
        {"months": "Jan–Dec", "weekdays": "Mon–Sun", "from": "23:00", "to": "24:00"}
    ]


def test_day_strip(api):
    response = api.get(f"/api/v1/tariffs/{preset_id('cn-gd')}/strip", {"date": "2026-07-15"})
    assert response.status_code == 200
    strip = response.json()
    assert (strip["code"], strip["version"], strip["date"], strip["time_zone"]) == (
        "cn-gd",
        1,
        "2026-07-15",
        "Asia/Shanghai",
    )
    assert [(r["start"], r["end"], r["band"], r["multiplier"]) for r in strip["runs"]] == [
        ("00:00", "08:00", "valley", "0.3800"),
        ("08:00", "10:00", "flat", "1.0000"),
        ("10:00", "11:00", "peak", "1.7000"),
        ("11:00", "12:00", "critical_peak", "2.1250"),
        ("12:00", "14:00", "flat", "1.0000"),
        ("14:00", "15:00", "peak", "1.7000"),
        ("15:00", "17:00", "critical_peak", "2.1250"),
        ("17:00", "19:00", "peak", "1.7000"),
        ("19:00", "24:00", "flat", "1.0000"),
    ]


def test_day_strip_previews_a_future_version(api):
    tariff_id = post(api, "/api/v1/tariffs", body()).json()["id"]
    starts = timezone.now() + timedelta(days=3)
    post(
        api,
        f"/api/v1/tariffs/{tariff_id}/versions",
        {"bands": BANDS, "windows": [W], "effective_from": starts.isoformat()},
    )
    later = (starts + timedelta(days=2)).date().isoformat()
    strip = api.get(f"/api/v1/tariffs/{tariff_id}/strip", {"date": later}).json()
    assert strip["version"] == 2
    assert strip["runs"] == [{"start": "00:00", "end": "24:00", "band": "flat", "multiplier": "1.0000"}]


@pytest.mark.parametrize("query", [{}, {"date": "2026-13-01"}, {"date": "yesterday"}, {"date": "0001-01-01"}])
def test_day_strip_needs_a_sensible_date(api, query):
    response = api.get(f"/api/v1/tariffs/{preset_id('flat')}/strip", query)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert "date" in response.json()["extra"]["fields"]
