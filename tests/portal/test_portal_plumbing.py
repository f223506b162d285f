"""The portal's guard, navigation and organisation switcher (core.portal)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from core.charts import Bar, band_strip_svg, line_svg, stacked_bars_svg
from core.models import Organisation
from core.portal import NAV_ITEMS
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def test_every_navigation_item_resolves() -> None:
    for item in NAV_ITEMS:
        assert reverse(item.url_name).startswith("/"), item.url_name


def test_login_page_renders_and_logs_in(buyer_user: User) -> None:
    client = Client()
    response = client.get(reverse("login"))
    assert response.status_code == 200
    assert b'name="username"' in response.content
    response = client.post(reverse("login"), {"username": "alice", "password": "portal-pass-2026"})
    assert response.status_code == 302


def test_switcher_changes_the_acting_organisation(
    buyer_client: Client, buyer_user: User, east_operator: Organisation
) -> None:
    MembershipFactory(user=buyer_user, organisation=east_operator, role="member")
    response = buyer_client.post(reverse("organisation-switch"), {"organisation": east_operator.slug})
    assert response.status_code == 302
    assert buyer_client.session["cardhour_organisation"] == east_operator.slug


def test_switcher_refuses_an_organisation_the_person_is_not_in(
    buyer_client: Client, other_buyer: Organisation
) -> None:
    buyer_client.post(reverse("organisation-switch"), {"organisation": other_buyer.slug})
    assert "cardhour_organisation" not in buyer_client.session


def test_charts_escape_their_labels() -> None:
    strip = band_strip_svg([(0, 480, "valley"), (480, 1440, "<peak>")], title="a & b")
    assert "&lt;peak&gt;" in strip and "a &amp; b" in strip
    bars = stacked_bars_svg(
        [Bar("d1", {"valley": 1, "peak": 2})],
        title="t",
        series=["valley", "peak"],
        unit="h",  # type: ignore[dict-item]
    )
    assert bars.count("<rect") == 2
    assert "<polyline" in line_svg([("a", 1), ("b", 2)], title="t")  # type: ignore[list-item]
