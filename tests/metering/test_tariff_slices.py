"""CompiledTariff.slices: band pieces of [start, end) in UTC epoch seconds, cut at band edges and local
midnights, by wall-clock time in the tariff's zone (daylight-saving safe, half-open)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from decimal import Decimal
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metering.tariffs import (
    PRESETS,
    CompiledTariff,
    TariffSpec,
    WindowSpec,
    months_mask,
    tariff_compile,
    tariff_spec_validate,
    weekdays_mask,
)

SHANGHAI = ZoneInfo("Asia/Shanghai")
GD = tariff_compile(PRESETS["cn-gd"].spec)
NX = tariff_compile(PRESETS["cn-nx"].spec)
FLAT = tariff_compile(PRESETS["flat"].spec)


def utc(*parts: int) -> int:
    return int(datetime(*parts, tzinfo=UTC).timestamp())  # type: ignore[misc]


def at(zone: ZoneInfo, *parts: int) -> int:
    return int(datetime(*parts, tzinfo=zone).timestamp())  # type: ignore[misc]


def named(compiled: CompiledTariff, pieces: list[tuple[int, int, int]]) -> list[tuple[int, int, str]]:
    return [(start, end, compiled.bands[band]) for start, end, band in pieces]


def schedule(zone: str, *windows: tuple[str, int, int], **multipliers: str) -> CompiledTariff:
    spec = TariffSpec(
        time_zone=zone,
        multipliers={band: Decimal(value) for band, value in multipliers.items()},
        windows=tuple(WindowSpec(band, start, end) for band, start, end in windows),
    )
    tariff_spec_validate(spec)
    return tariff_compile(spec)


def test_inside_one_band():
    start = at(SHANGHAI, 2026, 1, 15, 2, 0)
    assert named(GD, GD.slices(start, start + 1800)) == [(start, start + 1800, "valley")]


def test_split_at_every_band_edge_of_a_summer_day():
    start, end = at(SHANGHAI, 2026, 7, 15, 9, 30), at(SHANGHAI, 2026, 7, 15, 17, 30)
    assert named(GD, GD.slices(start, end)) == [
        (start, at(SHANGHAI, 2026, 7, 15, 10), "flat"),
        (at(SHANGHAI, 2026, 7, 15, 10), at(SHANGHAI, 2026, 7, 15, 11), "peak"),
        (at(SHANGHAI, 2026, 7, 15, 11), at(SHANGHAI, 2026, 7, 15, 12), "critical_peak"),
        (at(SHANGHAI, 2026, 7, 15, 12), at(SHANGHAI, 2026, 7, 15, 14), "flat"),
        (at(SHANGHAI, 2026, 7, 15, 14), at(SHANGHAI, 2026, 7, 15, 15), "peak"),
        (at(SHANGHAI, 2026, 7, 15, 15), at(SHANGHAI, 2026, 7, 15, 17), "critical_peak"),
        (at(SHANGHAI, 2026, 7, 15, 17), end, "peak"),
    ]


def test_half_open_edges():
    edge = at(SHANGHAI, 2026, 1, 15, 8, 0)  # valley ends, flat begins
    assert named(GD, GD.slices(edge - 60, edge)) == [(edge - 60, edge, "valley")]
    assert named(GD, GD.slices(edge, edge + 60)) == [(edge, edge + 60, "flat")]
    assert GD.bands[GD.band_at(edge - 1)] == "valley"
    assert GD.bands[GD.band_at(edge)] == "flat"
    assert GD.slices(edge, edge) == []
    with pytest.raises(ValueError):
        GD.slices(edge, edge - 1)


def test_split_at_local_midnight_even_within_one_band():
    midnight = at(SHANGHAI, 2026, 3, 3, 0, 0)
    assert named(FLAT, FLAT.slices(midnight - 3600, midnight + 3600)) == [
        (midnight - 3600, midnight, "flat"),
        (midnight, midnight + 3600, "flat"),
    ]
    # Ningxia's flat band (23:00–07:00) wraps midnight: still two slices, one per local day.
    assert named(NX, NX.slices(midnight - 3600, midnight + 3600)) == [
        (midnight - 3600, midnight, "flat"),
        (midnight, midnight + 3600, "flat"),
    ]


def test_across_a_month_boundary_the_season_changes():
    # 30 September is critical peak 15:00–17:00; 1 October is back to peak.
    start, end = at(SHANGHAI, 2026, 9, 30, 16, 0), at(SHANGHAI, 2026, 10, 1, 16, 0)
    pieces = named(GD, GD.slices(start, end))
    assert pieces[0] == (start, at(SHANGHAI, 2026, 9, 30, 17), "critical_peak")
    assert pieces[-1] == (at(SHANGHAI, 2026, 10, 1, 14), end, "peak")
    assert (at(SHANGHAI, 2026, 10, 1, 0), at(SHANGHAI, 2026, 10, 1, 8), "valley") in pieces
    assert sum(e - s for s, e, _ in pieces) == end - start


def test_many_days_cover_exactly():
    start, end = at(SHANGHAI, 2026, 1, 1, 0, 0), at(SHANGHAI, 2027, 1, 1, 0, 0)
    pieces = GD.slices(start, end)
    assert pieces[0][0] == start and pieces[-1][1] == end
    assert all(a[1] == b[0] for a, b in pairwise(pieces))
    hours: dict[str, int] = {}
    for s, e, band in pieces:
        hours[GD.bands[band]] = hours.get(GD.bands[band], 0) + (e - s)
    # 92 summer days (Jul–Sep) with 3 critical-peak hours; peak 7 h a day otherwise, 4 h in summer.
    assert hours["critical_peak"] == 92 * 3 * 3600
    assert hours["peak"] == (273 * 7 + 92 * 4) * 3600
    assert hours["valley"] == 365 * 8 * 3600


# --- Daylight saving ---------------------------------------------------------------------------------

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def test_new_york_spring_forward_skips_the_missing_wall_times():
    # 2026-03-08: 02:00 EST becomes 03:00 EDT at 07:00Z. Valley to 02:30, flat to 03:30, then peak.
    tariff = schedule(
        "America/New_York",
        ("valley", 0, 150),
        ("flat", 150, 210),
        ("peak", 210, 1440),
        valley="0.5",
        flat="1",
        peak="2",
    )
    start, end = tariff.day_bounds(date(2026, 3, 8))
    assert (start, end) == (utc(2026, 3, 8, 5), utc(2026, 3, 9, 4))
    pieces = named(tariff, tariff.slices(start, end))
    assert pieces == [
        (utc(2026, 3, 8, 5), utc(2026, 3, 8, 7), "valley"),  # 00:00–02:00 EST
        (utc(2026, 3, 8, 7), utc(2026, 3, 8, 7, 30), "flat"),  # 03:00–03:30 EDT
        (utc(2026, 3, 8, 7, 30), utc(2026, 3, 9, 4), "peak"),
    ]
    assert sum(e - s for s, e, _ in pieces) == end - start == 23 * 3600


def test_new_york_fall_back_follows_the_wall_clock_twice():
    # 2026-11-01: 02:00 EDT becomes 01:00 EST at 06:00Z; 01:00–02:00 happens twice.
    tariff = schedule(
        "America/New_York",
        ("valley", 0, 90),
        ("flat", 90, 180),
        ("peak", 180, 1440),
        valley="0.5",
        flat="1",
        peak="2",
    )
    start, end = tariff.day_bounds(date(2026, 11, 1))
    assert (start, end) == (utc(2026, 11, 1, 4), utc(2026, 11, 2, 5))
    assert named(tariff, tariff.slices(start, end)) == [
        (utc(2026, 11, 1, 4), utc(2026, 11, 1, 5, 30), "valley"),  # 00:00–01:30 EDT
        (utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6), "flat"),  # 01:30–02:00 EDT
        (utc(2026, 11, 1, 6), utc(2026, 11, 1, 6, 30), "valley"),  # 01:00–01:30 EST, again
        (utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 8), "flat"),  # 01:30–03:00 EST
        (utc(2026, 11, 1, 8), utc(2026, 11, 2, 5), "peak"),
    ]
    assert end - start == 25 * 3600


@pytest.mark.parametrize(
    ("day", "bounds", "valley_seconds"),
    [
        (date(2026, 3, 29), (utc(2026, 3, 28, 23), utc(2026, 3, 29, 22)), 5 * 3600),  # 02:00 → 03:00
        (date(2026, 10, 25), (utc(2026, 10, 24, 22), utc(2026, 10, 25, 23)), 7 * 3600),  # 03:00 → 02:00
    ],
)
def test_berlin_daylight_saving_days(day, bounds, valley_seconds):
    tariff = schedule("Europe/Berlin", ("valley", 0, 360), ("flat", 360, 1440), valley="0.5", flat="1")
    assert tariff.day_bounds(day) == bounds
    start, end = bounds
    pieces = named(tariff, tariff.slices(start - 600, end + 600))
    assert sum(e - s for s, e, _ in pieces) == end - start + 1200
    inside = [(s, e, band) for s, e, band in pieces if start <= s and e <= end]
    assert inside[0] == (start, start + valley_seconds, "valley")
    assert inside[1] == (start + valley_seconds, end, "flat")
    assert pieces[0] == (start - 600, start, "flat") and pieces[-1] == (end, end + 600, "valley")


def test_a_day_whose_midnight_does_not_exist_starts_at_the_transition():
    # São Paulo sprang forward at midnight on 2018-11-04: 00:00 -03 became 01:00 -02 at 03:00Z.
    tariff = schedule("America/Sao_Paulo", ("flat", 0, 1440), flat="1")
    assert tariff.day_bounds(date(2018, 11, 4)) == (utc(2018, 11, 4, 3), utc(2018, 11, 5, 2))
    assert tariff.day_bounds(date(2018, 11, 3))[1] == utc(2018, 11, 4, 3)
    assert [(s, e) for s, e, _ in tariff.slices(utc(2018, 11, 4, 2), utc(2018, 11, 4, 4))] == [
        (utc(2018, 11, 4, 2), utc(2018, 11, 4, 3)),
        (utc(2018, 11, 4, 3), utc(2018, 11, 4, 4)),
    ]


# --- Properties --------------------------------------------------------------------------------------

ZONES = [
    "Asia/Shanghai",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",  # a half-hour daylight-saving shift
    "Asia/Kathmandu",  # a +05:45 offset
    "America/Sao_Paulo",  # sprang forward at midnight until 2019
]
MASKED = TariffSpec(
    time_zone="Asia/Shanghai",
    multipliers={"deep_valley": Decimal("0.2"), "valley": Decimal("0.5"), "peak": Decimal("1.5")},
    windows=(
        WindowSpec("valley", 23 * 60 + 15, 6 * 60 + 45, weekdays=weekdays_mask(range(5))),
        WindowSpec("deep_valley", 23 * 60 + 15, 6 * 60 + 45, weekdays=weekdays_mask([5, 6])),
        WindowSpec("peak", 6 * 60 + 45, 23 * 60 + 15, months=months_mask(range(1, 7))),
        WindowSpec("valley", 6 * 60 + 45, 12 * 60 + 1, months=months_mask(range(7, 13))),
        WindowSpec("peak", 12 * 60 + 1, 23 * 60 + 15, months=months_mask(range(7, 13))),
    ),
)
SPECS = [PRESETS["cn-gd"].spec, PRESETS["cn-nx"].spec, MASKED]
COMPILED = {
    (index, zone): tariff_compile(dataclasses.replace(spec, time_zone=zone))
    for index, spec in enumerate(SPECS)
    for zone in ZONES
}


def oracle_band(spec: TariffSpec, instant: int) -> str:
    """The band of an instant straight from the windows, by its wall-clock time from zoneinfo."""
    wall = datetime.fromtimestamp(instant, ZoneInfo(spec.time_zone))
    minute = wall.hour * 60 + wall.minute
    matches = []
    for window in spec.windows:
        if not (window.months >> (wall.month - 1) & 1 and window.weekdays >> wall.weekday() & 1):
            continue
        if window.start_minute < window.end_minute:
            inside = window.start_minute <= minute < window.end_minute
        else:
            inside = minute >= window.start_minute or minute < window.end_minute
        if inside:
            matches.append(window.band)
    assert len(matches) == 1, (wall, matches)
    return matches[0]


@settings(max_examples=300, deadline=None)
@given(
    spec_index=st.integers(0, len(SPECS) - 1),
    zone=st.sampled_from(ZONES),
    start=st.integers(utc(2016, 1, 1), utc(2031, 1, 1)),
    length=st.one_of(st.integers(0, 7200), st.integers(0, 9 * 86400)),
)
def test_slices_cover_exactly_and_follow_the_wall_clock(spec_index, zone, start, length):
    compiled = COMPILED[(spec_index, zone)]
    spec = dataclasses.replace(SPECS[spec_index], time_zone=zone)
    tz = ZoneInfo(zone)
    end = start + length
    pieces = compiled.slices(start, end)
    if length == 0:
        assert pieces == []
        return
    assert pieces[0][0] == start
    assert pieces[-1][1] == end
    for (s1, e1, b1), (s2, _e2, b2) in pairwise(pieces):
        assert e1 == s2
        if b1 == b2:  # same band on both sides: only a local midnight may separate them
            assert datetime.fromtimestamp(s1, tz).date() != datetime.fromtimestamp(s2, tz).date()
    for s, e, band in pieces:
        assert s < e
        assert datetime.fromtimestamp(s, tz).date() == datetime.fromtimestamp(e - 1, tz).date()
        assert compiled.band_at(s) == band
        assert compiled.band_at(e - 1) == band
        assert compiled.bands[band] == oracle_band(spec, s) == oracle_band(spec, e - 1)
