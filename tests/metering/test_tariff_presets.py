"""Tariff presets with their sources: every day covered, statuses honest, and the refresh that brings
existing databases the corrected editions without touching a version a price card uses."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from django.apps import apps as django_apps
from django.utils import timezone

from core.types import Actor
from metering.models import PriceCard, Tariff, TariffVersion
from metering.services.tariffs import _spec_of, _write_version, price_card_set, tariff_presets_load
from metering.tariffs import (
    PRESET_OFFICIAL,
    PRESET_STATUSES,
    PRESET_UNCONFIRMED,
    PRESETS,
    PROVINCES_WITHOUT_PRESET,
    TariffSpec,
    WindowSpec,
    preset_default_code,
    tariff_compile,
)
from tests.factories import OperatorFactory, make_cluster

SHANGHAI = ZoneInfo("Asia/Shanghai")

# The cn-nx schedule an existing database has from before (peak 8–12 and 18:30–22:30 at 1.5, valley
# 22:30–06:30 at 0.5): what 0003 wrote, and what a price card may have locked.
OLD_NX = TariffSpec(
    time_zone="Asia/Shanghai",
    multipliers={"peak": Decimal("1.5"), "flat": Decimal("1"), "valley": Decimal("0.5")},
    windows=(
        WindowSpec("valley", 1350, 390),
        WindowSpec("flat", 390, 480),
        WindowSpec("peak", 480, 720),
        WindowSpec("flat", 720, 1110),
        WindowSpec("peak", 1110, 1350),
    ),
)


@pytest.mark.parametrize("code", sorted(PRESETS))
def test_every_edition_covers_every_minute_of_every_day_of_a_year(code):
    for edition in PRESETS[code].versions:
        compiled = tariff_compile(edition.spec)
        day = date(2026, 1, 1)
        while day.year == 2026:
            strip = compiled.day_strip(day)
            assert strip[0][0] == 0 and strip[-1][1] == 1440, (code, day)
            assert all(a[1] == b[0] for a, b in pairwise(strip)), (code, day)
            day += timedelta(days=1)


@pytest.mark.parametrize("code", sorted(PRESETS))
def test_every_preset_names_its_document_class_and_status(code):
    preset = PRESETS[code]
    assert preset.status in PRESET_STATUSES
    assert len(preset.source) <= 500
    assert preset.customer_class
    editions = preset.versions
    assert [e.effective_from for e in editions] == sorted(e.effective_from for e in editions)
    if preset.status != "platform":
        assert all(e.document and e.document in preset.source for e in editions)
    if preset.status != PRESET_OFFICIAL:
        assert not preset.selectable_by_default


def test_ningxia_follows_its_notice_for_the_class_it_states_and_is_unconfirmed():
    nx = PRESETS["cn-nx"]
    assert (nx.status, nx.unconfirmed, nx.selectable_by_default) == (
        PRESET_UNCONFIRMED,
        ("ratios", "effective date"),
        False,
    )
    assert nx.customer_class.startswith("agricultural production users")
    assert [e.document for e in nx.versions] == ["宁发改价格(管理)〔2023〕7号"]
    assert tariff_compile(nx.spec).day_strip(date(2026, 6, 1)) == [
        (0, 420, "flat"),
        (420, 540, "peak"),
        (540, 1020, "valley"),
        (1020, 1380, "peak"),
        (1380, 1440, "flat"),
    ]
    assert "ESTIMATE" in nx.source


def test_guangdong_is_in_force_from_its_notices_effective_date():
    gd = PRESETS["cn-gd"]
    assert (gd.status, gd.selectable_by_default) == (PRESET_OFFICIAL, True)
    assert [(e.document, e.effective_from) for e in gd.versions] == [
        ("粤发改价格〔2021〕331号", datetime(2021, 10, 1, tzinfo=SHANGHAI))
    ]


def test_the_default_is_an_official_preset_or_flat():
    assert [preset_default_code(hub=hub) for hub in ("gba", "nx", "yrd", "jjj", "ext")] == [
        "cn-gd",
        "flat",
        "flat",
        "flat",
        "flat",
    ]
    covered = {hub for preset in PRESETS.values() for hub in preset.hubs}
    assert covered == {"gba", "nx"}
    assert (
        "Beijing" in PROVINCES_WITHOUT_PRESET
        and "京发改规〔2023〕11号" in PROVINCES_WITHOUT_PRESET["Beijing"]
    )


# --- The refresh (migration 0008) ---------------------------------------------------------------------


def versions(code: str) -> list[tuple[int, datetime, str]]:
    return [
        (v.version, v.effective_from, v.created_by)
        for v in TariffVersion.objects.filter(tariff__code=code, tariff__owner__isnull=True).order_by(
            "version"
        )
    ]


def set_up_old_database(*, nx_in_use: bool) -> tuple[Tariff, TariffVersion, PriceCard | None]:
    """The presets as 0003 left them before this change: cn-nx and cn-gd at 2020-01-01, old cn-nx."""
    old_start = datetime(2020, 1, 1, tzinfo=UTC)
    for code, spec in (("cn-nx", OLD_NX), ("cn-gd", PRESETS["cn-gd"].spec)):
        tariff = Tariff.objects.get(code=code, owner__isnull=True)
        PriceCard.objects.filter(tariff_version__tariff=tariff).delete()
        TariffVersion.objects.filter(tariff=tariff).delete()
        _write_version(
            apps=django_apps,
            tariff=tariff,
            version=1,
            spec=spec,
            effective_from=old_start,
            created_by="platform presets",
        )
    nx = Tariff.objects.get(code="cn-nx", owner__isnull=True)
    old = TariffVersion.objects.get(tariff=nx)
    card = None
    if nx_in_use:
        operator = OperatorFactory(slug="nxdc")
        card = price_card_set(
            cluster=make_cluster(operator=operator, hub="nx"),
            rate_per_card_hour=Decimal("9"),
            tariff=nx,
            actor=Actor(organisation=operator, system_label="test"),
        )
        assert card.tariff_version_id == old.pk
    return nx, old, card


@pytest.mark.django_db
def test_a_version_in_use_is_kept_unchanged_and_the_notice_follows_it():
    nx, old, card = set_up_old_database(nx_in_use=True)
    now = datetime(2026, 11, 25, 12, tzinfo=UTC)

    tariff_presets_load(django_apps, now=now)
    tariff_presets_load(django_apps, now=now + timedelta(hours=1))  # idempotent

    old.refresh_from_db()
    assert (old.version, old.effective_from) == (1, datetime(2020, 1, 1, tzinfo=UTC))
    assert {(w.band, w.start_minute, w.end_minute) for w in old.windows.all()} == {
        (w.band, w.start_minute, w.end_minute) for w in OLD_NX.windows
    }
    assert {(b.band, b.multiplier) for b in old.bands.all()} == {
        ("peak", Decimal("1.5000")),
        ("flat", Decimal("1.0000")),
        ("valley", Decimal("0.5000")),
    }
    assert card is not None
    card.refresh_from_db()
    assert card.tariff_version_id == old.pk
    assert versions("cn-nx") == [
        (1, datetime(2020, 1, 1, tzinfo=UTC), "platform presets"),
        (2, datetime(2024, 1, 1, tzinfo=SHANGHAI), "platform presets: 宁发改价格(管理)〔2023〕7号"),
    ]
    new = TariffVersion.objects.get(tariff=nx, version=2)
    assert sorted((w.band, w.start_minute, w.end_minute) for w in new.windows.all()) == [
        ("flat", 1380, 420),
        ("peak", 420, 540),
        ("peak", 1020, 1380),
        ("valley", 540, 1020),
    ]
    # A price set now locks the notice's edition.
    operator = card.cluster.operator
    again = price_card_set(
        cluster=card.cluster,
        rate_per_card_hour=Decimal("9"),
        tariff=nx,
        actor=Actor(organisation=operator, system_label="test"),
    )
    assert again.tariff_version_id == new.pk
    nx.refresh_from_db()
    assert nx.source == PRESETS["cn-nx"].source and nx.name == PRESETS["cn-nx"].name


@pytest.mark.django_db
def test_a_version_nobody_used_is_replaced_by_the_notices_editions():
    set_up_old_database(nx_in_use=False)

    tariff_presets_load(django_apps, now=timezone.now())

    assert versions("cn-nx") == [
        (1, datetime(2024, 1, 1, tzinfo=SHANGHAI), "platform presets: 宁发改价格(管理)〔2023〕7号")
    ]
    assert versions("cn-gd") == [
        (1, datetime(2021, 10, 1, tzinfo=SHANGHAI), "platform presets: 粤发改价格〔2021〕331号")
    ]


@pytest.mark.django_db
def test_a_fresh_database_has_exactly_the_editions_in_code():
    for code, preset in PRESETS.items():
        rows = list(
            TariffVersion.objects.filter(tariff__code=code, tariff__owner__isnull=True).order_by("version")
        )
        assert [row.effective_from for row in rows] == [e.effective_from for e in preset.versions]
        for row, edition in zip(rows, preset.versions, strict=True):
            spec = _spec_of(apps=django_apps, version=row)
            assert sorted(spec.windows, key=lambda w: (w.start_minute, w.months)) == sorted(
                edition.spec.windows, key=lambda w: (w.start_minute, w.months)
            )
