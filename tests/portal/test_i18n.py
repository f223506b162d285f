"""Chinese as a first-class language: the switch, the browser's choice, band names, zones and numbers."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.template import Context, Template
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation
from rest_framework.test import APIClient

from core.models import Organisation
from federation.models import Cluster
from metering.models import Band, Pack, Tariff
from tests.factories import make_cluster
from tests.portal.test_usage_dashboard import A800, day, rows_of, used  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

SET_LANGUAGE = "/i18n/setlang/"


def html_lang(response: object) -> str:
    match = re.search(r'<html lang="([^"]+)">', response.content.decode())  # type: ignore[attr-defined]
    assert match is not None
    return match.group(1)


def render(source: str, **context: object) -> str:
    return Template("{% load portal %}" + source).render(Context(context))


# --- The switch --------------------------------------------------------------------------------------


def test_the_header_has_a_language_switch_that_works_without_script(buyer_client: Client) -> None:
    html = buyer_client.get("/market/").content.decode()
    form = re.search(
        r'<form class="lang-switch" method="post" action="/i18n/setlang/">(.*?)</form>', html, re.S
    )
    assert form is not None
    assert 'name="csrfmiddlewaretoken"' in form.group(1)
    assert '<input type="hidden" name="next" value="/market/">' in form.group(1)
    options = re.findall(r'<option value="([^"]+)" lang="[^"]+"( selected)?>([^<]+)</option>', form.group(1))
    assert options == [("en", " selected", "English"), ("zh-hans", "", "简体中文")]
    # Submitted by portal.js on change; without script, by this button.
    assert "data-submit-on-change" in form.group(1)
    assert "<noscript><button" in form.group(1)
    assert "onchange" not in form.group(1)


def test_posting_to_set_language_turns_the_next_page_chinese_and_back(buyer_client: Client) -> None:
    response = buyer_client.post(SET_LANGUAGE, {"language": "zh-hans", "next": "/market/"})
    assert response.status_code == 302
    assert response["Location"] == "/market/"
    assert buyer_client.cookies["django_language"].value == "zh-hans"
    page = buyer_client.get("/market/")
    html = page.content.decode()
    assert html_lang(page) == "zh-hans"
    # The navigation comes from core.portal (Python strings, the core catalogue).
    assert ">算力市场</a>" in html and ">卡时包</a>" in html and ">用量与消费</a>" in html
    assert ">Marketplace</a>" not in html
    assert '<option value="zh-hans" lang="zh-hans" selected>简体中文</option>' in html

    buyer_client.post(SET_LANGUAGE, {"language": "en", "next": "/market/"})
    page = buyer_client.get("/market/")
    assert html_lang(page) == "en"
    assert ">Marketplace</a>" in page.content.decode()


def test_set_language_refuses_an_offsite_next_and_an_unknown_language(client: Client) -> None:
    response = client.post(SET_LANGUAGE, {"language": "zh-hans", "next": "https://evil.example/"})
    assert response.status_code == 302
    assert response["Location"] == "/"
    response = client.post(SET_LANGUAGE, {"language": "tlh", "next": reverse("login")})
    assert "django_language" not in response.cookies


# --- The browser's choice ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept_language", "expected"),
    [
        ("zh-CN,zh;q=0.9,en;q=0.8", "zh-hans"),
        ("zh-cn", "zh-hans"),
        ("zh", "zh-hans"),
        ("zh-Hans", "zh-hans"),
        ("zh-Hans-CN", "zh-hans"),
        ("zh-SG", "zh-hans"),
        ("en-US,en;q=0.9", "en"),
        ("fr-FR,fr;q=0.9", "en"),
        ("", "en"),
    ],
)
def test_accept_language_chooses_chinese_for_zh_browsers(
    client: Client, accept_language: str, expected: str
) -> None:
    response = client.get(reverse("login"), HTTP_ACCEPT_LANGUAGE=accept_language)
    assert response.status_code == 200
    assert html_lang(response) == expected
    assert response["Content-Language"] == expected


def test_the_chosen_language_beats_the_browsers(client: Client) -> None:
    client.post(SET_LANGUAGE, {"language": "en", "next": reverse("login")})
    assert html_lang(client.get(reverse("login"), HTTP_ACCEPT_LANGUAGE="zh-CN")) == "en"


def test_api_error_messages_follow_the_language_and_keep_their_code(
    operator: Organisation, token_client: Callable[..., APIClient]
) -> None:
    client = token_client(operator, scope="read_only")
    english = client.post("/api/v1/clusters", {}, format="json")
    chinese = client.post("/api/v1/clusters", {}, format="json", HTTP_ACCEPT_LANGUAGE="zh-CN")
    assert english.status_code == chinese.status_code == 403
    assert english.json()["code"] == chinese.json()["code"] == "read_only_credential"
    assert english.json()["message"] == "This credential is read-only."
    assert chinese.json()["message"] == "此凭据为只读。"


# --- Bands by name -----------------------------------------------------------------------------------


def test_band_choices_are_named_in_both_languages() -> None:
    expected = {
        "en": ["Critical peak", "Peak", "Flat", "Valley", "Deep valley"],
        "zh-hans": ["尖峰", "高峰", "平段", "低谷", "深谷"],
    }
    for language, labels in expected.items():
        with translation.override(language):
            assert [str(label) for label in Band.labels] == labels
            assert render("{{ b|band_label }}", b="critical_peak") == labels[0]
    assert render("{{ b|band_label }}", b="shoulder") == "shoulder"  # an operator's own name, as written


def test_band_legend_names_bands_cheapest_first_in_the_active_language() -> None:
    source = "{% band_legend bands multipliers %}"
    context = {"bands": ["peak", "critical_peak", "valley"], "multipliers": {"valley": "0.38", "peak": "1.7"}}
    with translation.override("zh-hans"):
        html = render(source, **context)
    names = re.findall(r'<span class="swatch" style="background:#[0-9a-f]{6}"></span>([^<]*)</li>', html)
    assert names == ["低谷 ×0.38", "高峰 ×1.7", "尖峰"]
    assert "critical_peak" not in html and "valley" not in html


def test_tariff_pages_show_band_names_not_raw_values(
    operator_client: Client, east_cluster: Cluster, east_operator: Organisation
) -> None:
    english = operator_client.get(reverse("operator-tariff-list")).content.decode()
    assert "Valley ×0.38" in english and "Critical peak ×2.125" in english
    chinese = operator_client.get(
        reverse("operator-tariff-list"), HTTP_ACCEPT_LANGUAGE="zh-CN"
    ).content.decode()
    assert "低谷 ×0.38" in chinese and "尖峰 ×2.125" in chinese
    legends = "".join(re.findall(r'<ul class="legend">.*?</ul>', chinese, re.S))
    assert legends and "critical_peak" not in legends and "deep_valley" not in legends
    # The strip's tooltips too.
    gd = Tariff.objects.get(code="cn-gd", owner=None)
    detail = operator_client.get(
        reverse("operator-tariff-detail", kwargs={"tariff_id": gd.pk}), HTTP_ACCEPT_LANGUAGE="zh-CN"
    ).content.decode()
    titles = re.findall(r"<title>(\d\d:\d\d–\d\d:\d\d [^<]+)</title>", detail)
    assert titles and all(re.search(r" (尖峰|高峰|平段|低谷|深谷)( ×|$)", t) for t in titles), titles
    window_cells = re.findall(
        r'<td><span class="swatch" style="background:#[0-9a-f]{6}"></span>([^<]+)</td>', detail
    )
    assert window_cells and set(window_cells) <= {"尖峰", "高峰", "平段", "低谷", "深谷"}


# --- Times with their zone ---------------------------------------------------------------------------


def test_zoned_prints_the_utc_offset_never_cst() -> None:
    instant = datetime(2026, 11, 25, 17, 50, tzinfo=UTC)
    assert render("{{ t|zoned }}", t=instant) == "2026-11-26 01:50 (UTC+08:00)"
    assert render('{{ t|zoned:"Y-m-d H:i:s" }}', t=instant) == "2026-11-26 01:50:00 (UTC+08:00)"
    with timezone.override("America/Chicago"):
        assert render("{{ t|zoned }}", t=instant) == "2026-11-25 11:50 (UTC-06:00)"
    with timezone.override("Asia/Kolkata"):
        assert render("{{ t|zoned }}", t=instant) == "2026-11-25 23:20 (UTC+05:30)"
    with translation.override("zh-hans"):
        assert render("{{ t|zoned }}", t=instant) == "2026-11-26 01:50 (UTC+08:00)"
    assert render("{{ t|zoned }}", t=None) == "—"
    assert render("{% zone_label %}") == "Asia/Shanghai (UTC+08:00)"
    assert render("{{ t|zone_name }}", t=instant) == "Asia/Shanghai (UTC+08:00)"
    with timezone.override("America/Chicago"):
        assert (
            render("{{ t|zone_name }}", t=datetime(2026, 7, 1, tzinfo=UTC)) == "America/Chicago (UTC-05:00)"
        )


def test_the_market_states_its_zone_without_cst(buyer_client: Client, east_cluster: Cluster) -> None:
    html = buyer_client.get("/market/").content.decode()
    assert re.search(r"Capacity at \d\d:\d\d \(Asia/Shanghai \(UTC\+08:00\)\)", html)
    assert "CST" not in html


def test_a_page_states_its_times_with_an_offset(operator_client: Client, east_cluster: Cluster) -> None:
    html = operator_client.get(
        reverse("operator-price-cards", kwargs={"cpi": east_cluster.cpi}), HTTP_ACCEPT_LANGUAGE="zh-CN"
    ).content.decode()
    assert "CST" not in html
    assert re.search(r"<dd>\d{4}-\d\d-\d\d \d\d:\d\d \(UTC\+08:00\) \(v1\)</dd>", html)
    assert "Asia/Shanghai (UTC+08:00)." in html


# --- Numbers -----------------------------------------------------------------------------------------


def test_count_groups_thousands_in_both_languages() -> None:
    for language in ("en", "zh-hans"):
        with translation.override(language):
            assert render("{{ n|count }}", n=12800) == "12,800"
            assert render("{{ n|count }}", n=1234567) == "1,234,567"
            assert render("{{ n|count }}", n=999) == "999"
            assert render("{{ n|count }}", n=0) == "0"
            assert render("{{ n|count }}", n=None) == "—"


def test_market_card_counts_have_thousands_separators(
    buyer_client: Client, east_cluster: Cluster, west_cluster: Cluster, west_operator: Organisation
) -> None:
    make_cluster(operator=west_operator, hub="nx", name="zw-ai02", islands=[("isl-01", 640), ("isl-02", 640)])
    for accept in ("en", "zh-CN"):
        html = buyer_client.get("/market/", HTTP_ACCEPT_LANGUAGE=accept).content.decode()
        # Ningxia: 64 + 1,280 cards, all free.
        assert '<td class="num">1,344</td>\n          <td class="num">1,344</td>' in html, accept
        assert ">1344<" not in html


def test_csv_stays_machine_readable_in_chinese(used: Pack, buyer_client: Client) -> None:  # noqa: F811
    response = buyer_client.get(reverse("usage-csv"), HTTP_ACCEPT_LANGUAGE="zh-CN")
    assert response["Content-Language"] == "zh-hans"
    rows = rows_of(response)
    assert rows[0][:3] == ["date", "band", "pack_class"]
    assert [
        day(2),
        "flat",
        A800,
        "28800",
        "8.000000",
        "8.000000",
        "0.000000",
        "80.000000",
        "72.000000",
    ] in rows
    assert not any("," in cell or "平段" in cell for row in rows for cell in row)


def test_the_signed_in_user_sees_chinese_from_their_browser(
    login: Callable[[User], Client], buyer_user: User
) -> None:
    client = login(buyer_user)
    html = client.get("/market/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9").content.decode()
    assert ">算力市场</a>" in html
