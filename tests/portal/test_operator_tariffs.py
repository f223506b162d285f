"""Operator pages: tariffs (list, detail, new tariff, new version, preview) and a cluster's price cards."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.models import Membership, Organisation
from core.types import Actor
from federation.models import Cluster
from metering.forms.operator import windows_format, windows_parse
from metering.models import PriceCard, Tariff, TariffVersion
from metering.services.tariffs import price_card_set, tariff_create
from metering.tariffs import PRESETS, TariffSpec, WindowSpec
from tests.factories import MembershipFactory, UserFactory, make_cluster

pytestmark = pytest.mark.django_db

GAP_WINDOWS = "valley 00:00-08:00\nflat 08:00-12:00\nflat 14:00-24:00"
GAP_MESSAGE = "12:00–14:00 on Mon–Sun in Jan–Dec has no band"
GOOD_WINDOWS = (
    "valley 22:00-06:00\n"
    "flat 06:00-10:00\n"
    "peak 10:00-12:00 Mon-Fri\n"
    "flat 10:00-12:00 Sat-Sun\n"
    "flat 12:00-22:00\n"
)


def tariff_post(**overrides: Any) -> dict[str, Any]:
    data = {
        "name": "Shanghai industrial",
        "code": "sh-industrial",
        "time_zone": "Asia/Shanghai",
        "source": "",
        "multiplier_peak": "1.6",
        "multiplier_flat": "1",
        "multiplier_valley": "0.45",
        "windows": GOOD_WINDOWS,
        "effective_from": "",
        "preview_date": "",
        "action": "save",
    }
    data.update(overrides)
    return data


def counts() -> tuple[int, int, int]:
    return Tariff.objects.count(), TariffVersion.objects.count(), PriceCard.objects.count()


def alert_texts(html: str) -> list[str]:
    """The text of every element with role="alert" (tags stripped, whitespace collapsed)."""
    blocks = re.findall(r'<(div|p|ul)[^>]*role="alert"[^>]*>(.*?)</\1>', html, flags=re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", body).split()) for _, body in blocks]


def own_tariff(operator: Organisation, code: str = "own-flat") -> Tariff:
    return tariff_create(
        owner=operator,
        code=code,
        name=f"Own {code}",
        time_zone="Asia/Shanghai",
        source="",
        spec=PRESETS["cn-nx"].spec,
        effective_from=None,
        actor=Actor(organisation=operator, system_label="test"),
    )


@pytest.fixture
def operator_viewer_client(east_operator: Organisation, login: Callable[[User], Client]) -> Client:
    user = cast(User, UserFactory(username="vic"))
    MembershipFactory(user=user, organisation=east_operator, role=Membership.Role.VIEWER)
    return login(user)


# --- Guards -----------------------------------------------------------------------------------------


def _urls(cluster: Cluster, tariff: Tariff) -> list[str]:
    return [
        reverse("operator-tariff-list"),
        reverse("operator-tariff-create"),
        reverse("operator-tariff-detail", kwargs={"tariff_id": tariff.pk}),
        reverse("operator-tariff-version-create", kwargs={"tariff_id": tariff.pk}),
        reverse("operator-price-cards", kwargs={"cpi": cluster.cpi}),
    ]


def test_anonymous_is_sent_to_log_in(east_cluster: Cluster, east_operator: Organisation) -> None:
    for url in _urls(east_cluster, own_tariff(east_operator)):
        response = Client().get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url


def test_a_buyer_is_refused(buyer_client: Client, east_cluster: Cluster, east_operator: Organisation) -> None:
    for url in _urls(east_cluster, own_tariff(east_operator)):
        assert buyer_client.get(url).status_code == 403, url
    assert buyer_client.post(reverse("operator-tariff-create"), tariff_post()).status_code == 403


def test_another_operators_tariff_and_cluster_are_404(
    operator_client: Client, west_cluster: Cluster, west_operator: Organisation, east_cluster: Cluster
) -> None:
    theirs = own_tariff(west_operator, code="west-own")
    before = counts()
    assert operator_client.get(reverse("operator-tariff-detail", args=[theirs.pk])).status_code == 404
    assert operator_client.get(reverse("operator-tariff-version-create", args=[theirs.pk])).status_code == 404
    response = operator_client.post(
        reverse("operator-tariff-version-create", args=[theirs.pk]), tariff_post(code="")
    )
    assert response.status_code == 404
    url = reverse("operator-price-cards", kwargs={"cpi": west_cluster.cpi})
    assert operator_client.get(url).status_code == 404
    assert operator_client.post(url, {"rate_per_card_hour": "1", "tariff": theirs.pk}).status_code == 404
    assert operator_client.get(reverse("operator-tariff-detail", args=[999_999])).status_code == 404
    assert operator_client.get(reverse("operator-price-cards", args=["cpi:nope"])).status_code == 404
    assert counts() == before


def test_a_viewer_sees_the_pages_but_cannot_post(
    operator_viewer_client: Client, east_cluster: Cluster
) -> None:
    before = counts()
    response = operator_viewer_client.get(reverse("operator-tariff-create"))
    assert response.status_code == 200
    assert b'value="save"' not in response.content
    assert operator_viewer_client.post(reverse("operator-tariff-create"), tariff_post()).status_code == 403
    url = reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi})
    assert b"Set a new price" in operator_viewer_client.get(url).content
    assert operator_viewer_client.post(url, {"rate_per_card_hour": "5", "tariff": 1}).status_code == 403
    assert counts() == before


# --- Tariff list and detail -------------------------------------------------------------------------


def test_tariff_list_shows_presets_own_tariffs_strips_and_cluster_prices(
    operator_client: Client, east_cluster: Cluster, east_operator: Organisation
) -> None:
    mine = own_tariff(east_operator)
    response = operator_client.get(reverse("operator-tariff-list"))
    assert response.status_code == 200
    html = response.content.decode()
    for code in ("cn-gd", "cn-nx", "flat", mine.code):
        assert f"<code>{code}</code>" in html
    assert html.count('class="chart band-strip"') == 9  # today's strip of each tariff (8 presets, 1 own)
    assert "Valley ×0.38" in html and "Critical peak ×2.125" in html  # cn-gd's legend, bands by name
    # Which cluster uses which tariff at which rate.
    row = re.search(rf"<code>{re.escape(east_cluster.cpi)}</code>.*?</tr>", html, flags=re.S)
    assert row is not None
    assert "cn-gd</a> v1" in row.group(0) and "¥12.0000" in row.group(0)
    assert reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi}) in row.group(0)
    assert "used by 1 of your clusters" in html


def test_tariff_list_query_count_does_not_grow_with_tariffs_and_clusters(
    operator_client: Client,
    east_operator: Organisation,
    presets: None,
    django_assert_max_num_queries: Any,
) -> None:
    for n in range(3):
        own_tariff(east_operator, code=f"own-{n}")
    with django_assert_max_num_queries(14):
        assert operator_client.get(reverse("operator-tariff-list")).status_code == 200
    actor = Actor(organisation=east_operator, system_label="test")
    flat = Tariff.objects.get(code="flat", owner__isnull=True)
    for n in range(20):
        own_tariff(east_operator, code=f"more-{n}")
        cluster = make_cluster(operator=east_operator, hub="yrd", name=f"sh-x{n}", islands=[("isl-01", 8)])
        price_card_set(cluster=cluster, rate_per_card_hour=Decimal("3"), tariff=flat, actor=actor)
    with django_assert_max_num_queries(14):
        response = operator_client.get(reverse("operator-tariff-list"))
    assert response.status_code == 200
    assert response.content.decode().count('class="chart band-strip"') == 31  # 8 presets, 23 own


def test_tariff_detail_lists_versions_with_a_strip_each(
    operator_client: Client, east_operator: Organisation, presets: None
) -> None:
    mine = own_tariff(east_operator)
    later = timezone.now() + timedelta(days=3)
    spec = TariffSpec("Asia/Shanghai", {"flat": Decimal("1")}, (WindowSpec("flat", 0, 1440),))
    from metering.services.tariffs import tariff_version_create

    tariff_version_create(
        tariff=mine,
        spec=spec,
        effective_from=later,
        actor=Actor(organisation=east_operator, system_label="t"),
    )
    response = operator_client.get(reverse("operator-tariff-detail", args=[mine.pk]), {"date": "2026-07-01"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Version 2" in html and "Version 1" in html
    assert html.count('class="chart band-strip"') == 2
    assert "in force" in html
    assert "Wed 2026-07-01" in html
    assert "23:00" in html  # the cn-nx windows of version 1 (flat from 23:00)


def test_a_preset_cannot_get_a_new_version_from_an_operator(operator_client: Client, presets: None) -> None:
    preset = Tariff.objects.get(code="cn-gd", owner__isnull=True)
    before = counts()
    assert operator_client.get(reverse("operator-tariff-version-create", args=[preset.pk])).status_code == 403
    response = operator_client.post(
        reverse("operator-tariff-version-create", args=[preset.pk]), tariff_post(action="save")
    )
    assert response.status_code == 403
    assert counts() == before


# --- Creating a tariff ------------------------------------------------------------------------------


def test_a_gap_is_named_beside_the_windows_and_nothing_is_saved(
    operator_client: Client, presets: None
) -> None:
    before = counts()
    response = operator_client.post(
        reverse("operator-tariff-create"), tariff_post(windows=GAP_WINDOWS, multiplier_peak="")
    )
    assert response.status_code == 200
    assert counts() == before
    html = response.content.decode()
    windows_alert = re.search(r'<div role="alert" id="windows-errors"[^>]*>(.*?)</div>', html, flags=re.S)
    assert windows_alert is not None
    assert GAP_MESSAGE in windows_alert.group(1)
    assert any(GAP_MESSAGE in text for text in alert_texts(html))
    # The alert sits right by the windows textarea, which points at it.
    assert html.index('id="windows-errors"') < html.index('name="windows"')
    assert 'aria-describedby="windows-help windows-errors"' in html


def test_an_overlap_and_a_missing_multiplier_are_put_beside_their_fields(
    operator_client: Client, presets: None
) -> None:
    before = counts()
    response = operator_client.post(
        reverse("operator-tariff-create"),
        tariff_post(
            windows="flat 00:00-24:00\npeak 10:00-12:00 Mon-Fri", multiplier_peak="", multiplier_valley=""
        ),
    )
    assert response.status_code == 200
    form = response.context["form"]
    assert "10:00–12:00 on Mon–Fri in Jan–Dec is in both peak and flat" in form.errors["windows"]
    assert form.errors["multiplier_peak"] == ["A window uses this band: give it a multiplier."]
    assert counts() == before


def test_syntax_faults_are_named_by_line(operator_client: Client, presets: None) -> None:
    response = operator_client.post(
        reverse("operator-tariff-create"),
        tariff_post(windows="valley 00:00-08:00\nvaley 08:00-24:00\nflat 25:00-26:00\nflat 08:00-24:00 Mox"),
    )
    errors = response.context["form"].errors["windows"]
    assert errors[0].startswith("Line 2: “valey” is not a band")
    assert "Line 3: 25:00 is not a start time (00:00–23:59)." in errors
    assert any(e.startswith("Line 4: “Mox” is not a weekday") for e in errors)


def test_unused_band_bad_zone_and_taken_code_are_field_errors(
    operator_client: Client, east_operator: Organisation, presets: None
) -> None:
    own_tariff(east_operator, code="sh-industrial")
    before = counts()
    response = operator_client.post(
        reverse("operator-tariff-create"), tariff_post(multiplier_deep_valley="0.2")
    )
    assert response.context["form"].errors["multiplier_deep_valley"] == [
        "No window uses this band: leave the multiplier blank or add a window."
    ]
    response = operator_client.post(reverse("operator-tariff-create"), tariff_post(time_zone="Mars/Olympus"))
    assert response.context["form"].errors["time_zone"] == [
        "Mars/Olympus is not an IANA time zone (e.g. Asia/Shanghai)."
    ]
    response = operator_client.post(reverse("operator-tariff-create"), tariff_post())
    assert response.status_code == 200
    assert response.context["form"].errors["code"] == ["You already have a tariff 'sh-industrial'."]
    assert counts() == before


def test_a_valid_tariff_is_saved_with_its_first_version(
    operator_client: Client, east_operator: Organisation, presets: None
) -> None:
    response = operator_client.post(reverse("operator-tariff-create"), tariff_post())
    tariff = Tariff.objects.get(owner=east_operator, code="sh-industrial")
    assert response.status_code == 302
    assert response["Location"] == reverse("operator-tariff-detail", args=[tariff.pk])
    (version,) = tariff.versions.all()
    assert version.version == 1
    assert {b.band: b.multiplier for b in version.bands.all()} == {
        "peak": Decimal("1.6000"),
        "flat": Decimal("1.0000"),
        "valley": Decimal("0.4500"),
    }
    windows = sorted(
        (w.band, w.start_minute, w.end_minute, w.weekdays, w.months) for w in version.windows.all()
    )
    assert windows == [
        ("flat", 360, 600, 127, 4095),
        ("flat", 600, 720, 0b1100000, 4095),
        ("flat", 720, 1320, 127, 4095),
        ("peak", 600, 720, 0b0011111, 4095),
        ("valley", 1320, 360, 127, 4095),
    ]
    assert version.created_by  # the portal actor is recorded
    page = operator_client.get(response["Location"])
    assert "Tariff sh-industrial created." in page.content.decode()


def test_preview_saves_nothing_and_draws_the_day_and_its_week(operator_client: Client, presets: None) -> None:
    before = counts()
    response = operator_client.post(
        reverse("operator-tariff-create"), tariff_post(action="preview", preview_date="2026-07-04")
    )
    assert response.status_code == 200
    assert counts() == before
    html = response.content.decode()
    assert "The schedule is valid" in html
    assert html.count('class="chart band-strip"') == 8  # the day, then Monday to Sunday of its week
    assert "<title>Preview of 2026-07-04</title>" in html
    preview = response.context["preview"]
    assert [(r.start, r.end, r.band) for r in preview.runs] == [
        ("00:00", "06:00", "valley"),
        ("06:00", "22:00", "flat"),  # a Saturday: no peak
        ("22:00", "24:00", "valley"),
    ]
    # A preview with a gap shows the gap and no strip.
    response = operator_client.post(
        reverse("operator-tariff-create"), tariff_post(action="preview", windows=GAP_WINDOWS)
    )
    assert GAP_MESSAGE in response.context["form"].errors["windows"]
    assert 'class="chart band-strip"' not in response.content.decode()
    assert counts() == before


def test_new_version_form_starts_from_the_latest_and_publishes_the_next(
    operator_client: Client, east_operator: Organisation, presets: None
) -> None:
    mine = own_tariff(east_operator)
    url = reverse("operator-tariff-version-create", args=[mine.pk])
    page = operator_client.get(url)
    assert page.status_code == 200
    initial_lines = page.context["form"].initial["windows"].splitlines()
    assert sorted(initial_lines) == sorted(windows_format(PRESETS["cn-nx"].spec.windows).splitlines())
    assert page.context["form"].initial["multiplier_peak"] == Decimal("1.5")
    start = (timezone.localtime() + timedelta(days=2)).replace(second=0, microsecond=0)
    data = tariff_post(windows="flat 00:00-24:00", multiplier_peak="", multiplier_valley="")
    data["effective_from"] = start.strftime("%Y-%m-%dT%H:%M")
    response = operator_client.post(url, data)
    assert response.status_code == 302
    v2 = mine.versions.get(version=2)
    assert v2.effective_from == start
    assert [(w.band, w.start_minute, w.end_minute) for w in v2.windows.all()] == [("flat", 0, 1440)]
    # A version in the past is refused beside its field, nothing written.
    before = counts()
    data["effective_from"] = "2020-01-01T00:00"
    response = operator_client.post(url, data)
    assert response.status_code == 200
    assert response.context["form"].errors["effective_from"] == ["must be now or later"]
    assert counts() == before


def test_the_window_syntax_round_trips_every_preset() -> None:
    for preset in PRESETS.values():
        parsed = windows_parse(windows_format(preset.spec.windows))
        assert parsed.errors == ()
        assert parsed.windows == preset.spec.windows
    parsed = windows_parse(
        "# comment\n\nCritical peak 11:00 – 12:00 Mon, Wed–Fri Nov-Feb\nvalley 22:00-00:00"
    )
    assert parsed.errors == ()
    assert parsed.lines == (3, 4)
    first, second = parsed.windows
    assert (first.band, first.weekdays, first.months) == ("critical_peak", 0b0011101, 0b1100_0000_0011)
    assert (second.start_minute, second.end_minute) == (1320, 1440)


# --- Price cards ------------------------------------------------------------------------------------


def test_price_cards_page_shows_versions_and_the_current_one(
    operator_client: Client, east_cluster: Cluster
) -> None:
    url = reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi})
    response = operator_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "¥12.0000" in html and "cn-gd</a> v1" in html
    assert 'class="badge good">current' in html
    assert 'class="chart band-strip"' in html
    assert response.context["form"].initial["rate_per_card_hour"] == Decimal("12.0000")


def test_setting_a_price_writes_exactly_one_version_with_the_exact_rate(
    operator_client: Client, east_cluster: Cluster
) -> None:
    url = reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi})
    nx = Tariff.objects.get(code="cn-nx", owner__isnull=True)
    response = operator_client.post(
        url, {"rate_per_card_hour": "13.4567", "tariff": nx.pk, "effective_from": ""}
    )
    assert response.status_code == 302 and response["Location"] == url
    cards = list(PriceCard.objects.filter(cluster=east_cluster).order_by("version"))
    assert len(cards) == 2
    card = cards[1]
    assert (card.version, card.rate_per_card_hour, card.tariff_version) == (
        2,
        Decimal("13.4567"),
        nx.versions.get(version=1),
    )
    page = operator_client.get(url).content.decode()
    assert "Price card version 2 set: 13.4567 CNY per card-hour on cn-nx v1." in page
    assert page.count("¥13.4567") >= 2  # in force now, and in the history
    history = operator_client.get(url).context["page"].object_list
    assert [(c.version, c.until) for c in history] == [(2, None), (1, card.effective_from)]


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ("0", "Enter a rate greater than 0."),
        ("-3", "Enter a rate greater than 0."),
        ("abc", "Enter a number."),
        ("1.23456", "Ensure that there are no more than 4 decimal places."),
        ("", "This field is required."),
    ],
)
def test_a_bad_rate_is_a_field_error_and_nothing_is_written(
    operator_client: Client, east_cluster: Cluster, rate: str, message: str
) -> None:
    url = reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi})
    flat = Tariff.objects.get(code="flat", owner__isnull=True)
    before = counts()
    response = operator_client.post(url, {"rate_per_card_hour": rate, "tariff": flat.pk})
    assert response.status_code == 200
    assert response.context["form"].errors["rate_per_card_hour"] == [message]
    assert message in " ".join(alert_texts(response.content.decode()))
    assert counts() == before


def test_a_past_start_or_another_operators_tariff_is_refused_beside_its_field(
    operator_client: Client, east_cluster: Cluster, west_operator: Organisation
) -> None:
    url = reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi})
    flat = Tariff.objects.get(code="flat", owner__isnull=True)
    theirs = own_tariff(west_operator, code="west-own")
    before = counts()
    response = operator_client.post(
        url, {"rate_per_card_hour": "5", "tariff": flat.pk, "effective_from": "2020-01-01T00:00"}
    )
    assert response.context["form"].errors["effective_from"] == ["must be now or later"]
    response = operator_client.post(url, {"rate_per_card_hour": "5", "tariff": theirs.pk})
    assert response.status_code == 200
    assert "tariff" in response.context["form"].errors
    assert counts() == before


def test_price_card_history_is_paginated_with_a_fixed_query_count(
    operator_client: Client, east_cluster: Cluster, django_assert_max_num_queries: Any
) -> None:
    actor = Actor(organisation=east_cluster.operator, system_label="test")
    flat = Tariff.objects.get(code="flat", owner__isnull=True)
    for n in range(60):
        price_card_set(cluster=east_cluster, rate_per_card_hour=Decimal(n + 1), tariff=flat, actor=actor)
    url = reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi})
    with django_assert_max_num_queries(12):
        response = operator_client.get(url)
    assert response.status_code == 200
    assert len(response.context["page"].object_list) == 50
    assert response.context["current"].version == 61
    assert len(operator_client.get(url, {"page": 2}).context["page"].object_list) == 11
