"""The time-of-use schedule engine: validation, compilation and band slicing. Pure Python, no ORM.

A tariff maps every *wall-clock minute* of every local calendar day (in the tariff's IANA zone) to exactly
one band. Windows are minutes ``[start_minute, end_minute)`` of the local day; ``end_minute <=
start_minute`` wraps midnight, meaning ``[start, 1440) ∪ [0, end)`` of each day the masks select (the masks
apply to the calendar day of each minute, so a wrapping window never "carries" a mask into the next day).

Because masks are per month and per weekday, every day of the calendar behaves like one of at most 84
*profiles* (month × weekday). Validation checks each distinct set of applicable windows once, so it costs
the same for a tariff with three windows as for one with three hundred profiles.

Rating asks :meth:`CompiledTariff.slices` for the band pieces of ``[start, end)`` in UTC epoch seconds. The
band of an instant is the band of its local wall-clock time: on a fall-back day the repeated hour follows
the wall clock twice; on a spring-forward day the skipped wall times do not occur. Slices are also cut at
every local midnight, so one slice never spans two local days (rating and invoices group by local day).

Day bounds: local day ``d`` is the half-open UTC range from the first instant whose wall-clock time is at
or after ``d 00:00`` to the first instant whose wall-clock time is at or after ``d+1 00:00``; where midnight
itself does not exist (a zone that springs forward at 00:00), the day starts at the transition.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from django.utils.translation import gettext as _

from metering.errors import TariffInvalidError

# The same values as metering.models.tariffs (a test keeps them equal); repeated here so this module
# never imports the ORM.
MINUTES_PER_DAY = 1440
ALL_WEEKDAYS = 0b111_1111  # bit 0 = Monday … bit 6 = Sunday
ALL_MONTHS = 0b1111_1111_1111  # bit 0 = January … bit 11 = December
BANDS: tuple[str, ...] = ("critical_peak", "peak", "flat", "valley", "deep_valley")

MULTIPLIER_PLACES = 4
MULTIPLIER_MAX = Decimal("9999.9999")  # DecimalField(max_digits=8, decimal_places=4)
MAX_WINDOWS = 200
DEFAULT_TIME_ZONE = "Asia/Shanghai"

WEEKDAY_NAMES: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTH_NAMES: tuple[str, ...] = (
    "Jan",
    "Feb",
    "Mar",
    "Apr",
    "May",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Oct",
    "Nov",
    "Dec",
)

_SECONDS_PER_DAY = 86_400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MAX_FAULTS = 50  # per kind in ``extra``; the message names the first few
_MAX_CACHED_DAYS = 40_000  # ~110 years of days per compiled tariff before the cache starts over


@dataclass(frozen=True)
class WindowSpec:
    band: str
    start_minute: int
    end_minute: int
    weekdays: int = ALL_WEEKDAYS
    months: int = ALL_MONTHS


@dataclass(frozen=True)
class TariffSpec:
    time_zone: str
    multipliers: Mapping[str, Decimal]
    windows: tuple[WindowSpec, ...]


# --- Formatting -------------------------------------------------------------------------------------


def minute_label(minute: int) -> str:
    """``615`` → ``"10:15"``; ``1440`` → ``"24:00"``."""
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _ranges(indices: Iterable[int]) -> list[tuple[int, int]]:
    ordered = sorted(set(indices))
    runs: list[tuple[int, int]] = []
    for index in ordered:
        if runs and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return runs


def _label_ranges(indices: Iterable[int], names: Sequence[str]) -> str:
    parts = []
    for first, last in _ranges(indices):
        if first == last:
            parts.append(names[first])
        elif last == first + 1:
            parts.append(f"{names[first]}, {names[last]}")
        else:
            parts.append(f"{names[first]}–{names[last]}")
    return ", ".join(parts)


def weekdays_label(mask: int) -> str:
    """``0b0011111`` → ``"Mon–Fri"``."""
    return _label_ranges((i for i in range(7) if mask >> i & 1), WEEKDAY_NAMES)


def months_label(mask: int) -> str:
    """``0b111000000`` → ``"Jul–Sep"``."""
    return _label_ranges((i for i in range(12) if mask >> i & 1), MONTH_NAMES)


def weekdays_mask(indices: Iterable[int]) -> int:
    """Weekday indices (0 = Monday) as a mask."""
    mask = 0
    for index in indices:
        mask |= 1 << index
    return mask


def months_mask(months: Iterable[int]) -> int:
    """Month numbers (1 = January) as a mask."""
    mask = 0
    for month in months:
        mask |= 1 << (month - 1)
    return mask


# --- Validation -------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones())


def time_zone_is_valid(name: str) -> bool:
    """An IANA zone name known to this machine's tz database (``zoneinfo``)."""
    if not isinstance(name, str) or not name or name not in _known_zones():
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _multiplier_fault(value: Any) -> str | None:
    if isinstance(value, float | bool):
        return _("must be a Decimal (or an integer), not a float")
    try:
        amount = Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        return _("is not a number")
    if not amount.is_finite():
        return _("is not a finite number")
    if amount <= 0:
        return _("must be greater than 0")
    if amount > MULTIPLIER_MAX:
        return _("must be at most %(max)s") % {"max": MULTIPLIER_MAX}
    if amount != amount.quantize(Decimal(1).scaleb(-MULTIPLIER_PLACES)):
        return _("has more than %(places)d decimal places") % {"places": MULTIPLIER_PLACES}
    return None


def _window_faults(window: WindowSpec) -> list[str]:
    faults = []
    for name in ("start_minute", "end_minute", "weekdays", "months"):
        if not isinstance(getattr(window, name), int) or isinstance(getattr(window, name), bool):
            faults.append(_("%(name)s must be an integer") % {"name": name})
    if faults:
        return faults
    if not 0 <= window.start_minute < MINUTES_PER_DAY:
        faults.append(_("start_minute must be 0–%(last)d (00:00–23:59)") % {"last": MINUTES_PER_DAY - 1})
    if not 1 <= window.end_minute <= MINUTES_PER_DAY:
        faults.append(
            _("end_minute must be 1–%(last)d (00:01–24:00); midnight as an end is 24:00")
            % {"last": MINUTES_PER_DAY}
        )
    if not faults and window.start_minute == window.end_minute:
        faults.append(_("start and end are equal; for the whole day use 00:00–24:00"))
    if not 1 <= window.weekdays <= ALL_WEEKDAYS:
        faults.append(_("weekdays must select at least one day (mask 1–127, bit 0 = Monday)"))
    if not 1 <= window.months <= ALL_MONTHS:
        faults.append(_("months must select at least one month (mask 1–4095, bit 0 = January)"))
    return faults


