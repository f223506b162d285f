"""The schedule engine's validation and the presets: every minute of every day in exactly one band."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from metering import models
from metering.errors import TariffInvalidError
from metering.models import Band, Tariff, TariffVersion
from metering.services.tariffs import tariff_presets_install
from metering.tariffs import (
    ALL_MONTHS,
    ALL_WEEKDAYS,
    BANDS,
    MINUTES_PER_DAY,
    PRESETS,
    TariffSpec,
    WindowSpec,
    months_label,
    months_mask,
    tariff_compile,
    tariff_spec_validate,
    weekdays_label,
    weekdays_mask,
)

SHANGHAI = ZoneInfo("Asia/Shanghai")


def spec(*windows: WindowSpec, zone: str = "Asia/Shanghai", **multipliers: str) -> TariffSpec:
    return TariffSpec(
        time_zone=zone,
        multipliers={band: Decimal(value) for band, value in multipliers.items()},
        windows=tuple(windows),
    )


def w(band: str, start: str, end: str, **masks: int) -> WindowSpec:
    def minutes(text: str) -> int:
        hours, mins = text.split(":")
        return int(hours) * 60 + int(mins)

    return WindowSpec(band=band, start_minute=minutes(start), end_minute=minutes(end), **masks)


def invalid(schedule: TariffSpec) -> TariffInvalidError:
    with pytest.raises(TariffInvalidError) as caught:
        tariff_spec_validate(schedule)
    assert caught.value.code == "tariff_invalid"
    return caught.value


def band_at_local(code: str, *parts: int) -> str:
    compiled = tariff_compile(PRESETS[code].spec)
    instant = int(datetime(*parts, tzinfo=SHANGHAI).timestamp())  # type: ignore[misc]
    return compiled.bands[compiled.band_at(instant)]


def test_constants_match_the_models():
    assert (ALL_WEEKDAYS, ALL_MONTHS, MINUTES_PER_DAY) == (
        models.ALL_WEEKDAYS,
        models.ALL_MONTHS,
        models.MINUTES_PER_DAY,
    )
    assert tuple(Band.values) == BANDS


@pytest.mark.parametrize("code", sorted(PRESETS))
def test_every_preset_is_valid_and_names_its_source(code):
    preset = PRESETS[code]
    tariff_spec_validate(preset.spec)
    assert preset.code == code
    assert preset.spec.time_zone == "Asia/Shanghai"
    assert len(preset.source) > 40


@pytest.mark.parametrize(
    ("parts", "band"),
    [
        ((2026, 7, 15, 11, 30), "critical_peak"),
        ((2026, 8, 3, 16, 59), "critical_peak"),
        ((2026, 9, 30, 15, 0), "critical_peak"),
        ((2026, 7, 15, 10, 59), "peak"),
        ((2026, 7, 15, 17, 0), "peak"),
        ((2026, 1, 15, 11, 30), "peak"),
        ((2026, 10, 1, 15, 30), "peak"),
        ((2026, 6, 30, 16, 0), "peak"),
        ((2026, 1, 15, 3, 0), "valley"),
        ((2026, 7, 15, 7, 59), "valley"),
        ((2026, 1, 15, 8, 0), "flat"),
        ((2026, 1, 15, 13, 0), "flat"),
        ((2026, 7, 15, 13, 0), "flat"),
        ((2026, 1, 15, 19, 0), "flat"),
        ((2026, 1, 15, 23, 59), "flat"),
    ],
)
def test_guangdong_bands(parts, band):
    assert band_at_local("cn-gd", *parts) == band


def test_guangdong_multipliers_are_the_published_ratios():
    compiled = tariff_compile(PRESETS["cn-gd"].spec)
    assert dict(zip(compiled.bands, compiled.multipliers_e4, strict=True)) == {
        "critical_peak": 21250,  # peak 1.7 × 1.25
        "peak": 17000,
        "flat": 10000,
        "valley": 3800,
    }


def test_guangdong_strip_in_july_and_january():
    compiled = tariff_compile(PRESETS["cn-gd"].spec)
    assert compiled.day_strip(date(2026, 7, 15)) == [
        (0, 480, "valley"),
        (480, 600, "flat"),
        (600, 660, "peak"),
        (660, 720, "critical_peak"),
        (720, 840, "flat"),
        (840, 900, "peak"),
        (900, 1020, "critical_peak"),
        (1020, 1140, "peak"),
        (1140, 1440, "flat"),
    ]
    assert compiled.day_strip(date(2026, 1, 15)) == [
        (0, 480, "valley"),
        (480, 600, "flat"),
        (600, 720, "peak"),
        (720, 840, "flat"),
        (840, 1140, "peak"),
        (1140, 1440, "flat"),
    ]


@pytest.mark.parametrize(
    ("parts", "band"),
    [
        # 宁发改价格(管理)〔2023〕7号: peak 7–9 and 17–23, valley 9–17, flat 23–7 (wrapping midnight).
        ((2026, 3, 2, 22, 59), "peak"),
        ((2026, 3, 2, 23, 0), "flat"),
        ((2026, 3, 2, 23, 59), "flat"),
        ((2026, 3, 3, 0, 0), "flat"),
        ((2026, 3, 3, 6, 59), "flat"),
        ((2026, 3, 3, 7, 0), "peak"),
        ((2026, 3, 3, 8, 59), "peak"),
        ((2026, 3, 3, 9, 0), "valley"),
        ((2026, 3, 3, 16, 59), "valley"),
        ((2026, 3, 3, 17, 0), "peak"),
    ],
)
def test_ningxia_bands_follow_the_2023_notice_with_flat_wrapping_midnight(parts, band):
    assert band_at_local("cn-nx", *parts) == band


def test_ningxia_multipliers_and_flat_preset():
    nx = tariff_compile(PRESETS["cn-nx"].spec)
    assert dict(zip(nx.bands, nx.multipliers_e4, strict=True)) == {
        "peak": 15000,
        "flat": 10000,
        "valley": 5000,
    }
    flat = tariff_compile(PRESETS["flat"].spec)
    assert flat.bands == ("flat",)
    assert flat.multipliers_e4 == (10000,)
    assert flat.day_strip(date(2026, 12, 31)) == [(0, 1440, "flat")]


def test_a_gap_is_named_in_the_message_and_extra():
    error = invalid(spec(w("flat", "00:00", "12:00"), w("peak", "14:00", "24:00"), flat="1", peak="1.5"))
    assert error.extra == {
        "gaps": [{"months": "Jan–Dec", "weekdays": "Mon–Sun", "from": "12:00", "to": "14:00"}]
    }
    assert error.message == (
        "Every minute must belong to exactly one band: 12:00–14:00 on Mon–Sun in Jan–Dec has no band."
    )


def test_a_gap_is_named_in_the_readers_language():
    from django.utils import translation

    with translation.override("zh-hans"):
        error = invalid(spec(w("flat", "00:00", "12:00"), w("peak", "14:00", "24:00"), flat="1", peak="1.5"))
        unused = invalid(spec(w("flat", "00:00", "24:00"), flat="1", peak="1.5"))
    assert error.message == "每一分钟必须恰好属于一个时段：Jan–Dec Mon–Sun 的 12:00–14:00 不属于任何时段。"
    assert unused.message == "没有时间窗口使用 peak；请删除其系数或为其设置时间窗口。"
    assert error.extra["gaps"] == [
        {"months": "Jan–Dec", "weekdays": "Mon–Sun", "from": "12:00", "to": "14:00"}
    ]


def test_an_overlap_names_its_bands_and_where():
    error = invalid(
        spec(
            w("flat", "00:00", "24:00"),
            w("peak", "10:00", "12:00", months=months_mask([7, 8]), weekdays=weekdays_mask(range(5))),
            flat="1",
            peak="1.5",
        )
    )
    assert error.extra == {
        "overlaps": [
            {
                "months": "Jul, Aug",
                "weekdays": "Mon–Fri",
                "from": "10:00",
                "to": "12:00",
                "bands": ["peak", "flat"],
            }
        ]
    }
    assert "10:00–12:00 on Mon–Fri in Jul, Aug is in both peak and flat" in error.message


def test_gaps_left_by_masks_are_named_per_season():
    # Summer weekdays have no afternoon band: the masks leave a gap only there.
    error = invalid(
        spec(
            w("flat", "00:00", "12:00"),
            w("peak", "12:00", "24:00", months=ALL_MONTHS & ~months_mask([6, 7, 8])),
            w("peak", "12:00", "24:00", months=months_mask([6, 7, 8]), weekdays=weekdays_mask([5, 6])),
            flat="1",
            peak="1.5",
        )
    )
    assert error.extra["gaps"] == [
        {"months": "Jun–Aug", "weekdays": "Mon–Fri", "from": "12:00", "to": "24:00"}
    ]


def test_a_wrapping_window_covers_both_ends_of_each_selected_day():
    # Valley 22:00–06:00 on weekdays only: a weekend day has no band at either end of the day.
    error = invalid(
        spec(
            w("valley", "22:00", "06:00", weekdays=weekdays_mask(range(5))),
            w("flat", "06:00", "22:00"),
            flat="1",
            valley="0.5",
        )
    )
    assert error.extra["gaps"] == [
        {"months": "Jan–Dec", "weekdays": "Sat, Sun", "from": "00:00", "to": "06:00"},
        {"months": "Jan–Dec", "weekdays": "Sat, Sun", "from": "22:00", "to": "24:00"},
    ]


@pytest.mark.parametrize(
    ("schedule", "key", "value"),
    [
        (spec(w("flat", "00:00", "24:00"), zone="Mars/Olympus", flat="1"), "time_zone", "Mars/Olympus"),
        (spec(w("flat", "00:00", "24:00"), zone="", flat="1"), "time_zone", ""),
        (
            spec(w("flat", "00:00", "24:00"), flat="0"),
            "multipliers",
            {"flat": "multiplier must be greater than 0"},
        ),
        (
            spec(w("flat", "00:00", "24:00"), flat="-1"),
            "multipliers",
            {"flat": "multiplier must be greater than 0"},
        ),
        (
            spec(w("flat", "00:00", "24:00"), flat="1.00001"),
            "multipliers",
            {"flat": "multiplier has more than 4 decimal places"},
        ),
        (spec(w("flat", "00:00", "24:00"), flat="1", turbo="2"), "unknown_bands", ["turbo"]),
        (spec(w("turbo", "00:00", "24:00"), turbo="2"), "unknown_bands", ["turbo"]),
        (spec(w("flat", "00:00", "24:00"), w("peak", "10:00", "10:00")), "windows", None),
        (spec(w("flat", "00:00", "24:00"), flat="1", peak="1.5"), "unused_bands", ["peak"]),
        (spec(flat="1"), "windows", None),
    ],
)
def test_malformed_schedules_are_rejected_with_the_fault_named(schedule, key, value):
    error = invalid(schedule)
    assert key in error.extra
    if value is not None:
        assert error.extra[key] == value


def test_a_window_band_without_a_multiplier_is_named():
    error = invalid(spec(w("flat", "00:00", "12:00"), w("peak", "12:00", "24:00"), flat="1"))
    assert error.extra == {"missing_multipliers": ["peak"]}


@pytest.mark.parametrize(
    ("window", "fault"),
    [
        (WindowSpec("flat", 600, 600), "start and end are equal; for the whole day use 00:00–24:00"),
        (WindowSpec("flat", 1440, 60), "start_minute must be 0–1439 (00:00–23:59)"),
        (WindowSpec("flat", -1, 60), "start_minute must be 0–1439 (00:00–23:59)"),
        (WindowSpec("flat", 0, 0), "end_minute must be 1–1440 (00:01–24:00); midnight as an end is 24:00"),
        (WindowSpec("flat", 0, 1441), "end_minute must be 1–1440 (00:01–24:00); midnight as an end is 24:00"),
        (
            WindowSpec("flat", 0, 1440, weekdays=0),
            "weekdays must select at least one day (mask 1–127, bit 0 = Monday)",
        ),
        (
            WindowSpec("flat", 0, 1440, months=0),
            "months must select at least one month (mask 1–4095, bit 0 = January)",
        ),
        (
            WindowSpec("flat", 0, 1440, months=4096),
            "months must select at least one month (mask 1–4095, bit 0 = January)",
        ),
    ],
)
def test_window_faults_are_named_by_index(window, fault):
    error = invalid(spec(window, flat="1"))
    assert error.extra["windows"] == [{"index": 0, "errors": [fault]}]
    assert "Window 1 (flat)" in error.message


def test_float_multipliers_are_refused():
    schedule = TariffSpec(
        time_zone="Asia/Shanghai",
        multipliers={"flat": 1.0},  # type: ignore[dict-item]
        windows=(WindowSpec("flat", 0, 1440),),
    )
    assert invalid(schedule).extra["multipliers"] == {
        "flat": "multiplier must be a Decimal (or an integer), not a float"
    }


def test_many_faults_in_one_error():
    error = invalid(
        spec(
            w("flat", "00:00", "10:00"),
            w("peak", "09:00", "20:00"),
            zone="Nowhere/City",
            flat="1",
            peak="1.5",
        )
    )
    assert set(error.extra) == {"time_zone", "gaps", "overlaps"}
    assert error.extra["gaps"][0]["from"] == "20:00"
    assert error.extra["overlaps"][0]["from"] == "09:00"


def test_validation_is_fast_with_many_masked_windows():
    # 84 profiles, one window per (month, weekday) per quarter day: 336 windows is over the cap, so use 168.
    windows = []
    for month in range(1, 13):
        for weekday in range(7):
            masks = {"months": months_mask([month]), "weekdays": weekdays_mask([weekday])}
            windows.append(WindowSpec("valley", 0, 720, **masks))
            windows.append(WindowSpec("peak", 720, 1440, **masks))
    schedule = TariffSpec("Asia/Shanghai", {"valley": Decimal("0.5"), "peak": Decimal("1.5")}, tuple(windows))
    import time

    started = time.perf_counter()
    tariff_spec_validate(schedule)
    assert time.perf_counter() - started < 0.5


def test_labels():
    assert weekdays_label(ALL_WEEKDAYS) == "Mon–Sun"
    assert weekdays_label(weekdays_mask([0, 2, 3, 4, 6])) == "Mon, Wed–Fri, Sun"
    assert months_label(months_mask([1, 2, 12])) == "Jan, Feb, Dec"


# --- Presets in the database -------------------------------------------------------------------------


@pytest.mark.django_db
def test_presets_are_installed_by_the_migration_and_install_is_idempotent():
    codes = set(Tariff.objects.filter(owner__isnull=True).values_list("code", flat=True))
    assert codes == set(PRESETS)
    before = list(TariffVersion.objects.order_by("pk").values_list("pk", "tariff__code", "version"))

    tariff_presets_install()
    tariff_presets_install()

    assert list(TariffVersion.objects.order_by("pk").values_list("pk", "tariff__code", "version")) == before
    gd = Tariff.objects.get(owner__isnull=True, code="cn-gd")
    assert "粤发改价格〔2021〕331号" in gd.source
    version = gd.versions.get()
    assert sorted(version.bands.values_list("band", "multiplier")) == [
        ("critical_peak", Decimal("2.1250")),
        ("flat", Decimal("1.0000")),
        ("peak", Decimal("1.7000")),
        ("valley", Decimal("0.3800")),
    ]
    assert version.windows.count() == len(PRESETS["cn-gd"].spec.windows)
