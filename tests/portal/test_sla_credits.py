"""SLA credit notes on the portal and over the API: the buyer's list and credit-note page with the figures of
the note (issued through the scenario's real path), the operator's view of credits against it, other
organisations' 404s; the price card's service level over the API; announced maintenance over the API."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from broker.services.failover import leases_fail_over
from broker.services.sla import leases_sla_assess_due
from core.models import Organisation
from core.services import api_token_create
from federation.models import ClusterMaintenance
from metering.models import SlaCredit
from metering.services.sla import sla_credit_dispute_decide
from tests.factories import BuyerFactory, OperatorFactory
from tests.portal.conftest import _person
from tests.scenarios.test_sla_credit import (  # noqa: F401 (the scenario's world fixture)
    STAFF,
    at,
    cluster_misses_heartbeats,
    report,
    running_lease,
    world,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def credit(world) -> SlaCredit:  # noqa: F811
    """The scenario's non-checkpointable lease: 30 min delivered, then lost to the end (25 %, 50 % back)."""
    lease = running_lease(world, checkpointable=False)
    report(lease, 0, 30, now=31)
    cluster_misses_heartbeats(world, last_beat=35, now=40)
    leases_fail_over(now=at(40))
    leases_sla_assess_due(now=at(60))
    return SlaCredit.objects.get()


def client_of(organisation: Organisation, username: str) -> Client:
    client = Client()
    client.force_login(_person(username, organisation))
    return client