def _day_intervals(window: WindowSpec) -> list[tuple[int, int]]:
    """The window's minutes of one selected calendar day, as up to two non-wrapping intervals."""
    if window.end_minute > window.start_minute:
        return [(window.start_minute, window.end_minute)]
    pieces = [(window.start_minute, MINUTES_PER_DAY)]
    if window.end_minute > 0:
        pieces.append((0, window.end_minute))
    return pieces


def _profile_groups(windows: Sequence[WindowSpec]) -> dict[tuple[int, ...], list[tuple[int, int]]]:
    """Distinct sets of applicable window indices → the (month 0–11, weekday 0–6) profiles using them."""
    groups: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)
    for month in range(12):
        for weekday in range(7):
            applicable = tuple(
                i for i, w in enumerate(windows) if w.months >> month & 1 and w.weekdays >> weekday & 1
            )
            groups[applicable].append((month, weekday))
    return groups


def _coverage_faults(
    windows: Sequence[WindowSpec], indices: tuple[int, ...]
) -> tuple[list[tuple[int, int]], list[tuple[int, int, tuple[str, ...]]]]:
    """Gaps [(from, to)] and overlaps [(from, to, bands)] in minutes of a day covered by ``indices``."""
    edges = {0, MINUTES_PER_DAY}
    pieces: list[tuple[int, int, int]] = []
    for index in indices:
        for start, end in _day_intervals(windows[index]):
            pieces.append((start, end, index))
            edges.update((start, end))
    cuts = sorted(edges)
    gaps: list[tuple[int, int]] = []
    overlaps: list[tuple[int, int, tuple[str, ...]]] = []
    for lo, hi in pairwise(cuts):
        covering = [index for start, end, index in pieces if start <= lo and hi <= end]
        if not covering:
            if gaps and gaps[-1][1] == lo:
                gaps[-1] = (gaps[-1][0], hi)
            else:
                gaps.append((lo, hi))
        elif len(covering) > 1:
            bands = tuple(sorted({windows[i].band for i in covering}, key=_band_order))
            if overlaps and overlaps[-1][1] == lo and overlaps[-1][2] == bands:
                overlaps[-1] = (overlaps[-1][0], hi, bands)
            else:
                overlaps.append((lo, hi, bands))
    return gaps, overlaps


def _band_order(band: str) -> tuple[int, str]:
    return (BANDS.index(band), band) if band in BANDS else (len(BANDS), band)


def _describe_profiles(profiles: Iterable[tuple[int, int]]) -> list[dict[str, str]]:
    """A set of (month, weekday) profiles as a few {"months", "weekdays"} rectangles."""
    months_by_weekday: dict[int, int] = defaultdict(int)
    for month, weekday in profiles:
        months_by_weekday[weekday] |= 1 << month
    weekdays_by_months: dict[int, int] = defaultdict(int)
    for weekday, mask in months_by_weekday.items():
        weekdays_by_months[mask] |= 1 << weekday
    rectangles = sorted(weekdays_by_months.items(), key=lambda item: (item[1] & -item[1], item[0] & -item[0]))
    return [{"months": months_label(m), "weekdays": weekdays_label(w)} for m, w in rectangles]


def tariff_spec_validate(spec: TariffSpec) -> None:
    """Check a schedule; raise TariffInvalidError naming every fault, or return None.

    Rules: a known IANA zone; multipliers only for known bands, each > 0 with at most four decimal places;
    1–MAX_WINDOWS windows, each of a known band that has a multiplier, start 00:00–23:59, end 00:01–24:00,
    start ≠ end (whole day is 00:00–24:00), non-empty masks; every band with a multiplier used by some
    window; and every minute of every day in exactly one window. ``extra`` carries the faults by kind
    (``time_zone``, ``multipliers``, ``windows``, ``unknown_bands``, ``missing_multipliers``,
    ``unused_bands``, ``gaps``, ``overlaps``), gaps and overlaps as {"months", "weekdays", "from", "to"}
    (overlaps also name their ``bands``).
    """
    extra: dict[str, Any] = {}
    sentences: list[str] = []

    if not time_zone_is_valid(spec.time_zone):
        extra["time_zone"] = spec.time_zone
        sentences.append(
            _("%(zone)r is not an IANA time zone (e.g. Asia/Shanghai).") % {"zone": spec.time_zone}
        )

    multiplier_faults = {}
    for band, value in spec.multipliers.items():
        if band not in BANDS:
            continue
        fault = _multiplier_fault(value)
        if fault is not None:
            multiplier_faults[band] = fault  # "must be greater than 0", …
    if multiplier_faults:
        extra["multipliers"] = {
            band: _("multiplier %(fault)s") % {"fault": fault} for band, fault in multiplier_faults.items()
        }
        sentences.extend(
            _("The %(band)s multiplier %(fault)s.") % {"band": band, "fault": fault}
            for band, fault in multiplier_faults.items()
        )

    windows = tuple(spec.windows)
    if not windows:
        extra["windows"] = [{"index": None, "errors": [_("at least one window is required")]}]
        sentences.append(_("A tariff needs at least one window."))
    elif len(windows) > MAX_WINDOWS:
        extra["windows"] = [{"index": None, "errors": [_("at most %(max)d windows") % {"max": MAX_WINDOWS}]}]
        sentences.append(
            _("A tariff may have at most %(max)d windows; this one has %(count)d.")
            % {"max": MAX_WINDOWS, "count": len(windows)}
        )
    else:
        window_faults = []
        for index, window in enumerate(windows):
            faults = _window_faults(window)
            if faults:
                window_faults.append({"index": index, "errors": faults})
                sentences.append(
                    _("Window %(number)d (%(band)s): %(faults)s.")
                    % {"number": index + 1, "band": window.band, "faults": "; ".join(faults)}
                )
        if window_faults:
            extra["windows"] = window_faults

    unknown = sorted(
        {b for b in spec.multipliers if b not in BANDS} | {w.band for w in windows if w.band not in BANDS}
    )
    if unknown:
        extra["unknown_bands"] = unknown
        sentences.append(
            _("Unknown band %(unknown)s; bands are %(bands)s.")
            % {"unknown": ", ".join(unknown), "bands": ", ".join(BANDS)}
        )
    missing = sorted(
        {w.band for w in windows if w.band in BANDS and w.band not in spec.multipliers}, key=_band_order
    )
    if missing:
        extra["missing_multipliers"] = missing
        sentences.append(
            _("No multiplier for %(bands)s, which a window uses.") % {"bands": ", ".join(missing)}
        )
    used = {w.band for w in windows}
    unused = sorted((b for b in spec.multipliers if b in BANDS and b not in used), key=_band_order)
    if unused:
        extra["unused_bands"] = unused
        sentences.append(
            _("No window uses %(bands)s; drop its multiplier or give it a window.")
            % {"bands": ", ".join(unused)}
        )

    # Coverage only means something once every window is well-formed.
    if windows and "windows" not in extra:
        gap_profiles: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        overlap_profiles: dict[tuple[int, int, tuple[str, ...]], list[tuple[int, int]]] = defaultdict(list)
        for indices, profiles in _profile_groups(windows).items():
            gaps, overlaps = _coverage_faults(windows, indices)
            for gap in gaps:
                gap_profiles[gap].extend(profiles)
            for overlap in overlaps:
                overlap_profiles[overlap].extend(profiles)
        gap_rows = [
            {**where, "from": minute_label(lo), "to": minute_label(hi)}
            for (lo, hi), profiles in sorted(gap_profiles.items())
            for where in _describe_profiles(profiles)
        ]
        overlap_rows = [
            {**where, "from": minute_label(lo), "to": minute_label(hi), "bands": list(bands)}
            for (lo, hi, bands), profiles in sorted(overlap_profiles.items())
            for where in _describe_profiles(profiles)
        ]
        if gap_rows or overlap_rows:
            described = [
                _("%(from)s–%(to)s on %(weekdays)s in %(months)s has no band") % row for row in gap_rows
            ] + [
                _("%(from)s–%(to)s on %(weekdays)s in %(months)s is in both %(bands)s")
                % {**row, "bands": _(" and ").join(row["bands"])}
                for row in overlap_rows
            ]
            shown = "; ".join(described[:5])
            more = _(" (and %(count)d more)") % {"count": len(described) - 5} if len(described) > 5 else ""
            sentences.append(
                _("Every minute must belong to exactly one band: %(faults)s%(more)s.")
                % {"faults": shown, "more": more}
            )
        if gap_rows:
            extra["gaps"] = gap_rows[:_MAX_FAULTS]
        if overlap_rows:
            extra["overlaps"] = overlap_rows[:_MAX_FAULTS]

    if extra:
        raise TariffInvalidError(" ".join(sentences), extra=extra)


