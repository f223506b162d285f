"""Price cards: versioned per cluster, each locking the tariff version in force when it takes effect;
tariff versions never retroactive; only the cluster's operator sets its price."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from core.types import Actor
from federation.errors import ClusterNotFoundError
from metering.errors import (
    PriceCardInvalidError,
    PriceCardNotFoundError,
    TariffNotFoundError,
    TariffReadOnlyError,
)
from metering.models import PriceCard, Tariff, TariffVersion
from metering.selectors.tariffs import (
    compiled_tariff,
    price_card_current,
    price_card_get,
    price_card_list,
    tariff_version_current,
    tariff_version_spec,
)
from metering.services.tariffs import price_card_set, tariff_create, tariff_version_create
from metering.tariffs import PRESETS, TariffSpec, WindowSpec
from tests.factories import BuyerFactory, make_cluster

pytestmark = pytest.mark.django_db

CPI = "cpi:cucc:nx:zw-ai01"
TWO_BANDS = TariffSpec(
    time_zone="Asia/Shanghai",
    multipliers={"valley": Decimal("0.5"), "peak": Decimal("1.5")},
    windows=(WindowSpec("valley", 0, 720), WindowSpec("peak", 720, 1440)),
)


def preset(code: str) -> Tariff:
    return Tariff.objects.get(owner__isnull=True, code=code)


def as_(organisation) -> Actor:
    return Actor(organisation=organisation, system_label="test")


def own_tariff(operator, *, code: str = "own", effective_from=None) -> Tariff:
    return tariff_create(
        owner=operator,
        code=code,
        name="Own",
        time_zone="Asia/Shanghai",
        source="",
        spec=PRESETS["cn-nx"].spec,
        effective_from=effective_from,
        actor=as_(operator),
    )


def set_price(cluster, rate: str = "10", tariff: Tariff | None = None, effective_from=None) -> PriceCard:
    return price_card_set(
        cluster=cluster,
        rate_per_card_hour=Decimal(rate),
        tariff=tariff or preset("cn-gd"),
        effective_from=effective_from,
        actor=as_(cluster.operator),
    )


def test_versions_are_kept_and_the_newest_is_current(operator):
    cluster = make_cluster(operator=operator)
    first = set_price(cluster, "10.5")
    second = set_price(cluster, "12.25", tariff=preset("cn-nx"))

    assert (first.version, second.version) == (1, 2)
    first.refresh_from_db()
    assert first.rate_per_card_hour == Decimal("10.5000")
    assert first.tariff_version.tariff.code == "cn-gd"
    assert first.currency == "CNY"
    assert first.created_by == "test"
    assert price_card_current(cluster=cluster) == second
    assert price_card_current(cluster=cluster, at=first.effective_from) == first
    assert list(price_card_list(cluster=cluster)) == [second, first]
    assert price_card_get(cluster=cluster, version=1) == first
    with pytest.raises(PriceCardNotFoundError):
        price_card_get(cluster=cluster, version=3)


def test_no_price_card_yet(operator):
    cluster = make_cluster(operator=operator)
    with pytest.raises(PriceCardNotFoundError):
        price_card_current(cluster=cluster)
    card = set_price(cluster)
    with pytest.raises(PriceCardNotFoundError):
        price_card_current(cluster=cluster, at=card.effective_from - timedelta(seconds=1))


def test_a_card_locks_the_tariff_version_in_force_when_it_takes_effect(operator):
    cluster = make_cluster(operator=operator)
    tariff = own_tariff(operator)
    v1 = tariff.versions.get()
    now = timezone.now()
    v2 = tariff_version_create(
        tariff=tariff, spec=TWO_BANDS, effective_from=now + timedelta(days=1), actor=as_(operator)
    )

    today = set_price(cluster, tariff=tariff)
    tomorrow = set_price(cluster, tariff=tariff, effective_from=now + timedelta(days=2))

    assert today.tariff_version == v1
    assert tomorrow.tariff_version == v2
    # A later tariff version never changes a card already set.
    v3 = tariff_version_create(
        tariff=tariff, spec=PRESETS["cn-nx"].spec, effective_from=now + timedelta(days=3), actor=as_(operator)
    )
    today.refresh_from_db()
    tomorrow.refresh_from_db()
    assert (today.tariff_version, tomorrow.tariff_version) == (v1, v2)
    assert tariff_version_current(tariff=tariff, at=now + timedelta(days=4)) == v3
    assert tariff_version_spec(version=v2) == TWO_BANDS
    assert price_card_current(cluster=cluster, at=now + timedelta(days=2, seconds=1)) == tomorrow


def test_a_scheduled_price_can_be_replaced_at_the_same_instant(operator):
    cluster = make_cluster(operator=operator)
    starts = timezone.now() + timedelta(hours=6)
    scheduled = set_price(cluster, "20", effective_from=starts)
    replacement = set_price(cluster, "18", effective_from=starts)
    assert price_card_current(cluster=cluster, at=starts) == replacement
    assert PriceCard.objects.get(pk=scheduled.pk).rate_per_card_hour == Decimal("20")


@pytest.mark.parametrize(
    ("rate", "fault"),
    [
        ("-0.01", "must be 0 or more"),
        ("1.00001", "has more than 4 decimal places"),
        ("100000000", "must be at most 99999999.9999"),
        ("NaN", "must be a finite number"),
    ],
)
def test_bad_rates_are_refused_and_nothing_is_written(operator, rate, fault):
    cluster = make_cluster(operator=operator)
    with pytest.raises(PriceCardInvalidError) as caught:
        set_price(cluster, rate)
    assert caught.value.extra["fields"] == {"rate_per_card_hour": [fault]}
    assert not PriceCard.objects.exists()


def test_a_free_price_is_allowed(operator):
    assert set_price(make_cluster(operator=operator), "0").rate_per_card_hour == 0


def test_effective_from_is_never_in_the_past(operator):
    cluster = make_cluster(operator=operator)
    with pytest.raises(PriceCardInvalidError) as caught:
        set_price(cluster, effective_from=timezone.now() - timedelta(minutes=2))
    assert "past" in caught.value.message
    # A client clock a few seconds behind is still "now".
    assert set_price(cluster, effective_from=timezone.now() - timedelta(seconds=20)).version == 1


def test_a_card_cannot_take_effect_before_the_newest_one(operator):
    cluster = make_cluster(operator=operator)
    set_price(cluster, effective_from=timezone.now() + timedelta(days=2))
    with pytest.raises(PriceCardInvalidError) as caught:
        set_price(cluster, effective_from=timezone.now() + timedelta(days=1))
    assert "effective_from" in caught.value.extra["fields"]
    assert PriceCard.objects.count() == 1


def test_a_tariff_with_no_version_in_force_yet_cannot_be_locked(operator):
    cluster = make_cluster(operator=operator)
    tariff = own_tariff(operator, effective_from=timezone.now() + timedelta(days=7))
    with pytest.raises(PriceCardInvalidError) as caught:
        set_price(cluster, tariff=tariff)
    assert caught.value.extra["tariff_starts"] is not None


def test_another_operators_tariff_or_cluster_is_not_found(operator, other_operator):
    cluster = make_cluster(operator=operator)
    others_tariff = own_tariff(other_operator, code="theirs")
    with pytest.raises(TariffNotFoundError):
        set_price(cluster, tariff=others_tariff)
    with pytest.raises(ClusterNotFoundError):
        price_card_set(
            cluster=cluster,
            rate_per_card_hour=Decimal("1"),
            tariff=preset("flat"),
            effective_from=None,
            actor=as_(other_operator),
        )
    assert not PriceCard.objects.exists()


def test_tariff_versions_are_not_retroactive_and_come_in_order(operator):
    tariff = own_tariff(operator)
    with pytest.raises(Exception) as caught:
        tariff_version_create(
            tariff=tariff,
            spec=TWO_BANDS,
            effective_from=timezone.now() - timedelta(hours=1),
            actor=as_(operator),
        )
    assert caught.value.code == "tariff_invalid"  # type: ignore[attr-defined]
    later = timezone.now() + timedelta(days=2)
    tariff_version_create(tariff=tariff, spec=TWO_BANDS, effective_from=later, actor=as_(operator))
    with pytest.raises(Exception) as caught:
        tariff_version_create(
            tariff=tariff, spec=TWO_BANDS, effective_from=later - timedelta(hours=1), actor=as_(operator)
        )
    assert caught.value.code == "tariff_invalid"  # type: ignore[attr-defined]
    assert tariff.versions.count() == 2


def test_presets_change_only_by_the_platform(operator, other_operator):
    gd = preset("cn-gd")
    with pytest.raises(TariffReadOnlyError):
        tariff_version_create(tariff=gd, spec=TWO_BANDS, effective_from=None, actor=as_(operator))
    with pytest.raises(TariffNotFoundError):
        tariff_version_create(
            tariff=own_tariff(operator), spec=TWO_BANDS, effective_from=None, actor=as_(other_operator)
        )
    version = tariff_version_create(
        tariff=gd, spec=TWO_BANDS, effective_from=None, actor=Actor.system("back office")
    )
    assert version.version == 2
    assert version.created_by == "back office"


def test_compiled_tariffs_are_cached_per_version():
    version = preset("cn-gd").versions.get()
    compiled = compiled_tariff(tariff_version_id=version.pk)
    assert compiled_tariff(tariff_version_id=version.pk) is compiled
    assert compiled.bands == ("critical_peak", "peak", "flat", "valley")
    with pytest.raises(TariffNotFoundError):
        compiled_tariff(tariff_version_id=10**12)
    assert TariffVersion.objects.filter(pk=version.pk).exists()


# --- Authorisation through the API ------------------------------------------------------------------

URL = f"/api/v1/clusters/{CPI}/price-cards"


def post(client, body):
    return client.post(URL, data=json.dumps(body), content_type="application/json")


def test_the_operator_sets_and_lists_its_price_cards(operator, api):
    make_cluster(operator=operator)
    response = post(api, {"rate_per_card_hour": "12.5", "tariff_id": preset("cn-gd").pk})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["rate_per_card_hour"] == "12.5000"
    assert body["currency"] == "CNY"
    assert (body["cpi"], body["version"], body["tariff_code"], body["tariff_version"]) == (CPI, 1, "cn-gd", 1)

    listing = api.get(URL).json()
    assert listing["count"] == 1
    assert listing["results"][0]["version"] == 1


def test_another_operators_cluster_is_404_and_unchanged(operator, other_api):
    cluster = make_cluster(operator=operator)
    set_price(cluster)
    assert other_api.get(URL).status_code == 404
    response = post(other_api, {"rate_per_card_hour": "0.01", "tariff_id": preset("flat").pk})
    assert response.status_code == 404
    assert response.json()["code"] == "cluster_not_found"
    assert PriceCard.objects.count() == 1


def test_a_read_only_token_cannot_set_a_price(operator, token_client):
    make_cluster(operator=operator)
    client = token_client(operator, scope="read_only")
    assert client.get(URL).status_code == 200
    response = post(client, {"rate_per_card_hour": "1", "tariff_id": preset("flat").pk})
    assert response.status_code == 403
    assert response.json()["code"] == "read_only_credential"
    assert not PriceCard.objects.exists()


def test_a_buyer_cannot_read_or_set_price_cards(operator, token_client):
    make_cluster(operator=operator)
    client = token_client(BuyerFactory(slug="acme"))
    assert client.get(URL).json()["code"] == "not_an_operator"
    response = post(client, {"rate_per_card_hour": "1", "tariff_id": preset("flat").pk})
    assert response.status_code == 403
    assert response.json()["code"] == "not_an_operator"


def test_another_operators_tariff_is_404_in_a_price_card(operator, other_operator, api):
    make_cluster(operator=operator)
    theirs = own_tariff(other_operator, code="theirs")
    response = post(api, {"rate_per_card_hour": "1", "tariff_id": theirs.pk})
    assert response.status_code == 404
    assert response.json()["code"] == "tariff_not_found"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rate_per_card_hour": "-1", "tariff_id": 1}, "rate_per_card_hour"),
        ({"rate_per_card_hour": "1.00001", "tariff_id": 1}, "rate_per_card_hour"),
        ({"rate_per_card_hour": "abc", "tariff_id": 1}, "rate_per_card_hour"),
        ({"rate_per_card_hour": "1"}, "tariff_id"),
        ({"rate_per_card_hour": "1", "tariff_id": 0}, "tariff_id"),
        (
            {"rate_per_card_hour": "1", "tariff_id": 1, "effective_from": "2030-01-01T00:00:00"},
            "effective_from",
        ),
    ],
)
def test_bad_price_card_input_is_400_with_the_field(operator, api, body, field):
    make_cluster(operator=operator)
    response = post(api, body)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert field in response.json()["extra"]["fields"]


def test_a_price_card_in_the_past_is_400(operator, api):
    make_cluster(operator=operator)
    response = post(
        api,
        {"rate_per_card_hour": "1", "tariff_id": preset("flat").pk, "effective_from": "2020-01-01T00:00:00Z"},
    )
    assert response.status_code == 400
    assert response.json()["code"] == "price_card_invalid"
    assert "effective_from" in response.json()["extra"]["fields"]