def api_of(organisation: Organisation) -> APIClient:
    _token, secret = api_token_create(organisation=organisation, name=f"{organisation.slug}-test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_the_buyer_reads_its_credit_note(world, credit: SlaCredit) -> None:  # noqa: F811
    client = client_of(world["buyer"], "alice")
    listing = client.get(reverse("sla-credit-list")).content.decode()
    assert f"SLA-{credit.pk}" in listing and "25.000 %" in listing
    page = client.get(reverse("sla-credit-detail", args=[credit.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    for fragment in (
        f"SLA credit note SLA-{credit.pk}",
        "availability 25.000 % against a service level of 99.5 %",
        "90.0 min lost to the operator out of 120.0 min counted",
        "below 90 %, 50 % of the lease&#x27;s charge is credited",
        "What you paid for the lease",
        "¥36.00",  # what the buyer paid: 4 A800 card-hours of its 9 CNY pack (its usage page's figure)
        "Returned to you: 50 % of it",
        "¥18.00",  # prepaid value back (2 of the 4 A800 card-hours at 9 CNY)
        "+2.000000",  # card-hours back in the pack
        f"#{credit.transfer_id}",
        "tl-lost",
        "← applied",
    ):
        assert fragment in html, fragment
    # One figure for what the buyer pays: not the operator's list charge (¥48.00) or its half (¥24.00).
    assert "¥48.00" not in html and "¥24.00" not in html
    # Only the buyer's page: the operator's URL for the same note is not the buyer's.
    assert client.get(reverse("operator-sla-credit-detail", args=[credit.pk])).status_code == 403


def test_the_operator_sees_credits_against_it_and_the_debit(world, credit: SlaCredit) -> None:  # noqa: F811
    client = client_of(world["east"].operator, "olga")
    assert f"SLA-{credit.pk}" in client.get(reverse("operator-sla-credit-list")).content.decode()
    html = client.get(reverse("operator-sla-credit-detail", args=[credit.pk])).content.decode()
    assert "Debited from your payable" in html and "¥21.60" in html and "¥2.40" in html


def test_another_buyer_and_another_operator_get_404(world, credit: SlaCredit) -> None:  # noqa: F811
    other = client_of(BuyerFactory(slug="globex"), "bob")
    assert other.get(reverse("sla-credit-detail", args=[credit.pk])).status_code == 404
    assert f"SLA-{credit.pk}" not in other.get(reverse("sla-credit-list")).content.decode()
    other_operator = client_of(world["west"].operator, "oscar")
    assert other_operator.get(reverse("operator-sla-credit-detail", args=[credit.pk])).status_code == 404


def test_a_reversed_credit_shows_its_reversal(world, credit: SlaCredit) -> None:  # noqa: F811
    dispute = sla_credit_dispute_decide(
        credit=credit, accepted=True, reason="agent network fault", actor=STAFF
    )
    html = (
        client_of(world["buyer"], "alice")
        .get(reverse("sla-credit-detail", args=[credit.pk]))
        .content.decode()
    )
    assert "Reversed after the operator" in html and f"#{dispute.reversal_transfer_id}" in html


def test_the_credit_api_for_buyer_and_operator(world, credit: SlaCredit) -> None:  # noqa: F811
    buyer_api = api_of(world["buyer"])
    listing = buyer_api.get("/api/v1/sla-credits").json()
    assert [row["id"] for row in listing["results"]] == [credit.pk]
    detail = buyer_api.get(f"/api/v1/sla-credits/{credit.pk}").json()
    assert detail["availability_percent"] == "25.000"
    assert (detail["charge_cny"], detail["credit_cny"], detail["buyer_value_cny"]) == (
        "48.00",
        "24.00",
        "18.00",
    )
    assert detail["transfer_id"] == credit.transfer_id and detail["dispute"] is None
    assert detail["lines"] == [
        {
            "to": "pack",
            "pack_id": world["pack"].pk,
            "pack_class": "nvidia-a800-sxm4-80gb",
            "card_hours": "2.000000",
            "value_cny": "18.00",
            "gross_cny": "24.00",
        }
    ]
    operator_api = api_of(world["east"].operator)
    assert [r["id"] for r in operator_api.get("/api/v1/sla-credits?role=operator").json()["results"]] == [
        credit.pk
    ]
    assert operator_api.get("/api/v1/sla-credits?role=buyer").json()["results"] == []
    stranger = api_of(BuyerFactory(slug="globex"))
    assert stranger.get(f"/api/v1/sla-credits/{credit.pk}").json()["code"] == "sla_credit_not_found"


def test_price_card_sla_over_the_api(world) -> None:  # noqa: F811
    operator = world["west"].operator
    api = api_of(operator)
    tariff_id = world["west"].price_cards.get().tariff_version.tariff_id
    url = f"/api/v1/clusters/{world['west'].cpi}/price-cards"
    bad = api.post(
        url,
        {
            "rate_per_card_hour": "9.0000",
            "tariff_id": tariff_id,
            "sla_availability_percent": "99.5",
            "sla_credit_schedule": [
                {"below_percent": "99", "credit_percent": "30"},
                {"below_percent": "95", "credit_percent": "20"},
            ],
        },
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["code"] == "price_card_invalid"
    assert "sla_credit_schedule" in bad.json()["extra"]["fields"]
    good = api.post(
        url,
        {
            "rate_per_card_hour": "9.0000",
            "tariff_id": tariff_id,
            "sla_availability_percent": "99.9",
            "sla_credit_schedule": [{"below_percent": "99.9", "credit_percent": "10"}],
        },
        format="json",
    )
    assert good.status_code == 201, good.json()
    assert good.json()["sla_availability_percent"] == "99.900"
    assert good.json()["sla_credit_schedule"] == [{"below_percent": "99.900", "credit_percent": "10.000"}]


def test_maintenance_is_announced_over_the_api_with_the_platforms_clock(world) -> None:  # noqa: F811
    api = api_of(world["east"].operator)
    url = f"/api/v1/clusters/{world['east'].cpi}/maintenance"
    starts = timezone.now().replace(microsecond=0) + timedelta(days=2)
    created = api.post(
        url,
        {
            "starts_at": starts.isoformat(),
            "ends_at": (starts + timedelta(hours=4)).isoformat(),
            "reason": "PDU swap",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert created.json()["notice_met"] is True
    window = ClusterMaintenance.objects.get()
    assert timezone.now() - window.announced_at < timedelta(minutes=1)
    past = api.post(
        url,
        {
            "starts_at": (timezone.now() - timedelta(hours=1)).isoformat(),
            "ends_at": starts.isoformat(),
            "reason": "x",
        },
        format="json",
    )
    assert past.status_code == 400 and past.json()["code"] == "maintenance_invalid"
    assert [row["reason"] for row in api.get(url).json()["results"]] == ["PDU swap"]
    # Another operator's cluster is not found, and nothing is written.
    stranger = api_of(OperatorFactory(slug="cmcc"))
    assert (
        stranger.post(
            url,
            {
                "starts_at": starts.isoformat(),
                "ends_at": (starts + timedelta(hours=1)).isoformat(),
                "reason": "x",
            },
            format="json",
        ).status_code
        == 404
    )
    assert ClusterMaintenance.objects.count() == 1


def test_the_operator_sets_a_service_level_in_the_price_form(world) -> None:  # noqa: F811
    cluster = world["west"]
    client = client_of(cluster.operator, "oscar")
    url = reverse("operator-price-cards", kwargs={"cpi": cluster.cpi})
    tariff_id = cluster.price_cards.get().tariff_version.tariff_id
    bad = client.post(
        url,
        {
            "rate_per_card_hour": "9.0000",
            "tariff": tariff_id,
            "sla_availability_percent": "99.5",
            "sla_credit_schedule": "99:10, 95:5",
        },
    )
    assert bad.status_code == 200 and "credits must grow as availability falls" in bad.content.decode()
    assert cluster.price_cards.count() == 1
    good = client.post(
        url,
        {
            "rate_per_card_hour": "9.0000",
            "tariff": tariff_id,
            "sla_availability_percent": "99.5",
            "sla_credit_schedule": "99.5:10， 99%:25",  # a full-width comma and a percent sign are fine
        },
    )
    assert good.status_code == 302
    card = cluster.price_cards.order_by("-version").first()
    assert card.sla_availability_percent == Decimal("99.5")
    assert card.sla_credit_schedule == [
        {"below_percent": "99.5", "credit_percent": "10"},
        {"below_percent": "99", "credit_percent": "25"},
    ]
    page = client.get(url).content.decode()
    assert "99.5 %" in page and "below 99.5 %: 10 % back" in page