# --- Compilation and slicing ------------------------------------------------------------------------

# One compiled local day: (utc_start, utc_end, segment starts, segment ends, segment band indices).
_Day = tuple[int, int, list[int], list[int], list[int]]


class CompiledTariff:
    """A validated schedule ready for rating: fast band lookups over UTC epoch seconds.

    Thread-safe for readers: the per-day cache only grows (or is swapped wholesale), and a day, once
    built, never changes. Build one with :func:`tariff_compile`.
    """

    bands: tuple[str, ...]
    multipliers_e4: tuple[int, ...]

    def __init__(self, spec: TariffSpec):
        self.time_zone = spec.time_zone
        self._zone = ZoneInfo(spec.time_zone)
        used = {w.band for w in spec.windows}
        self.bands = tuple(sorted(used, key=_band_order))
        self.multipliers_e4 = tuple(
            int(Decimal(spec.multipliers[band]).scaleb(MULTIPLIER_PLACES)) for band in self.bands
        )
        band_index = {band: i for i, band in enumerate(self.bands)}
        windows = tuple(spec.windows)
        # Wall-clock runs (start_minute, end_minute, band index) for each of the 84 profiles.
        self._profiles: list[tuple[tuple[int, int, int], ...]] = [()] * 84
        for indices, profiles in _profile_groups(windows).items():
            pieces = sorted(
                (start, end, band_index[windows[i].band])
                for i in indices
                for start, end in _day_intervals(windows[i])
            )
            runs: list[tuple[int, int, int]] = []
            for start, end, band in pieces:
                if runs and runs[-1][2] == band and runs[-1][1] == start:
                    runs[-1] = (runs[-1][0], end, band)
                else:
                    runs.append((start, end, band))
            for month, weekday in profiles:
                self._profiles[month * 7 + weekday] = tuple(runs)
        self._lock = threading.Lock()
        self._day_starts: list[int] = []
        self._days: list[_Day] = []
        self._last: _Day = (0, 0, [0], [0], [0])

    # The hot path. Everything here is integers and lists: no datetime objects.
    def slices(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """Band pieces of ``[start, end)`` (UTC epoch seconds) as consecutive half-open
        ``(slice_start, slice_end, band_index)``, cut at every band edge and every local midnight.
        An empty interval gives ``[]``; ``end < start`` is a ValueError."""
        if end <= start:
            if end < start:
                raise ValueError(f"end {end} is before start {start}")
            return []
        day = self._last
        if not day[0] <= start < day[1]:
            day = self._day_containing(start)
        seg_starts = day[2]
        seg_ends = day[3]
        seg_bands = day[4]
        i = bisect_right(seg_starts, start) - 1
        out = []
        t = start
        while True:
            seg_end = seg_ends[i]
            if end <= seg_end:
                out.append((t, end, seg_bands[i]))
                return out
            out.append((t, seg_end, seg_bands[i]))
            t = seg_end
            i += 1
            if i == len(seg_ends):
                day = self._day_containing(t)
                seg_starts, seg_ends, seg_bands = day[2], day[3], day[4]
                i = 0

    def band_at(self, instant: int) -> int:
        """The band index of the UTC epoch second ``instant`` (by its local wall-clock time)."""
        day = self._last
        if not day[0] <= instant < day[1]:
            day = self._day_containing(instant)
        return day[4][bisect_right(day[2], instant) - 1]

    def day_strip(self, local_date: date) -> list[tuple[int, int, str]]:
        """The wall-clock day of ``local_date`` as (start_minute, end_minute, band) runs over 0–1440.

        Wall-clock minutes, not elapsed ones: on a daylight-saving day the skipped or repeated hour is
        drawn once, where the clock shows it."""
        runs = self._profiles[(local_date.month - 1) * 7 + local_date.weekday()]
        return [(start, end, self.bands[band]) for start, end, band in runs]

    def day_bounds(self, local_date: date) -> tuple[int, int]:
        """UTC epoch seconds ``[start, end)`` of the local day ``local_date``."""
        return self._first_instant_at_or_after(local_date), self._first_instant_at_or_after(
            local_date + timedelta(days=1)
        )

    # --- The per-day cache (cold path) ---

    def _day_containing(self, instant: int) -> _Day:
        index = bisect_right(self._day_starts, instant) - 1
        if index >= 0:
            day = self._days[index]
            if instant < day[1]:
                self._last = day
                return day
        wall_date = datetime.fromtimestamp(instant, self._zone).date()
        for candidate in (wall_date, wall_date - timedelta(days=1), wall_date + timedelta(days=1)):
            day = self._build_day(candidate)
            if day[0] <= instant < day[1]:
                self._store(day)
                self._last = day
                return day
        raise AssertionError(f"no local day contains {instant} in {self.time_zone}")  # pragma: no cover

    def _store(self, day: _Day) -> None:
        with self._lock:
            if len(self._days) >= _MAX_CACHED_DAYS:
                self._day_starts, self._days = [], []
            index = bisect_right(self._day_starts, day[0])
            if index > 0 and self._day_starts[index - 1] == day[0]:
                return
            # Build new lists and swap them in, so a reader never sees starts and days out of step.
            starts = [*self._day_starts[:index], day[0], *self._day_starts[index:]]
            days = [*self._days[:index], day, *self._days[index:]]
            self._days, self._day_starts = days, starts

    def _offset(self, instant: int) -> int:
        moment = datetime.fromtimestamp(instant, UTC).astimezone(self._zone)
        offset = moment.utcoffset()
        assert offset is not None
        return int(offset.total_seconds())

    def _first_instant_at_or_after(self, local_date: date) -> int:
        """The first UTC second whose wall-clock time is at or after ``local_date`` 00:00."""
        wall = (local_date.toordinal() - _EPOCH_ORDINAL) * _SECONDS_PER_DAY
        midnight = datetime.combine(local_date, time(0), tzinfo=self._zone)
        candidate = int(midnight.timestamp())  # fold=0: the earlier instant when ambiguous
        if candidate + self._offset(candidate) == wall:
            return candidate
        # Midnight falls in a gap: the day starts at the transition. fold=0 resolved with the offset
        # before the gap, so ``candidate`` is after the transition; search back for the first instant
        # whose wall time is at or after midnight.
        low = int(midnight.replace(fold=1).timestamp()) - 1
        low = min(low, candidate - 1)
        while low + self._offset(low) >= wall:
            low -= 3600
        high = candidate
        while high - low > 1:  # invariant: wall(low) < midnight <= wall(high)
            middle = (low + high) // 2
            if middle + self._offset(middle) >= wall:
                high = middle
            else:
                low = middle
        return high

    def _offset_pieces(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """``[start, end)`` split where the zone's UTC offset changes: (from, to, offset).

        Probes hourly and bisects to the second between two probes that disagree; two transitions
        less than an hour apart would be missed, and no zone has them."""
        pieces = []
        piece_start = start
        offset = self._offset(start)
        probe = start
        while probe < end - 1:
            following = min(probe + 3600, end - 1)
            if self._offset(following) == offset:
                probe = following
                continue
            low, high = probe, following  # offset(low) == offset != offset(high)
            while high - low > 1:
                middle = (low + high) // 2
                if self._offset(middle) == offset:
                    low = middle
                else:
                    high = middle
            pieces.append((piece_start, high, offset))
            piece_start, offset, probe = high, self._offset(high), high
        pieces.append((piece_start, end, offset))
        return pieces

    def _build_day(self, local_date: date) -> _Day:
        day_start, day_end = self.day_bounds(local_date)
        seg_starts: list[int] = []
        seg_ends: list[int] = []
        seg_bands: list[int] = []
        for piece_start, piece_end, offset in self._offset_pieces(day_start, day_end):
            wall = piece_start + offset
            wall_end = piece_end + offset
            while wall < wall_end:
                wall_day, second = divmod(wall, _SECONDS_PER_DAY)
                calendar_day = date.fromordinal(wall_day + _EPOCH_ORDINAL)
                runs = self._profiles[(calendar_day.month - 1) * 7 + calendar_day.weekday()]
                minute = second // 60
                run = next(r for r in runs if r[0] <= minute < r[1])
                run_end = wall_day * _SECONDS_PER_DAY + run[1] * 60
                segment_end = min(run_end, wall_end)
                utc_start, utc_end = wall - offset, segment_end - offset
                if seg_bands and seg_bands[-1] == run[2] and seg_ends[-1] == utc_start:
                    seg_ends[-1] = utc_end
                else:
                    seg_starts.append(utc_start)
                    seg_ends.append(utc_end)
                    seg_bands.append(run[2])
                wall = segment_end
        return (day_start, day_end, seg_starts, seg_ends, seg_bands)


def tariff_compile(spec: TariffSpec) -> CompiledTariff:
    """Compile a schedule that :func:`tariff_spec_validate` accepted."""
    return CompiledTariff(spec)


# --- Presets ----------------------------------------------------------------------------------------
#
# Every preset comes from an official provincial notice, cited by document number and date exactly as
# found, with the customer class it states and, beside its figures, where the text was read. A figure not
# read in the notice's own text (only in a secondary source that quotes it: a grid company's announcement, a
# news summary) is marked in ``unconfirmed``; such a preset, or one for a class other than industrial and
# commercial users (the class a data centre is billed in), is never chosen by default
# (preset_default_code). Where no source gave a hub province's windows and fixed ratios, there is no preset
# (PROVINCES_WITHOUT_PRESET says what was looked for and found). The README lists every preset's source.

PRESET_OFFICIAL = "official"  # windows and ratios from the notice, for industrial and commercial users
PRESET_OTHER_CLASS = "other_class"  # from the notice, but the notice states them for another class
PRESET_UNCONFIRMED = "unconfirmed"  # some figure not confirmed from the notice (see ``unconfirmed``)
PRESET_PLATFORM = "platform"  # the platform's own flat default, no notice behind it
PRESET_STATUSES = (PRESET_OFFICIAL, PRESET_OTHER_CLASS, PRESET_UNCONFIRMED, PRESET_PLATFORM)


@dataclass(frozen=True)
class PresetVersion:
    """One edition of a preset, in force from ``effective_from`` (the notice's effective date)."""

    effective_from: datetime
    document: str  # the notice's document number, as found
    document_date: str  # as found; "" when not found
    spec: TariffSpec


@dataclass(frozen=True)
class Preset:
    code: str
    name: str
    province: str
    hubs: tuple[str, ...]  # the national computing hubs in this province
    customer_class: str  # the class the notice states these windows and ratios for
    status: str  # one of PRESET_STATUSES
    unconfirmed: tuple[str, ...]  # the figures not confirmed from the notice
    source: str  # stored on the Tariff row (at most 500 characters)
    versions: tuple[PresetVersion, ...]

    @property
    def spec(self) -> TariffSpec:
        """The newest edition's schedule."""
        return self.versions[-1].spec

    @property
    def selectable_by_default(self) -> bool:
        return self.status == PRESET_OFFICIAL and not self.unconfirmed


_SUMMER = months_mask([7, 8, 9])
_NOT_SUMMER = ALL_MONTHS & ~_SUMMER
_SHANGHAI = ZoneInfo(DEFAULT_TIME_ZONE)


def _hm(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def _w(band: str, start: str, end: str, months: int = ALL_MONTHS) -> WindowSpec:
    return WindowSpec(band=band, start_minute=_hm(start), end_minute=_hm(end), months=months)


def _local(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=_SHANGHAI)


_GD_2021 = TariffSpec(
    time_zone=DEFAULT_TIME_ZONE,
    multipliers={
        "critical_peak": Decimal("2.125"),  # peak × 1.25
        "peak": Decimal("1.7"),
        "flat": Decimal("1"),
        "valley": Decimal("0.38"),
    },
    windows=(
        _w("valley", "00:00", "08:00"),
        _w("flat", "08:00", "10:00"),
        _w("peak", "10:00", "12:00", _NOT_SUMMER),
        _w("peak", "10:00", "11:00", _SUMMER),
        _w("critical_peak", "11:00", "12:00", _SUMMER),
        _w("flat", "12:00", "14:00"),
        _w("peak", "14:00", "19:00", _NOT_SUMMER),
        _w("peak", "14:00", "15:00", _SUMMER),
        _w("critical_peak", "15:00", "17:00", _SUMMER),
        _w("peak", "17:00", "19:00", _SUMMER),
        _w("flat", "19:00", "24:00"),
    ),
)

# Ningxia: the windows of 宁发改价格(管理)〔2023〕7号. The notice's ratios were not found; 1.5 : 1 : 0.5 is
# an ESTIMATE, the 3 : 1 minimum peak-valley spread that the national notice 发改价格〔2021〕1093号 sets for
# provinces, not a Ningxia figure. For industrial and commercial users the same windows classify the
# mid- and long-term trading periods (峰 7–9 and 17–23, 谷 9–17, 平 23–7), whose prices the market forms:
# 宁发改运行〔2024〕952号 on 2025 trading, citing 7号, as State Grid Ningxia's announcement note quotes it
# (read as reproduced in a public repository's test data; see the secondary sources below).
_NX_2023 = TariffSpec(
    time_zone=DEFAULT_TIME_ZONE,
    multipliers={"peak": Decimal("1.5"), "flat": Decimal("1"), "valley": Decimal("0.5")},
    windows=(
        _w("flat", "23:00", "07:00"),
        _w("peak", "07:00", "09:00"),
        _w("valley", "09:00", "17:00"),
        _w("peak", "17:00", "23:00"),
    ),
)


def _day(months: int, *pieces: tuple[str, str, str]) -> tuple[WindowSpec, ...]:
    """One day's windows for the months in ``months``: (band, start, end) pieces, as a notice lists them."""
    return tuple(_w(band, start, end, months) for band, start, end in pieces)


# --- Editions found only in secondary sources (status "unconfirmed") --------------------------------
#
# State Grid's provincial companies publish a monthly agency-purchase price announcement (代理购电价格公告)
# whose notes restate the provincial time-of-use notice in force: its document number, windows and ratios.
# Those notes were read as reproduced in a public repository's test data (Go package ``cronx``, the
# fixture ``TestNewPeriod``, one note per province); news reprints were read where the stored copies had
# them. Neither is the notice itself, so every preset below is ``unconfirmed`` and never a default.

# Beijing, 京发改规〔2023〕11号 (Beijing DRC, dated 2023-08-18). Ratios READ in the notice's text as
# reprinted by 电力网 on 2023-08-22 (its opening summary and "以下为原文" body): single-part < 1 kV
# 1.71 : 1 : 0.36, single-part ≥ 1 kV 1.8 : 1 : 0.3, two-part 1.6 : 1 : 0.4, critical peak = peak
# × 1.2. The hours are from State Grid Beijing's announcement note quoting 11号 (peak 10–13 and 17–22,
# flat 7–10, 13–17 and 22–23, valley 23–7; critical peak Jul–Aug 11–13 and 16–17, Jan and Dec 18–21),
# which a public repository's record of the DRC's page also gives, with 2023-09-01 as the date in force;
# the reprint's body was cut before its hours, so they were not read in the notice text. Two-part users
# (a data centre's usual class) are modelled: 1.6 : 1 : 0.4, critical peak 1.6 × 1.2 = 1.92.
_BJ_JUL_AUG = months_mask([7, 8])
_BJ_JAN_DEC = months_mask([1, 12])
_BJ_OTHER = ALL_MONTHS & ~_BJ_JUL_AUG & ~_BJ_JAN_DEC
_BJ_2023 = TariffSpec(
    time_zone=DEFAULT_TIME_ZONE,
    multipliers={
        "critical_peak": Decimal("1.92"),
        "peak": Decimal("1.6"),
        "flat": Decimal("1"),
        "valley": Decimal("0.4"),
    },
    windows=(
        *_day(
            _BJ_OTHER,
            ("valley", "23:00", "07:00"),
            ("flat", "07:00", "10:00"),
            ("peak", "10:00", "13:00"),
            ("flat", "13:00", "17:00"),
            ("peak", "17:00", "22:00"),
            ("flat", "22:00", "23:00"),
        ),
        *_day(
            _BJ_JUL_AUG,
            ("valley", "23:00", "07:00"),
            ("flat", "07:00", "10:00"),
            ("peak", "10:00", "11:00"),
            ("critical_peak", "11:00", "13:00"),
            ("flat", "13:00", "16:00"),
            ("critical_peak", "16:00", "17:00"),
            ("peak", "17:00", "22:00"),
            ("flat", "22:00", "23:00"),
        ),
        *_day(
            _BJ_JAN_DEC,
            ("valley", "23:00", "07:00"),
            ("flat", "07:00", "10:00"),
            ("peak", "10:00", "13:00"),
            ("flat", "13:00", "17:00"),
            ("peak", "17:00", "18:00"),
            ("critical_peak", "18:00", "21:00"),
            ("peak", "21:00", "22:00"),
            ("flat", "22:00", "23:00"),
        ),
    ),
)

# Hebei, Jibei grid (冀北电网: Zhangjiakou, home of the jjj hub's cluster, with Tangshan, Qinhuangdao,
# Chengde, Langfang): the Hebei DRC's notice 关于优化调整冀北电网工商业及其他用户分时电价政策的通知, issued
# 2025-11-26 as reported by a 网易号 article (163.com, "冀北电网分时电价新政策印发"). Windows and ratios are
# the article's summary of the notice: flat = the agency-purchase month's average price; peak and valley
# flat ± 70 %; critical peak = peak × 1.2 (2.04); deep valley = valley × 0.8 (0.24). The article's
# reprint of the notice's text stops at its scope, so no figure was read in the notice text; its document
# number and effective date were not found. It replaces 冀发改能价〔2023〕1711号 (windows and the ± 70 % /
# × 1.2 ratios read in that notice's reprinted text, csjbk.com and jpaw.cn; its effective date not found,
# so that edition is not modelled).
_JB_SUMMER = months_mask([6, 7, 8])
_JB_WINTER = months_mask([1, 11, 12])
_JB_FEB = months_mask([2])
_JB_SPRING_AUTUMN = months_mask([3, 4, 5, 9, 10])
_JB_2025 = TariffSpec(
    time_zone=DEFAULT_TIME_ZONE,
    multipliers={
        "critical_peak": Decimal("2.04"),
        "peak": Decimal("1.7"),
        "flat": Decimal("1"),
        "valley": Decimal("0.3"),
        "deep_valley": Decimal("0.24"),
    },
    windows=(
        *_day(
            _JB_SUMMER,
            ("valley", "00:00", "07:00"),
            ("flat", "07:00", "10:00"),
            ("peak", "10:00", "12:00"),
            ("flat", "12:00", "16:00"),
            ("peak", "16:00", "18:00"),
            ("critical_peak", "18:00", "21:00"),
            ("peak", "21:00", "22:00"),
            ("flat", "22:00", "23:00"),
            ("valley", "23:00", "24:00"),
        ),
        *_day(
            _JB_WINTER,
            ("flat", "00:00", "01:00"),
            ("valley", "01:00", "06:00"),
            ("flat", "06:00", "07:00"),
            ("peak", "07:00", "09:00"),
            ("flat", "09:00", "12:00"),
            ("deep_valley", "12:00", "15:00"),
            ("flat", "15:00", "16:00"),
            ("peak", "16:00", "17:00"),
            ("critical_peak", "17:00", "19:00"),
            ("peak", "19:00", "22:00"),
            ("flat", "22:00", "24:00"),
        ),
        *_day(
            _JB_FEB,
            ("flat", "00:00", "01:00"),
            ("valley", "01:00", "06:00"),
            ("flat", "06:00", "12:00"),
            ("deep_valley", "12:00", "15:00"),
            ("flat", "15:00", "16:00"),
            ("peak", "16:00", "22:00"),
            ("flat", "22:00", "24:00"),
        ),
        *_day(
            _JB_SPRING_AUTUMN,
            ("flat", "00:00", "01:00"),
            ("valley", "01:00", "06:00"),
            ("flat", "06:00", "12:00"),
            ("valley", "12:00", "15:00"),
            ("flat", "15:00", "16:00"),
            ("peak", "16:00", "22:00"),
            ("flat", "22:00", "24:00"),
        ),
    ),
)

# Jiangsu, 苏发改价格发〔2025〕426号 (关于优化工商业分时电价结构促进新能源消纳降低企业用电成本支持经济社会发展
# 的通知), as State Grid Jiangsu's announcement note quotes it: summer and winter (Jun–Aug, Dec–Feb) peak
# 14–22, flat 6–11, 13–14 and 22–24, valley 0–6 and 11–13; spring and autumn (Mar–May, Sep–Nov) peak
# 15–22, flat 6–10, 14–15 and 22–2, valley 2–6 and 10–14. Peak + 80 % for two-part users (+ 70 % single
# part ≥ 100 kVA, + 60 % below), valley − 65 %: two-part 1.8 : 1 : 0.35. In force 2025-06-01 and
# published in May 2025 by a Q&A page's account (chaxiaohao.com), which also says an evening critical peak
# 18–20 at peak + 20 % is kept; the note does not mention it and its months were not found, so no
# critical peak is modelled.
_JS_SUMMER_WINTER = months_mask([6, 7, 8, 12, 1, 2])
_JS_SPRING_AUTUMN = ALL_MONTHS & ~_JS_SUMMER_WINTER
_JS_2025 = TariffSpec(
    time_zone=DEFAULT_TIME_ZONE,
    multipliers={"peak": Decimal("1.8"), "flat": Decimal("1"), "valley": Decimal("0.35")},
    windows=(
        *_day(
            _JS_SUMMER_WINTER,
            ("valley", "00:00", "06:00"),
            ("flat", "06:00", "11:00"),
            ("valley", "11:00", "13:00"),
            ("flat", "13:00", "14:00"),
            ("peak", "14:00", "22:00"),
            ("flat", "22:00", "24:00"),
        ),
        *_day(
            _JS_SPRING_AUTUMN,
            ("flat", "22:00", "02:00"),
            ("valley", "02:00", "06:00"),
            ("flat", "06:00", "10:00"),
            ("valley", "10:00", "14:00"),
            ("flat", "14:00", "15:00"),
            ("peak", "15:00", "22:00"),
        ),
    ),
)

# Sichuan, 川发改价格〔2025〕185号 (四川省发展和改革委员会关于进一步调整我省分时电价机制的通知), as State Grid
# Sichuan's announcement note quotes it, for industrial and commercial users on agency purchase or the
# market: spring and autumn (Mar–Jun, Oct, Nov) peak 10–12 and 17–22, flat 8–10 and 12–17, valley 22–8;
# summer (Jul–Sep) peak 11–18 and 20–23, flat 7–11, 18–20 and 23–1, valley 1–7; winter (Jan, Feb, Dec)
# peak 10–12 and 16–22, flat 8–10, 12–16 and 22–24, valley 0–8. Peak flat + 60 %, valley − 60 %. Critical
# peak for large-industry users (not in Panzhihua, Liangshan, Ganzi, Aba) in Jul–Aug 13–14 and 21–23 at
# peak + 20 % (1.92); also on other months' runs of three days of 35 °C or more, which is not modelled.
_SC_SPRING_AUTUMN = months_mask([3, 4, 5, 6, 10, 11])
_SC_JUL_AUG = months_mask([7, 8])
_SC_SEP = months_mask([9])
_SC_WINTER = months_mask([1, 2, 12])
_SC_2025 = TariffSpec(
    time_zone=DEFAULT_TIME_ZONE,
    multipliers={
        "critical_peak": Decimal("1.92"),
        "peak": Decimal("1.6"),
        "flat": Decimal("1"),
        "valley": Decimal("0.4"),
    },
    windows=(
        *_day(
            _SC_SPRING_AUTUMN,
            ("valley", "22:00", "08:00"),
            ("flat", "08:00", "10:00"),
            ("peak", "10:00", "12:00"),
            ("flat", "12:00", "17:00"),
            ("peak", "17:00", "22:00"),
        ),
        *_day(
            _SC_JUL_AUG,
            ("flat", "23:00", "01:00"),
            ("valley", "01:00", "07:00"),
            ("flat", "07:00", "11:00"),
            ("peak", "11:00", "13:00"),
            ("critical_peak", "13:00", "14:00"),
            ("peak", "14:00", "18:00"),
            ("flat", "18:00", "20:00"),
            ("peak", "20:00", "21:00"),
            ("critical_peak", "21:00", "23:00"),
        ),
        *_day(
            _SC_SEP,
            ("flat", "23:00", "01:00"),
            ("valley", "01:00", "07:00"),
            ("flat", "07:00", "11:00"),
            ("peak", "11:00", "18:00"),
            ("flat", "18:00", "20:00"),
            ("peak", "20:00", "23:00"),
        ),
        *_day(
            _SC_WINTER,
            ("valley", "00:00", "08:00"),
            ("flat", "08:00", "10:00"),
            ("peak", "10:00", "12:00"),
            ("flat", "12:00", "16:00"),
            ("peak", "16:00", "22:00"),
            ("flat", "22:00", "24:00"),
        ),
    ),
)

# Guizhou, 黔发改价格〔2023〕481号 (省发展改革委关于完善峰谷分时电价机制有关事项的通知), as State Grid's
# announcement note quotes it: peak 10–13 and 17–22, flat 8–10, 13–17 and 22–24, valley 0–8; flat not
# floated, peak + 60 %, valley − 60 % (1.6 : 1 : 0.4). A public repository's provenance table transcribed
# the same windows from the Guizhou DRC's page of 2023-06-28 (fgw.guizhou.gov.cn …/t20230628_80566840.html).
_GZ_2023 = TariffSpec(
    time_zone=DEFAULT_TIME_ZONE,
    multipliers={"peak": Decimal("1.6"), "flat": Decimal("1"), "valley": Decimal("0.4")},
    windows=(
        _w("valley", "00:00", "08:00"),
        _w("flat", "08:00", "10:00"),
        _w("peak", "10:00", "13:00"),
        _w("flat", "13:00", "17:00"),
        _w("peak", "17:00", "22:00"),
        _w("flat", "22:00", "24:00"),
    ),
)


PRESETS: dict[str, Preset] = {
    "cn-gd": Preset(
        code="cn-gd",
        name="Guangdong time-of-use (industrial and commercial)",
        province="Guangdong",
        hubs=("gba",),
        customer_class="industrial and commercial users (工商业用户)",
        status=PRESET_OFFICIAL,
        unconfirmed=(),
        source=(
            "Official: 粤发改价格〔2021〕331号, Guangdong DRC notice on further improving peak-valley "
            "time-of-use prices (published 2021-09-06), in force 2021-10-01, industrial and commercial "
            "users. Peak 10–12 and 14–19, valley 0–8, flat otherwise; peak : flat : valley = "
            "1.7 : 1 : 0.38; critical peak = peak × 1.25 in Jul–Sep 11–12 and 15–17. Not modelled: "
            "critical peak on other months' days of 35 °C or more (announced the evening before)."
        ),
        versions=(
            # Checked against a reprint of the Guangdong DRC's release of 2021-09-06: windows, ratios, the
            # critical-peak months, hours and +25 %. The effective date (2021-10-01) and the customer class
            # are as the metering issue and this preset's earlier reading of the notice give them.
            # The earlier schedule (ratios 1.65 : 1 : 0.5, as the 2021 notice says) was not found with its
            # windows and document number, so no edition before 2021-10-01 is modelled.
            PresetVersion(
                effective_from=_local(2021, 10, 1),
                document="粤发改价格〔2021〕331号",
                document_date="2021-09-06 (published)",
                spec=_GD_2021,
            ),
        ),
    ),
    "cn-nx": Preset(
        code="cn-nx",
        name="Ningxia time-of-use (agricultural; ratios estimated)",
        province="Ningxia",
        hubs=("nx",),
        customer_class=(
            "agricultural production users; for industrial and commercial users the windows only classify "
            "market trading periods, whose prices the market forms"
        ),
        status=PRESET_UNCONFIRMED,
        unconfirmed=("ratios", "effective date"),
        source=(
            "Unconfirmed: windows from 宁发改价格(管理)〔2023〕7号 (Ningxia DRC, 2023), stated there for "
            "agricultural use; industrial and commercial users are on market-trading rules. Peak 7–9 and "
            "17–23, valley 9–17, flat 23–7. The ratios 1.5 : 1 : 0.5 are an ESTIMATE (the 3 : 1 national "
            "minimum of 发改价格〔2021〕1093号), not from the notice; its effective date was not found. "
            "Not for a data centre's price card without checking its own supply contract."
        ),
        versions=(
            # In force by 2024-01-01 at the latest (a 2023 notice); the notice's own date was not found.
            PresetVersion(
                effective_from=_local(2024, 1, 1),
                document="宁发改价格(管理)〔2023〕7号",
                document_date="",
                spec=_NX_2023,
            ),
        ),
    ),
    "cn-bj": Preset(
        code="cn-bj",
        name="Beijing time-of-use (two-part industrial and commercial; hours unconfirmed)",
        province="Beijing",
        hubs=("jjj",),
        customer_class="industrial and commercial users on the two-part tariff (两部制)",
        status=PRESET_UNCONFIRMED,
        unconfirmed=("windows", "effective date"),
        source=(
            "Unconfirmed: 京发改规〔2023〕11号 (Beijing DRC, 2023-08-18). Ratios read in the notice's "
            "reprinted text: two-part 1.6 : 1 : 0.4, critical peak = peak × 1.2. Hours from State Grid "
            "Beijing's announcement quoting it, not read in the notice: peak 10–13, 17–22; flat 7–10, "
            "13–17, 22–23; valley 23–7; critical peak Jul–Aug 11–13 and 16–17, Jan and Dec 18–21. In force "
            "2023-09-01 by a secondary record."
        ),
        versions=(
            PresetVersion(
                effective_from=_local(2023, 9, 1),
                document="京发改规〔2023〕11号",
                document_date="2023-08-18",
                spec=_BJ_2023,
            ),
        ),
    ),
    "cn-hebei-jibei": Preset(
        code="cn-hebei-jibei",
        name="Hebei Jibei grid (Zhangjiakou) time-of-use (from a news summary)",
        province="Hebei (Jibei grid)",
        hubs=("jjj",),
        customer_class="industrial and commercial users on agency purchase (代理购电工商业用户)",
        status=PRESET_UNCONFIRMED,
        unconfirmed=("windows", "ratios", "document number", "effective date"),
        source=(
            "Unconfirmed: Hebei DRC 关于优化调整冀北电网工商业及其他用户分时电价政策的通知, issued "
            "2025-11-26, as a 163.com news article summarises it (number and effective date not found). "
            "Peak/valley = flat ± 70 %, critical peak = peak × 1.2, deep valley = valley × 0.8; critical "
            "peak Jun–Aug 18–21, Jan/Nov/Dec 17–19; deep valley 12–15 in Nov–Feb. Replaces "
            "冀发改能价〔2023〕1711号 (not modelled: its effective date was not found)."
        ),
        versions=(
            # The issue date stands in for the effective date, which was not found: the notice cannot be
            # in force earlier.
            PresetVersion(
                effective_from=_local(2025, 11, 26),
                document="关于优化调整冀北电网工商业及其他用户分时电价政策的通知",
                document_date="2025-11-26 (issued, as reported)",
                spec=_JB_2025,
            ),
        ),
    ),
    "cn-js": Preset(
        code="cn-js",
        name="Jiangsu time-of-use (two-part industrial and commercial; unconfirmed)",
        province="Jiangsu",
        hubs=("yrd",),
        customer_class="industrial and commercial users on the two-part tariff (两部制)",
        status=PRESET_UNCONFIRMED,
        unconfirmed=("windows", "ratios", "effective date", "critical peak"),
        source=(
            "Unconfirmed: 苏发改价格发〔2025〕426号 as State Grid Jiangsu's announcement quotes it. Jun–Aug "
            "and Dec–Feb: peak 14–22, valley 0–6 and 11–13; Mar–May and Sep–Nov: peak 15–22, valley 2–6 "
            "and 10–14; flat otherwise. Two-part 1.8 : 1 : 0.35. In force 2025-06-01 by a secondary "
            "account, which also reports an evening critical peak 18–20 (months not found; not modelled)."
        ),
        versions=(
            PresetVersion(
                effective_from=_local(2025, 6, 1),
                document="苏发改价格发〔2025〕426号",
                document_date="2025-05 (as reported)",
                spec=_JS_2025,
            ),
        ),
    ),
    "cn-sc": Preset(
        code="cn-sc",
        name="Sichuan time-of-use (industrial and commercial; unconfirmed)",
        province="Sichuan",
        hubs=("cy",),
        customer_class=(
            "industrial and commercial users (工商业用户); the critical peak applies to large-industry users"
        ),
        status=PRESET_UNCONFIRMED,
        unconfirmed=("windows", "ratios", "effective date"),
        source=(
            "Unconfirmed: 川发改价格〔2025〕185号 as State Grid Sichuan's announcement quotes it. Mar–Jun, "
            "Oct, Nov: peak 10–12, 17–22, valley 22–8; Jul–Sep: peak 11–18, 20–23, valley 1–7; Jan, Feb, "
            "Dec: peak 10–12, 16–22, valley 0–8; flat otherwise. 1.6 : 1 : 0.4; critical peak (large "
            "industry) Jul–Aug 13–14 and 21–23 at peak × 1.2. Not modelled: critical peak on 35 °C runs."
        ),
        versions=(
            # Effective date not found: 1 January of the notice's year stands in, the earliest it can be.
            PresetVersion(
                effective_from=_local(2025, 1, 1),
                document="川发改价格〔2025〕185号",
                document_date="",
                spec=_SC_2025,
            ),
        ),
    ),
    "cn-gz": Preset(
        code="cn-gz",
        name="Guizhou time-of-use (industrial and commercial; unconfirmed)",
        province="Guizhou",
        hubs=("gz",),
        customer_class="industrial and commercial users (工商业用户)",
        status=PRESET_UNCONFIRMED,
        unconfirmed=("windows", "ratios", "effective date"),
        source=(
            "Unconfirmed: 黔发改价格〔2023〕481号 (Guizhou DRC page of 2023-06-28) as State Grid's "
            "announcement quotes it: peak 10–13 and 17–22, flat 8–10, 13–17 and 22–24, valley 0–8; "
            "peak = flat + 60 %, valley = flat − 60 % (1.6 : 1 : 0.4). Effective date not found."
        ),
        versions=(
            # Effective date not found: the DRC page's date stands in, the earliest it can be.
            PresetVersion(
                effective_from=_local(2023, 6, 28),
                document="黔发改价格〔2023〕481号",
                document_date="2023-06-28 (DRC page)",
                spec=_GZ_2023,
            ),
        ),
    ),
    "flat": Preset(
        code="flat",
        name="Flat (no time of use)",
        province="",
        hubs=(),
        customer_class="any",
        status=PRESET_PLATFORM,
        unconfirmed=(),
        source="Cardhour platform default: every hour at 1.0, for operators that do not pass on time of use.",
        versions=(
            PresetVersion(
                effective_from=datetime(2020, 1, 1, tzinfo=UTC),
                document="",
                document_date="",
                spec=TariffSpec(
                    time_zone=DEFAULT_TIME_ZONE,
                    multipliers={"flat": Decimal("1")},
                    windows=(_w("flat", "00:00", "24:00"),),
                ),
            ),
        ),
    ),
}

# Hub provinces without a preset: no source was found giving both their windows and fixed ratios (or the
# ratios vary by month, which a tariff version cannot express: one multiplier per band), so none is
# invented. What was searched (the stored public web pages and public repositories, by document number,
# title and figures, in Chinese) and what was found are recorded, so the next person starts from it.
# "Quoted" = State Grid's announcement note quoting the notice, read as reproduced in a public repository.
PROVINCES_WITHOUT_PRESET: dict[str, str] = {
    "Tianjin": (
        "津发改价综〔2021〕395号 quoted: peak 9–12, 16–21; valley 23–7; flat otherwise; peak + 50 %, valley "
        "− 54 %. Its critical peak (the quote only says September has none) was not found."
    ),
    "Shanghai": (
        "沪发改价管〔2022〕50号 quoted: two-part users Jul–Sep peak 8–15, 18–21 (critical 12–14 in Jul–Aug), "
        "other months peak 8–11, 18–21 (critical 19–21 in Jan, Dec), valley 22–6; ratios differ by month "
        "(+ 80 % / − 60 % in Jul–Sep, Jan, Dec; + 60 % / − 50 % otherwise), which one version cannot hold. "
        "沪发改价管〔2024〕28号 quoted: large-industry deep valley 0–6 and 22–24 at flat − 80 % on public "
        "holidays and on Feb–Jun, Sep–Nov rest days."
    ),
    "Zhejiang": (
        "浙发改价格〔2024〕21号 read in a reprint of its text: large-industry users from 2024-03-01; deep "
        "valley 10–14 on the Spring Festival, Labour Day and National Day holidays; its windows (table 1) "
        "and ratios (table 2) were not in the reprint. Windows quoted; ratios not found."
    ),
    "Anhui": (
        "皖发改价格〔2025〕302号 quoted (from 2025-07-01): windows by season; peak + 84.3 % in Jan, Jul–Sep, "
        "Dec and + 74 % otherwise, valley − 61.8 %: ratios that differ by month; deep valley 11–15 on "
        "holidays of three days or more for large industrial users."
    ),
    "Chongqing": (
        "渝发改规范〔2021〕14号 quoted: peak 11–17, 20–22 (critical 12–14 in Jul, Aug, Dec, Jan), flat 8–11, "
        "17–20, 22–24, valley 0–8; its ratios were not found."
    ),
    "Inner Mongolia": (
        "内发改价费字〔2023〕1630号 (Mengxi grid, the nmg hub) quoted: windows for the windy season (Jan–May, "
        "Sep–Dec, 1.68 : 1 : 0.48) and the calm season (Jun–Aug, 1.54 : 1 : 0.44): ratios that differ by "
        "month; critical peak 19–21 and deep valley 13–15 in Jun–Aug."
    ),
    "Gansu": (
        "甘发改价格〔2024〕424号 quoted: peak 6–8, 18–23; flat 23–6, 8–10, 16–18; valley 10–16; the ratios "
        "are formed by the market (2025 trading scheme), so there are no fixed ratios to model."
    ),
}


def preset_default_code(*, hub: str) -> str:
    """The preset to offer by default for a cluster in ``hub``: its province's preset when that is
    official for industrial and commercial users with every figure confirmed, otherwise ``flat``. An
    unconfirmed preset (or one for another customer class) stays available, never the default."""
    for preset in PRESETS.values():
        if hub in preset.hubs and preset.selectable_by_default:
            return preset.code
    return "flat"
